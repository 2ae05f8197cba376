// train_gpt2 --backend cuda: the GPT-2 passes on the GPU (device_model.hpp), compiled by nvcc with Thrust's CUDA
// device system and cuBLAS for the matrix products.
#include "device_model_impl.hpp"
