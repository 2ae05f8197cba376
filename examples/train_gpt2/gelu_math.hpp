#pragma once
// exp and tanh for GELU in plain arithmetic the compiler vectorises (a libm call per element kept GELU's loops scalar:
// tanhf and its expm1f were 9% of a 12x768 CPU step). The CPU loops (gpt2_model.hpp) and the device functors
// (device_kernels.hpp) call the same functions, so the two still give the same bits on the CPU.
// Accuracy (tested): exp within 1 ulp over its range; tanh within 2e-7 of libm's (absolute: tanh(u) =
// 1 - 2 / (exp(2u) + 1) loses relative accuracy near 0, where GELU uses it only as 1 + tanh, so GELU keeps float's
// precision).
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GPT2_HOST_DEVICE __host__ __device__
#else
#define GPT2_HOST_DEVICE
#endif

namespace gpt2::gelu_math {

/// The float whose bits are `bits` (std::bit_cast is not usable in device code).
GPT2_HOST_DEVICE inline float float_from_bits(std::int32_t bits) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

/// e^x for x clamped to [-87, 88] (normal results only): x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor series
/// to degree 7 (truncation below 6e-9 relative), times 2^n built in the exponent bits. n is rounded by adding and
/// subtracting 1.5 * 2^23 (exact in round-to-nearest for |x / ln2| < 2^22, and vectorisable where nearbyint is not).
GPT2_HOST_DEVICE inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  constexpr float log2e = 1.44269504088896341f, round_shift = 12582912.0f;
  // ln2 in two parts, the first of 16 bits, so n * ln2_high is exact for |n| < 2^8
  constexpr float ln2_high = 0.693145751953125f, ln2_low = 1.42860682030941723e-06f;
  const float n = (x * log2e + round_shift) - round_shift;
  const float r = (x - n * ln2_high) - n * ln2_low;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * float_from_bits((static_cast<std::int32_t>(n) + 127) << 23);
}

/// tanh(u) = 1 - 2 / (e^(2u) + 1): exactly +-1 where e^(2u) saturates, never NaN.
GPT2_HOST_DEVICE inline float tanh_approx(float u) { return 1.0f - 2.0f / (exp_approx(2.0f * u) + 1.0f); }

}  // namespace gpt2::gelu_math
