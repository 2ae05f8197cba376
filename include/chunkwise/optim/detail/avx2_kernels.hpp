#pragma once
// AVX2 + FMA + F16C paths: 8 elements a vector, tails through the scalar element functions (same roundings, so
// the results are bit-identical). Compiled through function target attributes; called only after cpu_supports().
#include <chunkwise/optim/cpu_isa.hpp>
#include <chunkwise/optim/detail/scalar_kernels.hpp>

#if CHUNKWISE_OPTIM_X86
#include <immintrin.h>

#define CHUNKWISE_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define CHUNKWISE_AVX2_INLINE CHUNKWISE_AVX2_TARGET inline __attribute__((always_inline))

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace chunkwise::optim::detail::avx2 {

CHUNKWISE_AVX2_INLINE __m256 load(const float* p, std::size_t i) noexcept { return _mm256_loadu_ps(p + i); }
CHUNKWISE_AVX2_INLINE __m256 load(const bf16* p, std::size_t i) noexcept {
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}
CHUNKWISE_AVX2_INLINE __m256 load(const fp16* p, std::size_t i) noexcept {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
}
CHUNKWISE_AVX2_INLINE void store(float* p, std::size_t i, __m256 x) noexcept { _mm256_storeu_ps(p + i, x); }
CHUNKWISE_AVX2_INLINE void store(bf16* p, std::size_t i, __m256 x) noexcept {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(bits, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256i result = _mm256_blendv_epi8(rounded, quiet, nan);
  // 8 x 32-bit (all < 2^16) -> 8 x 16-bit: pack within 128-bit lanes, then gather the two low quadwords.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i), _mm256_castsi256_si128(packed));
}
CHUNKWISE_AVX2_INLINE void store(fp16* p, std::size_t i, __m256 x) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
CHUNKWISE_AVX2_INLINE void store(no_copy*, std::size_t, __m256) noexcept {}

template <class T>
CHUNKWISE_AVX2_INLINE void prefetch(const T* p, std::size_t i) noexcept {
  _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

struct adam_vectors {
  __m256 beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size, inv_sqrt_bias2, decay, l2, grad_scale;
};

template <class Grad, class Working>
CHUNKWISE_AVX2_INLINE void adam_body(const adam_vectors& c, float* master, const Grad* grad, float* m1, float* m2,
                                     Working* working, std::size_t i) noexcept {
  const __m256 p = load(master, i);
  const __m256 g = _mm256_fmadd_ps(c.l2, p, _mm256_mul_ps(load(grad, i), c.grad_scale));
  const __m256 m = _mm256_fmadd_ps(c.beta1, load(m1, i), _mm256_mul_ps(c.one_minus_beta1, g));
  const __m256 v = _mm256_fmadd_ps(c.beta2, load(m2, i), _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, g), g));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), c.inv_sqrt_bias2, c.eps);
  const __m256 updated = _mm256_fmadd_ps(c.neg_step_size, _mm256_div_ps(m, denom), _mm256_mul_ps(p, c.decay));
  store(m1, i, m);
  store(m2, i, v);
  store(master, i, updated);
  store(working, i, updated);
}

template <class Grad, class Working>
CHUNKWISE_AVX2_TARGET void adam(const adam_coefficients& c, float* master, const Grad* grad, float* m1, float* m2,
                                Working* working, std::size_t begin, std::size_t end) noexcept {
  const adam_vectors v{_mm256_set1_ps(c.beta1), _mm256_set1_ps(c.one_minus_beta1), _mm256_set1_ps(c.beta2),
                       _mm256_set1_ps(c.one_minus_beta2), _mm256_set1_ps(c.eps), _mm256_set1_ps(c.neg_step_size),
                       _mm256_set1_ps(c.inv_sqrt_bias2), _mm256_set1_ps(c.decay), _mm256_set1_ps(c.l2),
                       _mm256_set1_ps(c.grad_scale)};
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    if (i + prefetch_distance < end) {
      prefetch(grad, i + prefetch_distance);
      prefetch(master, i + prefetch_distance);
      prefetch(m1, i + prefetch_distance);
      prefetch(m2, i + prefetch_distance);
    }
    adam_body(v, master, grad, m1, m2, working, i);
  }
  for (; i < end; ++i) adam_element(c, master, grad, m1, m2, working, i);
}

struct sgd_vectors {
  __m256 neg_lr, momentum, one_minus_dampening, weight_decay, grad_scale;
  bool first, nesterov, has_momentum;
};

template <class Grad, class Working>
CHUNKWISE_AVX2_INLINE void sgd_body(const sgd_vectors& c, float* master, const Grad* grad, float* buffer,
                                    Working* working, std::size_t i) noexcept {
  const __m256 p = load(master, i);
  const __m256 g = _mm256_fmadd_ps(c.weight_decay, p, _mm256_mul_ps(load(grad, i), c.grad_scale));
  __m256 u = g;
  if (c.has_momentum) {
    const __m256 b =
        c.first ? g : _mm256_fmadd_ps(c.momentum, load(buffer, i), _mm256_mul_ps(c.one_minus_dampening, g));
    store(buffer, i, b);
    u = c.nesterov ? _mm256_fmadd_ps(c.momentum, b, g) : b;
  }
  const __m256 updated = _mm256_fmadd_ps(c.neg_lr, u, p);
  store(master, i, updated);
  store(working, i, updated);
}

template <class Grad, class Working>
CHUNKWISE_AVX2_TARGET void sgd(const sgd_coefficients& c, float* master, const Grad* grad, float* buffer,
                               Working* working, std::size_t begin, std::size_t end) noexcept {
  const sgd_vectors v{_mm256_set1_ps(c.neg_lr),       _mm256_set1_ps(c.momentum),
                      _mm256_set1_ps(c.one_minus_dampening), _mm256_set1_ps(c.weight_decay),
                      _mm256_set1_ps(c.grad_scale),   c.first,
                      c.nesterov,                     c.has_momentum};
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    if (i + prefetch_distance < end) {
      prefetch(grad, i + prefetch_distance);
      prefetch(master, i + prefetch_distance);
      if (c.has_momentum && !c.first) prefetch(buffer, i + prefetch_distance);
    }
    sgd_body(v, master, grad, buffer, working, i);
  }
  for (; i < end; ++i) sgd_element(c, master, grad, buffer, working, i);
}

/// Lanes 0-3, 4-7, 8-11, 12-15 of the canonical 16-lane order in four double vectors; the tail (< 16 elements)
/// goes lane by lane through the scalar accumulation.
template <class Grad>
CHUNKWISE_AVX2_TARGET double sum_of_squares(const Grad* grad, std::size_t begin, std::size_t end) noexcept {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd(), a2 = _mm256_setzero_pd(), a3 = _mm256_setzero_pd();
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    if (i + prefetch_distance < end) prefetch(grad, i + prefetch_distance);
    const __m256 x0 = load(grad, i), x1 = load(grad, i + 8);
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x0)), d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1));
    const __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(x1)), d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1));
    a0 = _mm256_fmadd_pd(d0, d0, a0);
    a1 = _mm256_fmadd_pd(d1, d1, a1);
    a2 = _mm256_fmadd_pd(d2, d2, a2);
    a3 = _mm256_fmadd_pd(d3, d3, a3);
  }
  alignas(32) double lanes[sum_lanes];
  _mm256_store_pd(lanes, a0);
  _mm256_store_pd(lanes + 4, a1);
  _mm256_store_pd(lanes + 8, a2);
  _mm256_store_pd(lanes + 12, a3);
  accumulate_squares(grad, i, end, begin, lanes);
  return fold_lanes(lanes);
}

template <class T>
CHUNKWISE_AVX2_TARGET void widen(const T* in, float* out, std::size_t begin, std::size_t end) noexcept {
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) store(out, i, load(in, i));
  widen_scalar(in, out, i, end);
}
template <class T>
CHUNKWISE_AVX2_TARGET void accumulate_scaled(T* acc, const float* g, float scale, std::size_t begin,
                                             std::size_t end) noexcept {
  const __m256 s = _mm256_set1_ps(scale);
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) store(acc, i, _mm256_fmadd_ps(s, load(g, i), load(acc, i)));
  accumulate_scaled_scalar(acc, g, scale, i, end);
}

}  // namespace chunkwise::optim::detail::avx2

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // CHUNKWISE_OPTIM_X86
