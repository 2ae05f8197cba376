#pragma once
// One warp per row, for row operations over rows contiguous in memory (attention's (B, NH, T, T) weights): lane l
// takes the row's elements l, l + 32, ..., so each step of the warp reads 32 neighbouring floats, where one thread per
// row reads 32 elements a whole row apart. A row's reductions combine the lanes' partial results by a butterfly of
// shuffles. An operation is written once, as `op(row, lanes)` over the lanes' primitives (fold, for_each, the
// butterflies, and a softmax's max and sum in one pass), and runs with `device_lanes` in a kernel
// (device_kernels::for_each_row) or with `host_lanes`, which emulates the 32 lanes on the CPU with the butterfly's
// additions in the GPU's order: the kernel's host twin, which the tests run against the CPU loops.
#include "gelu_math.hpp"  // GPT2_HOST_DEVICE

#include <array>
#include <cmath>
#include <cstddef>

namespace gpt2::warp_lanes {

using index = std::size_t;
inline constexpr unsigned width = 32;

/// A softmax's statistics over some of a row's elements: their largest value and the sum of exp(v - max), kept in one
/// pass (online: a larger value rescales the sum so far) and combined across lanes the same way.
struct exp_sum {
  float max = -INFINITY;
  float sum = 0.0f;
  GPT2_HOST_DEVICE void add(float v) {
    if (v > max) {
      sum = sum * expf(max - v) + 1.0f;  // expf(-inf) = 0 before the first value
      max = v;
    } else {
      sum += expf(v - max);
    }
  }
  /// fold's step over value(i): the statistics so far with element i added.
  template <class Value>
  GPT2_HOST_DEVICE static auto adding(Value& value) {
    return [&value](exp_sum s, index i) {
      s.add(value(i));
      return s;
    };
  }
  /// Both orders give the same bits (the operands are ordered first: with fused multiply-adds the sum's two terms
  /// are not symmetric), so every lane of a butterfly ends with the same statistics.
  GPT2_HOST_DEVICE static exp_sum combine(exp_sum a, exp_sum b) {
    if (b.max < a.max || (b.max == a.max && b.sum < a.sum)) {
      const exp_sum t = a;
      a = b;
      b = t;
    }
    const float m = b.max;
    if (m == -INFINITY) return {};  // neither saw a value
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
  }
};

/// The 32 lanes as the CPU runs them: a lane's partial result is an array of the 32 lanes' values, each lane's fold
/// run in its own order (no lane reads another's elements, so the order between lanes does not matter).
struct host_lanes {
  template <class T>
  using lane_values = std::array<T, width>;
  using values = lane_values<float>;
  /// Each lane's f(... f(f(init, l), l + 32) ..., last), over its elements l < n of stride 32.
  template <class T, class F>
  lane_values<T> fold(index n, T init, F&& f) const {
    lane_values<T> v;
    for (unsigned lane = 0; lane < width; ++lane) {
      v[lane] = init;
      for (index i = lane; i < n; i += width) v[lane] = f(v[lane], i);
    }
    return v;
  }
  template <class F>
  void for_each(index n, F&& f) const {
    for (index i = 0; i < n; ++i) f(i);
  }
  /// The butterfly: at each offset 16, 8, 4, 2, 1 lane l combines its value with lane l ^ offset's, so every lane ends
  /// with the same result (combine is commutative).
  template <class T, class Combine>
  static T butterfly(lane_values<T> v, Combine combine) {
    for (unsigned offset = width / 2; offset > 0; offset /= 2) {
      lane_values<T> next;
      for (unsigned lane = 0; lane < width; ++lane) next[lane] = combine(v[lane], v[lane ^ offset]);
      v = next;
    }
    return v[0];
  }
  /// Whether this lane writes the row's single results (the emulation runs a row once).
  static bool leader() { return true; }
  static float sum(const values& v) { return butterfly(v, [](float a, float b) { return a + b; }); }
  static float max(const values& v) { return butterfly(v, [](float a, float b) { return fmaxf(a, b); }); }
  /// exp_sum over value(i), i < n: each lane's elements in its order, then the butterfly of exp_sum::combine.
  template <class Value>
  exp_sum max_and_exp_sum(index n, Value&& value) const {
    return butterfly(fold(n, exp_sum{}, exp_sum::adding(value)), exp_sum::combine);
  }
};

#if defined(__CUDACC__)
/// A lane of a warp that holds one row: every lane of the warp calls each primitive (the butterflies' shuffles need
/// all 32). Host-callable only to compile as the host pass of a __host__ __device__ operation; it runs in kernels.
struct device_lanes {
  unsigned lane;
  template <class T, class F>
  GPT2_HOST_DEVICE T fold(index n, T init, F&& f) const {
    T v = init;
    for (index i = lane; i < n; i += width) v = f(v, i);
    return v;
  }
  template <class F>
  GPT2_HOST_DEVICE void for_each(index n, F&& f) const {
    for (index i = lane; i < n; i += width) f(i);
  }
  GPT2_HOST_DEVICE bool leader() const { return lane == 0; }
  GPT2_HOST_DEVICE static float sum(float v) {
#if defined(__CUDA_ARCH__)
    for (unsigned offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
#endif
    return v;
  }
  GPT2_HOST_DEVICE static float max(float v) {
#if defined(__CUDA_ARCH__)
    for (unsigned offset = width / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
#endif
    return v;
  }
  template <class Value>
  GPT2_HOST_DEVICE exp_sum max_and_exp_sum(index n, Value&& value) const {
    exp_sum v = fold(n, exp_sum{}, exp_sum::adding(value));
#if defined(__CUDA_ARCH__)
    for (unsigned offset = width / 2; offset > 0; offset /= 2)
      v = exp_sum::combine(v, {__shfl_xor_sync(0xffffffffu, v.max, offset),
                               __shfl_xor_sync(0xffffffffu, v.sum, offset)});
#endif
    return v;
  }
};
#endif

}  // namespace gpt2::warp_lanes
