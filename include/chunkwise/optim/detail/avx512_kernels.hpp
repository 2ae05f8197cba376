#pragma once
// AVX-512 paths (F/BW/VL/DQ): 16 elements a vector, tails by masked loads and stores. Compiled through
// function target attributes, so the translation unit needs no -mavx512f; called only after cpu_supports().
// The bf16 write-back rounds with integer operations rather than vcvtneps2bf16, which flushes subnormal inputs
// to zero: this keeps the result equal to to_bf16() for every input.
#include <chunkwise/optim/cpu_isa.hpp>
#include <chunkwise/optim/detail/scalar_kernels.hpp>

#if CHUNKWISE_OPTIM_X86
#include <immintrin.h>

#define CHUNKWISE_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define CHUNKWISE_AVX512_INLINE CHUNKWISE_AVX512_TARGET inline __attribute__((always_inline))

// GCC 12's AVX-512 intrinsics start from `__m512 __Y = __Y` (_mm512_undefined_ps) and warn -Wmaybe-uninitialized
// once inlined (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace chunkwise::optim::detail::avx512 {

CHUNKWISE_AVX512_INLINE __m512 load(const float* p, std::size_t i, __mmask16 k) noexcept {
  return _mm512_maskz_loadu_ps(k, p + i);
}
CHUNKWISE_AVX512_INLINE __m512 load(const bf16* p, std::size_t i, __mmask16 k) noexcept {
  const __m256i half = _mm256_maskz_loadu_epi16(k, p + i);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_maskz_cvtepu16_epi32(k, half), 16));
}
CHUNKWISE_AVX512_INLINE __m512 load(const fp16* p, std::size_t i, __mmask16 k) noexcept {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p + i));
}
CHUNKWISE_AVX512_INLINE void store(float* p, std::size_t i, __m512 x, __mmask16 k) noexcept {
  _mm512_mask_storeu_ps(p + i, k, x);
}
CHUNKWISE_AVX512_INLINE void store(bf16* p, std::size_t i, __m512 x, __mmask16 k) noexcept {
  // to_bf16: (bits + 0x7fff + lsb) >> 16; NaN keeps its top bits with the quiet bit set.
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(high, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  _mm256_mask_storeu_epi16(p + i, k, _mm512_cvtepi32_epi16(rounded));
}
CHUNKWISE_AVX512_INLINE void store(fp16* p, std::size_t i, __m512 x, __mmask16 k) noexcept {
  _mm256_mask_storeu_epi16(p + i, k, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
CHUNKWISE_AVX512_INLINE void store(no_copy*, std::size_t, __m512, __mmask16) noexcept {}

template <class T>
CHUNKWISE_AVX512_INLINE void prefetch(const T* p, std::size_t i) noexcept {
  _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}
CHUNKWISE_AVX512_INLINE void prefetch(const no_copy*, std::size_t) noexcept {}

CHUNKWISE_AVX512_INLINE __mmask16 tail_mask(std::size_t remaining) noexcept {
  return static_cast<__mmask16>((1u << remaining) - 1u);
}

// The loop bodies are functions, not lambdas: a lambda does not inherit its enclosing function's target.
struct adam_vectors {
  __m512 beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size, inv_sqrt_bias2, decay, l2, grad_scale;
};

template <class Grad, class Working>
CHUNKWISE_AVX512_INLINE void adam_body(const adam_vectors& c, float* master, const Grad* grad, float* m1, float* m2,
                                       Working* working, std::size_t i, __mmask16 k) noexcept {
  const __m512 p = load(master, i, k);
  const __m512 g = _mm512_fmadd_ps(c.l2, p, _mm512_mul_ps(load(grad, i, k), c.grad_scale));
  const __m512 m = _mm512_fmadd_ps(c.beta1, load(m1, i, k), _mm512_mul_ps(c.one_minus_beta1, g));
  const __m512 v = _mm512_fmadd_ps(c.beta2, load(m2, i, k), _mm512_mul_ps(_mm512_mul_ps(c.one_minus_beta2, g), g));
  const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), c.inv_sqrt_bias2, c.eps);
  const __m512 updated = _mm512_fmadd_ps(c.neg_step_size, _mm512_div_ps(m, denom), _mm512_mul_ps(p, c.decay));
  store(m1, i, m, k);
  store(m2, i, v, k);
  store(master, i, updated, k);
  store(working, i, updated, k);
}

template <class Grad, class Working>
CHUNKWISE_AVX512_TARGET void adam(const adam_coefficients& c, float* master, const Grad* grad, float* m1, float* m2,
                                  Working* working, std::size_t begin, std::size_t end) noexcept {
  const adam_vectors v{_mm512_set1_ps(c.beta1), _mm512_set1_ps(c.one_minus_beta1), _mm512_set1_ps(c.beta2),
                       _mm512_set1_ps(c.one_minus_beta2), _mm512_set1_ps(c.eps), _mm512_set1_ps(c.neg_step_size),
                       _mm512_set1_ps(c.inv_sqrt_bias2), _mm512_set1_ps(c.decay), _mm512_set1_ps(c.l2),
                       _mm512_set1_ps(c.grad_scale)};
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    if (i + prefetch_distance < end) {
      prefetch(grad, i + prefetch_distance);
      prefetch(master, i + prefetch_distance);
      prefetch(m1, i + prefetch_distance);
      prefetch(m2, i + prefetch_distance);
    }
    adam_body(v, master, grad, m1, m2, working, i, static_cast<__mmask16>(0xffff));
  }
  if (i < end) adam_body(v, master, grad, m1, m2, working, i, tail_mask(end - i));
}

struct sgd_vectors {
  __m512 neg_lr, momentum, one_minus_dampening, weight_decay, grad_scale;
  bool first, nesterov, has_momentum;
};

template <class Grad, class Working>
CHUNKWISE_AVX512_INLINE void sgd_body(const sgd_vectors& c, float* master, const Grad* grad, float* buffer,
                                      Working* working, std::size_t i, __mmask16 k) noexcept {
  const __m512 p = load(master, i, k);
  const __m512 g = _mm512_fmadd_ps(c.weight_decay, p, _mm512_mul_ps(load(grad, i, k), c.grad_scale));
  __m512 u = g;
  if (c.has_momentum) {
    const __m512 b =
        c.first ? g : _mm512_fmadd_ps(c.momentum, load(buffer, i, k), _mm512_mul_ps(c.one_minus_dampening, g));
    store(buffer, i, b, k);
    u = c.nesterov ? _mm512_fmadd_ps(c.momentum, b, g) : b;
  }
  const __m512 updated = _mm512_fmadd_ps(c.neg_lr, u, p);
  store(master, i, updated, k);
  store(working, i, updated, k);
}

template <class Grad, class Working>
CHUNKWISE_AVX512_TARGET void sgd(const sgd_coefficients& c, float* master, const Grad* grad, float* buffer,
                                 Working* working, std::size_t begin, std::size_t end) noexcept {
  const sgd_vectors v{_mm512_set1_ps(c.neg_lr),       _mm512_set1_ps(c.momentum),
                      _mm512_set1_ps(c.one_minus_dampening), _mm512_set1_ps(c.weight_decay),
                      _mm512_set1_ps(c.grad_scale),   c.first,
                      c.nesterov,                     c.has_momentum};
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    if (i + prefetch_distance < end) {
      prefetch(grad, i + prefetch_distance);
      prefetch(master, i + prefetch_distance);
      if (c.has_momentum && !c.first) prefetch(buffer, i + prefetch_distance);
    }
    sgd_body(v, master, grad, buffer, working, i, static_cast<__mmask16>(0xffff));
  }
  if (i < end) sgd_body(v, master, grad, buffer, working, i, tail_mask(end - i));
}

template <class Grad>
CHUNKWISE_AVX512_INLINE void squares_body(const Grad* grad, std::size_t i, __mmask16 k, __m512d& low,
                                          __m512d& high) noexcept {
  const __m512 x = load(grad, i, k);
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  low = _mm512_fmadd_pd(lo, lo, low);
  high = _mm512_fmadd_pd(hi, hi, high);
}

/// Lanes 0-7 accumulate in `low`, 8-15 in `high`: the canonical 16-lane order of scalar_kernels.hpp.
template <class Grad>
CHUNKWISE_AVX512_TARGET double sum_of_squares(const Grad* grad, std::size_t begin, std::size_t end) noexcept {
  __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    if (i + prefetch_distance < end) prefetch(grad, i + prefetch_distance);
    squares_body(grad, i, static_cast<__mmask16>(0xffff), low, high);
  }
  if (i < end) squares_body(grad, i, tail_mask(end - i), low, high);
  alignas(64) double lanes[sum_lanes];
  _mm512_store_pd(lanes, low);
  _mm512_store_pd(lanes + 8, high);
  return fold_lanes(lanes);
}

template <class T>
CHUNKWISE_AVX512_TARGET void widen(const T* in, float* out, std::size_t begin, std::size_t end) noexcept {
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) store(out, i, load(in, i, static_cast<__mmask16>(0xffff)), static_cast<__mmask16>(0xffff));
  if (i < end) store(out, i, load(in, i, tail_mask(end - i)), tail_mask(end - i));
}
template <class T>
CHUNKWISE_AVX512_INLINE void accumulate_scaled_body(T* acc, const float* g, __m512 scale, std::size_t i,
                                                    __mmask16 k) noexcept {
  store(acc, i, _mm512_fmadd_ps(scale, load(g, i, k), load(acc, i, k)), k);
}
template <class T>
CHUNKWISE_AVX512_TARGET void accumulate_scaled(T* acc, const float* g, float scale, std::size_t begin,
                                               std::size_t end) noexcept {
  const __m512 s = _mm512_set1_ps(scale);
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) accumulate_scaled_body(acc, g, s, i, static_cast<__mmask16>(0xffff));
  if (i < end) accumulate_scaled_body(acc, g, s, i, tail_mask(end - i));
}

}  // namespace chunkwise::optim::detail::avx512

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // CHUNKWISE_OPTIM_X86
