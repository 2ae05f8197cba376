// The GPT-2 device passes on the GPU (CUDA: Thrust's CUDA system and cuBLAS) against the CPU loops: the cases of
// tests/gpt2_device_cases.hpp, which CI runs on Thrust's OpenMP system (tests/gpt2_device_test.cpp).
#include "gpu_test_main.hpp"

#include "device_model_impl.hpp"
// fp32 throughout (cuBLAS without TF32); the GPU's exp, tanh, fused multiply-adds and cuBLAS's summation order.
#define GPT2_DEVICE_TOLERANCE 1e-4
#include "../gpt2_device_cases.hpp"
