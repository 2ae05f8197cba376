#pragma once
// The portable element updates: the definition every SIMD path reproduces bit for bit. Each product feeds an
// explicit std::fma or stands alone, so floating-point contraction by the compiler cannot change a result, and
// std::sqrt and division are correctly rounded in every path.
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/optim/hyperparameters.hpp>

#include <cmath>
#include <cstddef>

namespace chunkwise::optim::detail {

/// The "no working copy" type: stores to it do nothing.
struct no_copy {};

/// How far ahead (in elements) the SIMD loops prefetch their input streams: 2 KiB of fp32. The hardware prefetcher
/// alone keeps too few lines in flight for the 4 read streams of Adam; measured here (one thread, thread CPU time,
/// 64 Mi parameters) software prefetch at 256-1024 elements ahead gained 8-15% over none.
constexpr std::size_t prefetch_distance = 512;

inline float load_element(const float* p, std::size_t i) noexcept { return p[i]; }
inline float load_element(const bf16* p, std::size_t i) noexcept { return to_float(p[i]); }
inline float load_element(const fp16* p, std::size_t i) noexcept { return to_float(p[i]); }
inline void store_element(bf16* p, std::size_t i, float x) noexcept { p[i] = to_bf16(x); }
inline void store_element(fp16* p, std::size_t i, float x) noexcept { p[i] = to_fp16(x); }
inline void store_element(no_copy*, std::size_t, float) noexcept {}

template <class Grad, class Working>
inline void adam_element(const adam_coefficients& c, float* master, const Grad* grad, float* m1, float* m2,
                         Working* working, std::size_t i) noexcept {
  const float p = master[i];
  const float g = std::fma(c.l2, p, load_element(grad, i) * c.grad_scale);
  const float m = std::fma(c.beta1, m1[i], c.one_minus_beta1 * g);
  const float v = std::fma(c.beta2, m2[i], (c.one_minus_beta2 * g) * g);
  const float denom = std::fma(std::sqrt(v), c.inv_sqrt_bias2, c.eps);
  const float updated = std::fma(c.neg_step_size, m / denom, p * c.decay);
  m1[i] = m;
  m2[i] = v;
  master[i] = updated;
  store_element(working, i, updated);
}

template <class Grad, class Working>
inline void sgd_element(const sgd_coefficients& c, float* master, const Grad* grad, float* buffer, Working* working,
                        std::size_t i) noexcept {
  const float p = master[i];
  const float g = std::fma(c.weight_decay, p, load_element(grad, i) * c.grad_scale);
  float u = g;
  if (c.has_momentum) {
    const float b = c.first ? g : std::fma(c.momentum, buffer[i], c.one_minus_dampening * g);
    buffer[i] = b;
    u = c.nesterov ? std::fma(c.momentum, b, g) : b;
  }
  const float updated = std::fma(c.neg_lr, u, p);
  master[i] = updated;
  store_element(working, i, updated);
}

template <class Grad, class Working>
void adam_scalar(const adam_coefficients& c, float* master, const Grad* grad, float* m1, float* m2, Working* working,
                 std::size_t begin, std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i) adam_element(c, master, grad, m1, m2, working, i);
}

template <class Grad, class Working>
void sgd_scalar(const sgd_coefficients& c, float* master, const Grad* grad, float* buffer, Working* working,
                std::size_t begin, std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i) sgd_element(c, master, grad, buffer, working, i);
}

/// Sum of squares in a fixed order that every path follows: element i of a block (blocks start at multiples of 16)
/// goes to lane i % 16; each lane adds its squares in index order (a float squared is exact in double, so a fused
/// and a plain multiply-add agree); the 16 lanes then fold as lanes[i] += lanes[i + s] for s = 8, 4, 2, 1.
constexpr std::size_t sum_lanes = 16;

inline double fold_lanes(double* lanes) noexcept {
  for (std::size_t s = sum_lanes / 2; s > 0; s /= 2)
    for (std::size_t i = 0; i < s; ++i) lanes[i] += lanes[i + s];
  return lanes[0];
}

template <class Grad>
inline void accumulate_squares(const Grad* grad, std::size_t begin, std::size_t end, std::size_t block_begin,
                               double* lanes) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    const double g = static_cast<double>(load_element(grad, i));
    lanes[(i - block_begin) % sum_lanes] += g * g;
  }
}

template <class Grad>
double sum_of_squares_scalar(const Grad* grad, std::size_t begin, std::size_t end) noexcept {
  double lanes[sum_lanes] = {};
  accumulate_squares(grad, begin, end, begin, lanes);
  return fold_lanes(lanes);
}

/// out[i] = in[i] as fp32 (a 16-bit chunk's values for fp32 compute).
template <class T>
void widen_scalar(const T* in, float* out, std::size_t begin, std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i) out[i] = load_element(in, i);
}
/// acc[i] = round(acc[i] + scale * g[i]), one fused multiply-add in fp32, then rounded to T to nearest even.
template <class T>
void accumulate_scaled_scalar(T* acc, const float* g, float scale, std::size_t begin, std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i) store_element(acc, i, std::fma(scale, g[i], load_element(acc, i)));
}

}  // namespace chunkwise::optim::detail
