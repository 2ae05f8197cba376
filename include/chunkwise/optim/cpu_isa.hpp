#pragma once
// The instruction sets the CPU optimizer kernels come in, chosen at run time from the CPU's features, so a binary
// built with plain flags still runs AVX-512 where the CPU has it.
#include <chunkwise/core/error.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define CHUNKWISE_OPTIM_X86 1
#else
#define CHUNKWISE_OPTIM_X86 0
#endif

namespace chunkwise::optim {

/// `best` resolves to the widest path this CPU supports.
///  - avx512: AVX-512 F/BW/VL/DQ (16 floats a vector, masked tails).
///  - avx2:   AVX2 + FMA + F16C (8 floats a vector, scalar tails).
///  - scalar: portable C++ (std::fma, std::sqrt).
/// All three compute bit-identical results (same roundings in the same order).
enum class cpu_isa : std::uint8_t { scalar, avx2, avx512, best };

constexpr std::string_view to_string(cpu_isa isa) noexcept {
  switch (isa) {
    case cpu_isa::scalar: return "scalar";
    case cpu_isa::avx2: return "avx2";
    case cpu_isa::avx512: return "avx512";
    case cpu_isa::best: return "best";
  }
  return "?";
}

inline bool cpu_supports(cpu_isa isa) noexcept {
  switch (isa) {
    case cpu_isa::scalar:
    case cpu_isa::best: return true;
#if CHUNKWISE_OPTIM_X86
    case cpu_isa::avx2:
      // clang 14 does not know "f16c" here; every CPU with AVX2 and FMA has had F16C.
#if defined(__clang__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
    case cpu_isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    case cpu_isa::avx2:
    case cpu_isa::avx512: return false;
#endif
  }
  return false;
}

inline cpu_isa best_cpu_isa() noexcept {
  if (cpu_supports(cpu_isa::avx512)) return cpu_isa::avx512;
  if (cpu_supports(cpu_isa::avx2)) return cpu_isa::avx2;
  return cpu_isa::scalar;
}

/// `best` becomes the widest supported path; asking for a path the CPU lacks is an error, not a silent fallback.
inline cpu_isa resolve(cpu_isa asked) {
  if (asked == cpu_isa::best) return best_cpu_isa();
  if (!cpu_supports(asked))
    throw error(error_code::unsupported, "optimizer: this CPU does not support the " + std::string(to_string(asked)) +
                                             " kernel; the widest it supports is " +
                                             std::string(to_string(best_cpu_isa())));
  return asked;
}

}  // namespace chunkwise::optim
