#pragma once
// Element types of chunk memory and the host conversions between them. fp32 -> bf16/fp16 rounds to nearest even,
// the rounding CUDA's __float2bfloat16_rn / __float2half_rn and AVX-512 vcvtneps2bf16 use, so host and device
// write-backs agree bit for bit.
#include <chunkwise/core/error.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace chunkwise {

enum class dtype : std::uint8_t { fp32, fp16, bf16, fp64, int32, int64, uint8 };

constexpr std::size_t size_of(dtype type) noexcept {
  switch (type) {
    case dtype::fp32: return 4;
    case dtype::fp16: return 2;
    case dtype::bf16: return 2;
    case dtype::fp64: return 8;
    case dtype::int32: return 4;
    case dtype::int64: return 8;
    case dtype::uint8: return 1;
  }
  return 0;
}

constexpr std::string_view to_string(dtype type) noexcept {
  switch (type) {
    case dtype::fp32: return "fp32";
    case dtype::fp16: return "fp16";
    case dtype::bf16: return "bf16";
    case dtype::fp64: return "fp64";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
    case dtype::uint8: return "uint8";
  }
  return "?";
}

/// Accepts our names and PyTorch's ("float32", "bfloat16", "half", ...). Returns false when the name is unknown.
constexpr bool parse_dtype(std::string_view name, dtype& out) noexcept {
  struct entry { std::string_view name; dtype type; };
  constexpr entry names[] = {{"fp32", dtype::fp32},    {"float32", dtype::fp32},  {"float", dtype::fp32},
                             {"fp16", dtype::fp16},    {"float16", dtype::fp16},  {"half", dtype::fp16},
                             {"bf16", dtype::bf16},    {"bfloat16", dtype::bf16}, {"fp64", dtype::fp64},
                             {"float64", dtype::fp64}, {"double", dtype::fp64},   {"int32", dtype::int32},
                             {"int64", dtype::int64},  {"uint8", dtype::uint8}};
  for (const auto& e : names)
    if (e.name == name) {
      out = e.type;
      return true;
    }
  return false;
}

/// 16-bit storage types: distinct so that overloads and templates cannot mix them up.
struct bf16 { std::uint16_t bits; };
struct fp16 { std::uint16_t bits; };

/// fp32 -> bf16, round to nearest, ties to even; NaN stays a (quiet) NaN, infinities stay infinite.
constexpr bf16 to_bf16(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((bits >> 16) | 0x0040u)};
  const std::uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>((bits + rounding_bias) >> 16)};
}

constexpr float to_float(bf16 value) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value.bits) << 16);
}

/// fp32 -> IEEE binary16, round to nearest, ties to even; overflow to infinity, gradual underflow to subnormals.
constexpr fp16 to_fp16(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u)  // NaN: keep a quiet NaN with the top mantissa bits
    return fp16{static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu))};
  if (magnitude >= 0x477ff000u)  // >= 65520 rounds to infinity (65504 is the largest finite half)
    return fp16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (magnitude < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    if (magnitude < 0x33000000u) return fp16{sign};  // below half of the smallest subnormal 2^-25: rounds to zero
    const std::uint32_t exponent = magnitude >> 23;
    const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // value = mantissa * 2^(exponent-150); half ulp = 2^-24
    const std::uint32_t kept = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    const std::uint32_t rounded = kept + ((rest > halfway || (rest == halfway && (kept & 1u))) ? 1u : 0u);
    return fp16{static_cast<std::uint16_t>(sign | rounded)};
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const std::uint32_t rebased = magnitude - 0x38000000u;
  const std::uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return fp16{static_cast<std::uint16_t>(sign | (rounded >> 13))};
}

constexpr float to_float(fp16 value) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);
  // Subnormal half: normalise into a float.
  std::uint32_t m = mantissa;
  std::uint32_t e = 113u;
  while ((m & 0x400u) == 0) {
    m <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((m & 0x3ffu) << 13));
}

/// fp32 -> T for the compute element types (float, bf16, fp16), rounding to nearest even.
template <class T>
constexpr T from_float(float value) noexcept {
  if constexpr (std::is_same_v<T, bf16>) return to_bf16(value);
  else if constexpr (std::is_same_v<T, fp16>) return to_fp16(value);
  else return value;
}
constexpr float to_float(float value) noexcept { return value; }

/// Calls f(T{}) with T the C++ type of a compute element type (fp32 -> float, bf16, fp16): one switch where a run-time
/// type meets templated code. Other types are refused with `what` in the message.
template <class F>
decltype(auto) visit_element(dtype type, std::string_view what, F&& f) {
  switch (type) {
    case dtype::fp32: return f(float{});
    case dtype::bf16: return f(bf16{});
    case dtype::fp16: return f(fp16{});
    default: break;
  }
  detail::raise(error_code::unsupported, std::string(what) + ": " + std::string(to_string(type)) +
                                             " is not a training element type (fp32, bf16 or fp16)");
}

}  // namespace chunkwise
