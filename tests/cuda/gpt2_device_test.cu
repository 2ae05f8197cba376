// The GPT-2 device passes on the GPU (CUDA: Thrust's CUDA system and cuBLAS) against the CPU loops: the cases of
// tests/gpt2_device_cases.hpp, which CI runs on Thrust's OpenMP system (tests/gpt2_device_test.cpp).
#include "gpu_test_main.hpp"

#include "device_model_impl.hpp"
// fp32 throughout (cuBLAS without TF32); the GPU's exp, tanh, fused multiply-adds and cuBLAS's summation order.
#define GPT2_DEVICE_TOLERANCE 1e-4
#include "../gpt2_device_cases.hpp"

#include <thrust/device_vector.h>
#include <thrust/host_vector.h>

#include <cstdint>
#include <vector>

namespace {
// Every 16-bit pattern widened on the GPU, and fp32 values (normal, subnormal in fp16, past fp16's range, negative
// zero) accumulated into 16-bit values there, against the same functors on the host (chunkwise's conversions).
template <class Format>
void check_16bit_conversions() {
  using namespace gpt2::device_kernels;
  const std::size_t n = 65536;
  std::vector<std::uint16_t> patterns(n);
  std::vector<float> gradients(n);
  for (std::size_t i = 0; i < n; ++i) {
    patterns[i] = static_cast<std::uint16_t>(i);
    gradients[i] = (i % 7 == 0 ? 7e4f : i % 5 == 0 ? 3e-7f : i % 3 == 0 ? -0.0f : 1.0f) * static_cast<float>(i % 97);
  }
  thrust::device_vector<std::uint16_t> d_patterns(patterns.begin(), patterns.end());
  thrust::device_vector<float> d_widened(n), d_gradients(gradients.begin(), gradients.end());
  for_each_index(n, widen_16<Format>{thrust::raw_pointer_cast(d_widened.data()),
                                     thrust::raw_pointer_cast(d_patterns.data())});
  for_each_index(n, accumulate_16<Format>{thrust::raw_pointer_cast(d_patterns.data()),
                                          thrust::raw_pointer_cast(d_gradients.data()), 0.5f});
  const thrust::host_vector<float> widened = d_widened;
  const thrust::host_vector<std::uint16_t> accumulated = d_patterns;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float expected = Format::widen(patterns[i]);
    const bool nan = expected != expected;
    if (nan ? widened[i] == widened[i] : widened[i] != expected) ++differing;
    const std::uint16_t sum = Format::narrow(fmaf(0.5f, gradients[i], expected));
    const bool sum_nan = Format::widen(sum) != Format::widen(sum);  // NaN payloads may differ (CUDA's is canonical)
    if (sum_nan ? Format::widen(accumulated[i]) == Format::widen(accumulated[i]) : accumulated[i] != sum) ++differing;
  }
  CHECK(differing == 0);
}
}  // namespace

TEST_CASE("16-bit chunks widen and accumulate on the GPU to the host's bits (bf16 and fp16)") {
  check_16bit_conversions<gpt2::device_kernels::bf16_format>();
  check_16bit_conversions<gpt2::device_kernels::fp16_format>();
}
