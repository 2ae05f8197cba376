#pragma once
// Conversions between 16-bit chunk memory and fp32 buffers on the optimizer kernels' SIMD paths (AVX-512, AVX2,
// scalar; chosen at run time, bit-identical): what a CPU trainer that computes in fp32 pays on bf16/fp16 chunks
// each pass (runtime/fp32_compute.hpp). Rounding to bf16 is the integer round-to-nearest-even of to_bf16, not
// AVX-512 BF16's vcvtneps2bf16, which flushes subnormal inputs to zero and would part from to_bf16 and CUDA's
// __float2bfloat16_rn on them.
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/optim/cpu_isa.hpp>
#include <chunkwise/optim/detail/avx2_kernels.hpp>
#include <chunkwise/optim/detail/avx512_kernels.hpp>
#include <chunkwise/optim/detail/scalar_kernels.hpp>

#include <span>
#include <string>

namespace chunkwise::optim {

namespace detail {
inline cpu_isa conversion_isa(cpu_isa asked) {
  static const cpu_isa best = best_cpu_isa();
  return asked == cpu_isa::best ? best : resolve(asked);
}
inline void check_sizes(std::size_t a, std::size_t b, const char* what) {
  if (a != b)
    chunkwise::detail::raise(error_code::invalid_argument, std::string("optim::") + what + ": spans of " + std::to_string(a) + " and " +
                                            std::to_string(b) + " elements; they must match");
}
}  // namespace detail

/// out[i] = in[i] as fp32.
template <class T>
void widen(std::span<const T> in, std::span<float> out, cpu_isa isa = cpu_isa::best) {
  detail::check_sizes(in.size(), out.size(), "widen");
  switch (detail::conversion_isa(isa)) {
#if CHUNKWISE_OPTIM_X86
    case cpu_isa::avx512: return detail::avx512::widen(in.data(), out.data(), 0, in.size());
    case cpu_isa::avx2: return detail::avx2::widen(in.data(), out.data(), 0, in.size());
#endif
    default: return detail::widen_scalar(in.data(), out.data(), 0, in.size());
  }
}

/// acc[i] = round(acc[i] + scale * g[i]): one fused multiply-add in fp32, rounded to T to nearest even.
template <class T>
void accumulate_scaled(std::span<T> acc, std::span<const float> g, float scale, cpu_isa isa = cpu_isa::best) {
  detail::check_sizes(acc.size(), g.size(), "accumulate_scaled");
  switch (detail::conversion_isa(isa)) {
#if CHUNKWISE_OPTIM_X86
    case cpu_isa::avx512: return detail::avx512::accumulate_scaled(acc.data(), g.data(), scale, 0, acc.size());
    case cpu_isa::avx2: return detail::avx2::accumulate_scaled(acc.data(), g.data(), scale, 0, acc.size());
#endif
    default: return detail::accumulate_scaled_scalar(acc.data(), g.data(), scale, 0, acc.size());
  }
}

}  // namespace chunkwise::optim
