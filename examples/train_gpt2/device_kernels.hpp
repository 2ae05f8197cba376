#pragma once
// The element-wise and reduction maths of GPT-2's passes as Thrust functors: one function object per operation,
// launched over an index range by for_each_index. The same source runs on the GPU (compiled by nvcc: Thrust's CUDA
// device system) and on the CPU (g++ with THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP), where CI checks it
// against gpt2_model.hpp's loops. Each functor writes outputs that no other index writes, so no atomics are needed
// and every sum runs in the CPU loops' order: the two differ only by the device's rounding of exp, tanh and fused
// multiply-adds. The matrix products are not here: cuBLAS on the GPU, the CPU loops on the host
// (device_model_impl.hpp).
#include <chunkwise/core/dtype.hpp>

#include "gelu_math.hpp"    // GPT2_HOST_DEVICE, tanh_approx
#include "gpt2_model.hpp"  // kernels::softmax_segment
#include "warp_lanes.hpp"

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>
#include <algorithm>

#if defined(__GNUG__)
#include <cxxabi.h>
#endif
#if defined(__CUDACC__)
#include <chunkwise/core/cuda/checked_call.cuh>

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

namespace gpt2::device_kernels {

using index = std::size_t;

/// Wall time per kernel, summed over a run, where CHUNKWISE_GPT2_KERNEL_TIMES is set in the environment (each timed
/// operation then waits for the device): where a step's device time goes, without a profiler.
class kernel_times {
 public:
  static kernel_times& instance() {
    static kernel_times times;
    return times;
  }
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }
  /// Runs `work`; where enabled, waits for the device and adds the time to `name`'s row.
  template <class Work>
  void time(const std::string& name, Work&& work) {
    if (!enabled_) return work();
    const auto start = std::chrono::steady_clock::now();
    work();
#if defined(__CUDACC__)
    (void)cudaDeviceSynchronize();
#endif
    add(name, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  void add(const std::string& name, double seconds) {
    std::lock_guard lock(mutex_);
    auto& row = rows_[name];
    row.first += seconds;
    ++row.second;
  }
  void reset() {
    std::lock_guard lock(mutex_);
    rows_.clear();
  }
  /// One line per name, the largest total first.
  void print(std::FILE* to) {
    std::lock_guard lock(mutex_);
    std::vector<std::pair<std::string, std::pair<double, long>>> rows(rows_.begin(), rows_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    double total = 0;
    for (const auto& row : rows) total += row.second.first;
    std::fprintf(to, "device time by operation (%.1f ms in all):\n", total * 1e3);
    for (const auto& [name, row] : rows)
      std::fprintf(to, "  %9.2f ms %5.1f%% %7ld calls  %s\n", row.first * 1e3, 100 * row.first / total, row.second,
                   name.c_str());
  }

 private:
  bool enabled_ = std::getenv("CHUNKWISE_GPT2_KERNEL_TIMES") != nullptr;
  std::mutex mutex_;
  std::map<std::string, std::pair<double, long>> rows_;
};

/// The functor's name without its namespace, for kernel_times.
template <class Functor>
std::string kernel_name() {
  std::string name = typeid(Functor).name();
#if defined(__GNUG__)
  int status = 0;
  if (char* demangled = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status)) {
    name = demangled;
    std::free(demangled);
  }
#endif
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

/// The device system's execution policy. On the GPU, launches do not wait for the kernel (Thrust's default policy
/// synchronises after every algorithm): work queues in order on the default stream and the host waits only where it
/// reads a result (a copy to host memory) or times a kernel.
inline auto device_policy() {
#if defined(__CUDACC__)
  return thrust::cuda::par_nosync;
#else
  return thrust::device;
#endif
}

/// run(), a launch of Functor's kernel, timed under Functor's name where kernel_times is enabled (the name, a
/// demangled string, is made only then).
template <class Functor, class Run>
void timed_launch(Run&& run) {
  auto& times = kernel_times::instance();
  if (times.enabled())
    times.time(kernel_name<Functor>(), run);
  else
    run();
}

/// f(i) for every i in [0, n) on the device system, in stream order after earlier work.
template <class Functor>
void for_each_index(index n, const Functor& f) {
  if (n == 0) return;
  timed_launch<Functor>([&] { thrust::for_each_n(device_policy(), thrust::counting_iterator<index>(0), n, f); });
}

#if defined(__CUDACC__)
template <class RowOp>
__global__ void rows_by_warps(RowOp op, index rows) {
  const index row = (static_cast<index>(blockIdx.x) * blockDim.x + threadIdx.x) / warp_lanes::width;
  if (row < rows) op(row, warp_lanes::device_lanes{threadIdx.x % warp_lanes::width});  // whole warps leave together
}

/// op(row, lanes) for every row in [0, rows), one warp per row (warp_lanes.hpp), in stream order after earlier work.
template <class RowOp>
void for_each_row(index rows, const RowOp& op) {
  if (rows == 0) return;
  constexpr unsigned block = 256;  // 8 rows a block
  const index blocks = (rows * warp_lanes::width + block - 1) / block;
  timed_launch<RowOp>([&] {
    rows_by_warps<<<static_cast<unsigned>(blocks), block>>>(op, rows);
    CHUNKWISE_CUDA_TRY(cudaGetLastError(), "GPT-2 device passes: " + kernel_name<RowOp>());
  });
}
#else
/// The host system's for_each_row: the kernel's host twin, each row's 32 lanes emulated (warp_lanes::host_lanes).
template <class RowOp>
void for_each_row(index rows, const RowOp& op) {
  for_each_index(rows, [op](index row) { op(row, warp_lanes::host_lanes{}); });
}
#endif

// bf16 chunks (the runtime's parameters and gradient accumulators under --dtype bf16), on raw bits: chunkwise's
// to_float and to_bf16 (round to nearest even, NaN kept quiet), so the host and the GPU give the runtime's bits.
GPT2_HOST_DEVICE inline float bf16_to_float(std::uint16_t bits) {
  return gelu_math::float_from_bits(static_cast<std::int32_t>(static_cast<std::uint32_t>(bits) << 16));
}
GPT2_HOST_DEVICE inline std::uint16_t float_to_bf16(float value) {
#if defined(__CUDA_ARCH__)
  const auto bits = __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
#endif
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// fp16 chunks (--dtype fp16), on raw bits: IEEE binary16, rounded to nearest even (CUDA's __float2half_rn on the
// GPU, chunkwise's to_fp16 on the host: the same bits, a NaN's payload aside).
GPT2_HOST_DEVICE inline float fp16_to_float(std::uint16_t bits) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(bits));
#else
  return chunkwise::to_float(chunkwise::fp16{bits});
#endif
}
GPT2_HOST_DEVICE inline std::uint16_t float_to_fp16(float value) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(value));
#else
  return chunkwise::to_fp16(value).bits;
#endif
}

// The 16-bit chunk formats, for the functors below.
struct bf16_format {
  GPT2_HOST_DEVICE static float widen(std::uint16_t bits) { return bf16_to_float(bits); }
  GPT2_HOST_DEVICE static std::uint16_t narrow(float value) { return float_to_bf16(value); }
};
struct fp16_format {
  GPT2_HOST_DEVICE static float widen(std::uint16_t bits) { return fp16_to_float(bits); }
  GPT2_HOST_DEVICE static std::uint16_t narrow(float value) { return float_to_fp16(value); }
};

// out[i] = in[i] widened: a pass's 16-bit parameters as the fp32 the passes compute with.
template <class Format>
struct widen_16 {
  float* out;
  const std::uint16_t* in;
  GPT2_HOST_DEVICE void operator()(index i) const { out[i] = Format::widen(in[i]); }
};

// acc[i] = 16-bit(acc[i] + scale * g[i]), one fused multiply-add rounded once (chunkwise's accumulate_scaled): a
// pass's fp32 gradients added into the runtime's 16-bit accumulators (scale: fp16's loss scale).
template <class Format>
struct accumulate_16 {
  std::uint16_t* acc;
  const float* g;
  float scale;
  GPT2_HOST_DEVICE void operator()(index i) const {
    acc[i] = Format::narrow(fmaf(scale, g[i], Format::widen(acc[i])));
  }
};

inline constexpr float layernorm_eps = 1e-5f;

// out[bt, c] = wte[tokens[bt], c] + wpe[bt % T, c]; i over B*T*C.
struct encoder_forward {
  float* out;
  const int* tokens;
  const float* wte;
  const float* wpe;
  index T, C;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index bt = i / C, c = i % C;
    out[i] = wte[static_cast<index>(tokens[bt]) * C + c] + wpe[(bt % T) * C + c];
  }
};

// The token embedding's gradient, one (bucket, channel) per index: a bucket is one token's positions in the batch,
// ascending, so each row of wte adds them in the CPU's serial order (upload_tokens makes the buckets).
struct encoder_backward {
  float* dwte;
  const float* dout;
  const int* positions;
  const int* starts;
  const int* tokens;
  index C;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index bucket = i / C, c = i % C;
    float* w = dwte + static_cast<index>(tokens[bucket]) * C + c;
    float sum = *w;
    for (int p = starts[bucket]; p < starts[bucket + 1]; ++p) sum += dout[static_cast<index>(positions[p]) * C + c];
    *w = sum;
  }
};
// The position embedding's gradient, one (t, c) per index: dwpe[t, c] += dout over the sequences b in order.
struct encoder_backward_positions {
  float* dwpe;
  const float* dout;
  index BT, T, C;
  GPT2_HOST_DEVICE void operator()(index i) const {
    float sum = dwpe[i];
    for (index bt = i / C; bt < BT; bt += T) sum += dout[bt * C + i % C];
    dwpe[i] = sum;
  }
};

// Sums down the columns of a (rows, n) array in segments of rows: one (segment, column) per index computes a segment's
// partial sum into parts[segment * n + column], one column per index adds them in order (matmul_engine.hpp's
// add_column_sums and gpt2_model.hpp's layernorm_backward, which the CPU loops use): a column of thousands of rows is
// the work of many threads, not one.
struct column_segments {
  index rows, n, segment = column_segment;
  GPT2_HOST_DEVICE index count() const { return (rows + segment - 1) / segment; }
  GPT2_HOST_DEVICE index begin(index s) const { return s * segment; }
  GPT2_HOST_DEVICE index end(index s) const { return begin(s) + segment < rows ? begin(s) + segment : rows; }
  GPT2_HOST_DEVICE float combine(const float* parts, index column) const {
    float sum = 0;
    for (index s = 0; s < count(); ++s) sum += parts[s * n + column];
    return sum;
  }
};

// Sums over a row in segments: one (row, segment) per index computes a segment's partial sum, one row per index
// combines them in order (gpt2_model.hpp's segmented_sum, which the CPU loops use): a row of C or V columns is then
// the work of many threads, not one.
struct row_segments {
  index n, segment;  // columns summed per row, columns per segment
  GPT2_HOST_DEVICE index per_row() const { return (n + segment - 1) / segment; }
  GPT2_HOST_DEVICE index begin(index s) const { return s * segment; }
  GPT2_HOST_DEVICE index end(index s) const { return begin(s) + segment < n ? begin(s) + segment : n; }
  GPT2_HOST_DEVICE float combine(const float* parts, index row) const {
    float sum = 0;
    for (index s = 0; s < per_row(); ++s) sum += parts[row * per_row() + s];
    return sum;
  }
};

// Layer norm forward, stage 1 (and 3), one (row, segment) per index: the segment's sum of x (mean null) or of
// (x - mean)^2.
struct layernorm_partial_sums {
  float* parts;
  const float* inp;
  const float* mean;
  row_segments s;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index row = i / s.per_row(), segment = i % s.per_row();
    const float* x = inp + row * s.n;
    float part = 0;
    if (mean == nullptr) {
      for (index c = s.begin(segment); c < s.end(segment); ++c) part += x[c];
    } else {
      const float m = mean[row];
      for (index c = s.begin(segment); c < s.end(segment); ++c) part += (x[c] - m) * (x[c] - m);
    }
    parts[i] = part;
  }
};

// Stage 2, one row per index: the mean.
struct layernorm_mean {
  float* mean;
  const float* parts;
  row_segments s;
  GPT2_HOST_DEVICE void operator()(index row) const { mean[row] = s.combine(parts, row) / static_cast<float>(s.n); }
};

// Stage 4, one row per index: 1 / the standard deviation.
struct layernorm_rstd {
  float* rstd;
  const float* parts;
  row_segments s;
  GPT2_HOST_DEVICE void operator()(index row) const {
    const float v = s.combine(parts, row) / static_cast<float>(s.n);
    rstd[row] = 1.0f / sqrtf(v + layernorm_eps);
  }
};

// Stage 5, one element per index: out = (x - mean) * rstd * weight + bias.
struct layernorm_normalize {
  float* out;
  const float* inp;
  const float* mean;
  const float* rstd;
  const float* weight;
  const float* bias;
  index C;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index row = i / C, c = i % C;
    out[i] = rstd[row] * (inp[i] - mean[row]) * weight[c] + bias[c];
  }
};

// Layer norm forward on the GPU, one warp per row: the stages above in one kernel, the row's sums the lanes'
// butterflies (not the CPU's segments: equal to rounding), the row read from cache after its first pass.
struct layernorm_forward_lanes {
  float* out;
  float* mean;
  float* rstd;
  const float* inp;
  const float* weight;
  const float* bias;
  index C;
  template <class Lanes>
  GPT2_HOST_DEVICE void operator()(index row, const Lanes& lanes) const {
    const float* x = inp + row * C;
    const float n = static_cast<float>(C);
    const float m = lanes.sum(lanes.fold(C, 0.0f, [&](float sum, index c) { return sum + x[c]; })) / n;
    const float v = lanes.sum(lanes.fold(C, 0.0f, [&](float sum, index c) { return sum + (x[c] - m) * (x[c] - m); }));
    const float r = 1.0f / sqrtf(v / n + layernorm_eps);
    lanes.for_each(C, [&](index c) { out[row * C + c] = r * (x[c] - m) * weight[c] + bias[c]; });
    if (lanes.leader()) {
      mean[row] = m;
      rstd[row] = r;
    }
  }
};

// Layer norm backward, the input's gradient. Stage 1, one (row, segment) per index: the segment's sums of dnorm and
// of dnorm * norm (parts: the first rows * segments, then the second).
struct layernorm_backward_partials {
  float* parts;
  const float* dout;
  const float* inp;
  const float* weight;
  const float* mean;
  const float* rstd;
  row_segments s;
  index rows;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index row = i / s.per_row(), segment = i % s.per_row();
    const float* d = dout + row * s.n;
    const float* x = inp + row * s.n;
    const float m = mean[row], r = rstd[row];
    float dnorm_sum = 0, dnorm_norm_sum = 0;
    for (index c = s.begin(segment); c < s.end(segment); ++c) dnorm_sum += weight[c] * d[c];
    for (index c = s.begin(segment); c < s.end(segment); ++c) dnorm_norm_sum += weight[c] * d[c] * ((x[c] - m) * r);
    parts[i] = dnorm_sum;
    parts[rows * s.per_row() + i] = dnorm_norm_sum;
  }
};

// Stage 2, one row per index: the two means (means: the first rows, then the second).
struct layernorm_backward_means {
  float* means;
  const float* parts;
  row_segments s;
  index rows;
  GPT2_HOST_DEVICE void operator()(index row) const {
    means[row] = s.combine(parts, row) / static_cast<float>(s.n);
    means[rows + row] = s.combine(parts + rows * s.per_row(), row) / static_cast<float>(s.n);
  }
};

// Stage 3, one element per index: dinp = base + (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd, base
// the residual stream's gradient so far (dinp itself: in place; null: 0, as the CPU loop adds to zeroed memory).
struct layernorm_backward_input {
  float* dinp;
  const float* base;
  const float* dout;
  const float* inp;
  const float* weight;
  const float* mean;
  const float* rstd;
  const float* means;
  index rows, C;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index row = i / C, c = i % C;
    const float norm = (inp[i] - mean[row]) * rstd[row];
    dinp[i] = (base != nullptr ? base[i] : 0.0f) + (weight[c] * dout[i] - means[row] - norm * means[rows + row]) *
                                                       rstd[row];
  }
};

// The input's gradient on the GPU, one warp per row: stages 1 to 3 in one kernel (as layernorm_forward_lanes); base
// as layernorm_backward_input's.
struct layernorm_backward_input_lanes {
  float* dinp;
  const float* base;
  const float* dout;
  const float* inp;
  const float* weight;
  const float* mean;
  const float* rstd;
  index C;
  template <class Lanes>
  GPT2_HOST_DEVICE void operator()(index row, const Lanes& lanes) const {
    const float* d = dout + row * C;
    const float* x = inp + row * C;
    const float m = mean[row], r = rstd[row], n = static_cast<float>(C);
    const float dnorm_mean =
        lanes.sum(lanes.fold(C, 0.0f, [&](float sum, index c) { return sum + weight[c] * d[c]; })) / n;
    const float dnorm_norm_mean = lanes.sum(lanes.fold(C, 0.0f, [&](float sum, index c) {
      return sum + weight[c] * d[c] * ((x[c] - m) * r);
    })) / n;
    lanes.for_each(C, [&](index c) {
      const float norm = (x[c] - m) * r;
      const index i = row * C + c;
      dinp[i] = (base != nullptr ? base[i] : 0.0f) + (weight[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * r;
    });
  }
};

// The weight's and bias's gradients, one channel per index, summed over the rows in order (in registers: a sum
// kept in memory would make every row a dependent global read-modify-write).
// Layer norm's parameter gradients, stage 1: per (segment, channel), the segment's partial sums of dout (dbias's, at
// parts[0, count * C)) and of norm * dout (dweight's, after them).
struct layernorm_backward_parameter_partials {
  float* parts;
  const float* dout;
  const float* inp;
  const float* mean;
  const float* rstd;
  column_segments segments;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index C = segments.n, s = i / C, c = i % C;
    float db = 0, dw = 0;
    for (index row = segments.begin(s); row < segments.end(s); ++row) {
      const float d = dout[row * C + c];
      db += d;
      dw += (inp[row * C + c] - mean[row]) * rstd[row] * d;
    }
    parts[i] = db;
    parts[segments.count() * C + i] = dw;
  }
};
// Stage 2: dbias += the segments' sums in order, dweight likewise; one channel per index.
struct layernorm_backward_parameters {
  float* dweight;
  float* dbias;
  const float* parts;
  column_segments segments;
  GPT2_HOST_DEVICE void operator()(index c) const {
    dbias[c] += segments.combine(parts, c);
    dweight[c] += segments.combine(parts + segments.count() * segments.n, c);
  }
};

// out[row, o] += bias[o]; i over rows*OC.
struct add_bias {
  float* out;
  const float* bias;
  index OC;
  GPT2_HOST_DEVICE void operator()(index i) const { out[i] += bias[i % OC]; }
};

// dbias[o] += sum over rows of dout[row, o], stage 1: one (segment, output channel) per index.
struct bias_backward_partials {
  float* parts;
  const float* dout;
  column_segments segments;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index OC = segments.n, s = i / OC, o = i % OC;
    float sum = 0;
    for (index row = segments.begin(s); row < segments.end(s); ++row) sum += dout[row * OC + o];
    parts[i] = sum;
  }
};
// Stage 2: the segments' sums in order, one output channel per index.
struct bias_backward {
  float* dbias;
  const float* parts;
  column_segments segments;
  GPT2_HOST_DEVICE void operator()(index o) const { dbias[o] += segments.combine(parts, o); }
};

// Causal self-attention, in stages that each give every output element its own index (the GPU needs hundreds of
// thousands of threads, not one per (b, t, h) row), each element summed in the CPU loop's order. qkv is (B, T, 3C):
// query, key, value at channel offsets 0, C, 2C, heads of hs = C / NH channels; att (the scores, then in place the
// weights) and datt (the weights' gradients, then in place the scores', dpreatt) are (B, NH, T, T) with only
// t2 <= t used. Index decompositions: row = (b * NH + h) * T + t.
struct attention_geometry {
  index T, C, NH;
  GPT2_HOST_DEVICE index hs() const { return C / NH; }
  GPT2_HOST_DEVICE float scale() const { return 1.0f / sqrtf(static_cast<float>(hs())); }
  // qkv element k of head h at position t of sequence b; part 0: query, 1: key, 2: value
  GPT2_HOST_DEVICE index at(index b, index t, index h, index part) const {
    return (b * T + t) * 3 * C + part * C + h * hs();
  }
  // index i over (B, T, NH, hs), k fastest: one channel of one head's output at (b, t)
  struct channel {
    index b, t, h, k;
  };
  GPT2_HOST_DEVICE channel channel_of(index i) const {
    return {i / (C * T), (i / C) % T, (i / hs()) % NH, i % hs()};
  }
  // index i over (B, NH, T, T), t2 fastest: one score of the row (b, h, t), row = (b * NH + h) * T + t
  struct score {
    index b, h, t, t2, row;
  };
  GPT2_HOST_DEVICE score score_of(index i) const {
    const index row = i / T;
    return {row / (T * NH), (row / T) % NH, row % T, i % T, row};
  }
};

// Forward 1: scores[row, t2] = q(t) . k(t2) * scale, one (row, t2 <= t) per index.
struct attention_scores {
  float* scores;  // att, which the softmax then turns into the weights in place
  const float* qkv;
  attention_geometry g;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const auto [b, h, t, t2, row] = g.score_of(i);
    if (t2 > t) return;
    const float* query = qkv + g.at(b, t, h, 0);
    const float* key = qkv + g.at(b, t2, h, 1);
    float score = 0;
    for (index k = 0; k < g.hs(); ++k) score += query[k] * key[k];
    scores[i] = score * g.scale();
  }
};

// Forward 2, in place: att's scores become their softmax over t2 <= t, and 0 past t (what a product over the whole
// row then adds for the masked positions: attention_products.hpp), one row per index.
struct attention_softmax {
  float* att;
  index T;
  GPT2_HOST_DEVICE void operator()(index row) const {
    const index t = row % T;
    float* a = att + row * T;
    float maxval = -INFINITY;
    for (index t2 = 0; t2 <= t; ++t2) maxval = fmaxf(maxval, a[t2]);
    float expsum = 0;
    for (index t2 = 0; t2 <= t; ++t2) {
      const float e = expf(a[t2] - maxval);
      expsum += e;
      a[t2] = e;
    }
    for (index t2 = 0; t2 <= t; ++t2) a[t2] /= expsum;
    for (index t2 = t + 1; t2 < T; ++t2) a[t2] = 0;
  }
};

// Forward 2 on the GPU: attention_softmax's maths, one warp per row (the per-row form reads each of 32 neighbouring
// threads' elements a row apart): the lanes' maxima and sums combined by butterflies, so the sum is not the CPU's
// sequential one (host_lanes runs these additions in the GPU's order, to test this against the CPU loops).
struct attention_softmax_lanes {
  float* att;
  index T;
  template <class Lanes>
  GPT2_HOST_DEVICE void operator()(index row, const Lanes& lanes) const {
    const index t = row % T;
    float* a = att + row * T;
    const float maxval = lanes.max(lanes.fold(t + 1, -INFINITY, [&](float m, index t2) { return fmaxf(m, a[t2]); }));
    const float expsum = lanes.sum(lanes.fold(t + 1, 0.0f, [&](float sum, index t2) {
      const float e = expf(a[t2] - maxval);
      a[t2] = e;  // each lane reads back only its own elements below
      return sum + e;
    }));
    lanes.for_each(T, [&](index t2) { a[t2] = t2 <= t ? a[t2] / expsum : 0.0f; });
  }
};

// Forward 3: out[b, t, h, k] = sum over t2 <= t of att[row, t2] * v(t2)[k], one output element per index (b, t, h, k:
// k fastest, so neighbouring threads read neighbouring values).
struct attention_values {
  float* out;
  const float* att;
  const float* qkv;
  attention_geometry g;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const auto [b, t, h, k] = g.channel_of(i);
    const float* a = att + ((b * g.NH + h) * g.T + t) * g.T;
    const float* value = qkv + g.at(b, 0, h, 2) + k;
    float sum = 0;
    for (index t2 = 0; t2 <= t; ++t2) sum += a[t2] * value[t2 * 3 * g.C];
    out[i] = sum;
  }
};

// Backward 1: datt[row, t2] = v(t2) . dout(t), one (row, t2 <= t) per index; past t left as it is (the softmax's
// backward writes zeros there).
struct attention_backward_weights {
  float* datt;
  const float* dout;
  const float* qkv;
  attention_geometry g;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const auto [b, h, t, t2, row] = g.score_of(i);
    if (t2 > t) return;
    const float* value = qkv + g.at(b, t2, h, 2);
    const float* d = dout + (b * g.T + t) * g.C + h * g.hs();
    float sum = 0;
    for (index k = 0; k < g.hs(); ++k) sum += value[k] * d[k];
    datt[i] = sum;
  }
};

// Backward 2: the softmax's backward, one row per index, in place: datt becomes dpreatt = att * (datt - sum over t2
// of att * datt), and 0 past t (what the GPU's products over whole rows then add for the masked positions:
// attention_products.hpp).
struct attention_backward_softmax {
  float* datt;
  const float* att;
  index T;
  GPT2_HOST_DEVICE void operator()(index row) const {
    const index t = row % T;
    const float* a = att + row * T;
    float* d = datt + row * T;
    float weighted = 0;
    for (index t2 = 0; t2 <= t; ++t2) weighted += a[t2] * d[t2];
    for (index t2 = 0; t2 <= t; ++t2) d[t2] = a[t2] * (d[t2] - weighted);
    for (index t2 = t + 1; t2 < T; ++t2) d[t2] = 0;
  }
};

// Backward 2 on the GPU: attention_backward_softmax's maths, one warp per row (as attention_softmax_lanes).
struct attention_backward_softmax_lanes {
  float* datt;
  const float* att;
  index T;
  template <class Lanes>
  GPT2_HOST_DEVICE void operator()(index row, const Lanes& lanes) const {
    const index t = row % T;
    const float* a = att + row * T;
    float* d = datt + row * T;
    const float weighted = lanes.sum(lanes.fold(t + 1, 0.0f, [&](float sum, index t2) { return sum + a[t2] * d[t2]; }));
    lanes.for_each(T, [&](index t2) { d[t2] = t2 <= t ? a[t2] * (d[t2] - weighted) : 0.0f; });
  }
};

// Backward 3: the query's gradient, dq(t)[k] = sum over t2 <= t of k(t2)[k] * dpreatt[row, t2] * scale; one
// element (b, t, h, k) per index. Backward 3 and 4 write dqkv whole, as the GPU's products (attention_products.hpp).
struct attention_backward_queries {
  float* dqkv;
  const float* dpreatt;
  const float* qkv;
  attention_geometry g;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const auto [b, t, h, k] = g.channel_of(i);
    const float* dp = dpreatt + ((b * g.NH + h) * g.T + t) * g.T;
    const float* key = qkv + g.at(b, 0, h, 1) + k;
    float* dquery = dqkv + g.at(b, t, h, 0) + k;
    float sum = 0;
    for (index t2 = 0; t2 <= t; ++t2) sum += key[t2 * 3 * g.C] * (dp[t2] * g.scale());
    *dquery = sum;
  }
};

// Backward 4: the key's and value's gradients at position t2, summed over the queries t >= t2 that attended to it
// in ascending t, as the CPU loop adds them; one element (b, t2, h, k) per index.
struct attention_backward_keys_values {
  float* dqkv;
  const float* dpreatt;
  const float* att;
  const float* dout;
  const float* qkv;
  attention_geometry g;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const auto [b, t2, h, k] = g.channel_of(i);
    const index rows = (b * g.NH + h) * g.T;  // row of (b, h, t = 0)
    const float* query = qkv + g.at(b, 0, h, 0) + k;
    const float* d = dout + b * g.T * g.C + h * g.hs() + k;
    float* dkey = dqkv + g.at(b, t2, h, 1) + k;
    float* dvalue = dqkv + g.at(b, t2, h, 2) + k;
    float dk = 0, dv = 0;
    for (index t = t2; t < g.T; ++t) {
      const index at = (rows + t) * g.T + t2;
      dv += att[at] * d[t * g.C];
      dk += query[t * 3 * g.C] * (dpreatt[at] * g.scale());
    }
    *dkey = dk;
    *dvalue = dv;
  }
};

// A product's output plus its bias, where the product left it out (null: it added its own). The passes after the
// GPU's products and GELU's backward all add it so: one sum, so forward and backward see the same bits.
GPT2_HOST_DEVICE inline float plus_bias(float product, const float* bias, index i, index OC) {
  return bias != nullptr ? product + bias[i % OC] : product;
}

// GELU, tanh approximation; i over the elements.
GPT2_HOST_DEVICE inline float gelu(float x) {
  const float cube = 0.044715f * x * x * x;
  const float gelu_scaling = sqrtf(2.0f / 3.14159265358979323846f);  // as the CPU loop rounds it
  return 0.5f * x * (1.0f + gelu_math::tanh_approx(gelu_scaling * (x + cube)));
}

// The GPU's products leave out their bias (cuBLAS adds none), and it is added where their output is read next rather
// than in a pass of its own (add_bias): one read and one write of the output fewer, the same roundings, so the same
// bits. Null bias: the product added its own (the CPU loops'). The MLP's first product: out = GELU(pre + bias); pre
// stays the product alone, and backward adds the bias again (gelu_backward: the same sum, so the same bits), rather
// than this pass writing the (B, T, 4C) sum back for it.
struct bias_gelu_forward {
  float* out;
  const float* pre;
  const float* bias;
  index OC;
  GPT2_HOST_DEVICE void operator()(index i) const { out[i] = gelu(plus_bias(pre[i], bias, i, OC)); }
};

// dinp = GELU'(inp + bias) * dout; bias as bias_gelu_forward's (null: inp holds the pre-activation).
struct gelu_backward {
  float* dinp;
  const float* inp;
  const float* bias;
  index OC;
  const float* dout;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const float x = plus_bias(inp[i], bias, i, OC);
    const float cube = 0.044715f * x * x * x;
    const float gelu_scaling = sqrtf(2.0f / 3.14159265358979323846f);
    const float tanh_out = gelu_math::tanh_approx(gelu_scaling * (x + cube));
    const float sech2 = 1.0f - tanh_out * tanh_out;
    const float local_grad =
        0.5f * (1.0f + tanh_out) + x * 0.5f * sech2 * gelu_scaling * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = local_grad * dout[i];  // written, not added: the CPU loop adds it to zeroed memory
  }
};

// The residual after a projection (attention's, the MLP's second): out = inp1 + (product + bias), the product's bias
// added here as in bias_gelu_forward (null: the product added it); the product's own output is not read again.
struct residual_bias_forward {
  float* out;
  const float* inp1;
  const float* product;
  const float* bias;
  index OC;
  GPT2_HOST_DEVICE void operator()(index i) const {
    out[i] = inp1[i] + plus_bias(product[i], bias, i, OC);
  }
};

// The softmax over the V tokens and the cross-entropy against the target, in stages that keep every thread's work
// short (rows of tens of thousands of columns, only B*T rows): one (row, segment) per index for the maxima and the
// exponentials, one row per index to combine the segments in the CPU loop's order (row_segments over V columns of
// kernels::softmax_segment; the rows are Vp apart).
// Stage 1, one (row, segment) per index: the segment's largest logit.
struct softmax_segment_max {
  float* maxima;  // (rows, segments)
  const float* logits;
  row_segments s;
  index Vp;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index row = i / s.per_row(), segment = i % s.per_row();
    const float* l = logits + row * Vp;
    float m = -INFINITY;
    for (index c = s.begin(segment); c < s.end(segment); ++c) m = fmaxf(m, l[c]);
    maxima[i] = m;
  }
};

// Stage 2, one row per index: the row's largest logit (the maximum does not depend on the order).
struct softmax_row_max {
  float* row_max;
  const float* maxima;
  row_segments s;
  GPT2_HOST_DEVICE void operator()(index row) const {
    float m = -INFINITY;
    for (index segment = 0; segment < s.per_row(); ++segment) m = fmaxf(m, maxima[row * s.per_row() + segment]);
    row_max[row] = m;
  }
};

// Stage 3, one (row, segment) per index: the exponentials, in place of the logits, and their sum over the segment.
struct softmax_segment_exp {
  float* logits;
  float* sums;  // (rows, segments)
  const float* row_max;
  row_segments s;
  index Vp;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index row = i / s.per_row(), segment = i % s.per_row();
    float* l = logits + row * Vp;
    const float m = row_max[row];
    float part = 0;
    for (index c = s.begin(segment); c < s.end(segment); ++c) {
      l[c] = expf(l[c] - m);
      part += l[c];
    }
    sums[i] = part;
  }
};

// Stage 4, one row per index: the segments' sums in order.
struct softmax_row_sum {
  float* row_sum;
  const float* sums;
  row_segments s;
  GPT2_HOST_DEVICE void operator()(index row) const { row_sum[row] = s.combine(sums, row); }
};

// The probabilities are never written as such: the loss reads one per row, and the backward divides each
// exponential by its row's sum where it writes dlogits over it. A pass of its own over the (B*T, Vp) logits (1.6 GB
// at batch 32, context 256: written, then read back) would only repeat that division. The bits are the CPU's, which
// stores e / sum and subtracts later: the same two roundings.
GPT2_HOST_DEVICE inline float softmax_probability(float exponential, float row_sum) { return exponential / row_sum; }

// Stage 5, one row per index: the cross-entropy against the row's target.
struct crossentropy_forward {
  float* losses;
  const float* exponentials;
  const float* row_sum;
  const int* targets;
  index Vp;
  GPT2_HOST_DEVICE void operator()(index row) const {
    const float e = exponentials[row * Vp + static_cast<index>(targets[row])];
    losses[row] = -logf(softmax_probability(e, row_sum[row]));
  }
};

// In place of forward's exponentials: dlogits = (probability - onehot(target)) * dloss, and 0 in the padded columns
// (which hold their logits); i over rows*Vp.
struct crossentropy_softmax_backward {
  float* exponentials;
  const float* row_sum;
  const int* targets;
  float dloss;
  index V, Vp;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index row = i / Vp, column = i % Vp;
    if (column >= V) {
      exponentials[i] = 0.0f;
      return;
    }
    const float indicator = column == static_cast<index>(targets[row]) ? 1.0f : 0.0f;
    exponentials[i] = (softmax_probability(exponentials[i], row_sum[row]) - indicator) * dloss;
  }
};

// The head on the GPU, one warp per row, forward and the loss's backward in one kernel: the row's max and sum of
// exponentials in one pass (exp_sum: online, the lanes combined by a butterfly), then dlogits written over the logits
// (stages 1 to 6: the exponentials are never stored) and the loss by the lane that holds the target. Over the
// (B*T, Vp) logits (1.6 GB at batch 32, context 256) that is 2 reads and a write, where the stages' GPU form (max, then
// exponentials written, then dlogits) read 3 times and wrote twice. Backward follows forward on the same batch
// (schedule.hpp), and dloss is the mean's 1 / (B*T), known here. Equal to the stages to rounding (another order).
struct crossentropy_lanes {
  float* logits;  // in: the logits; out: dlogits (0 in the padded columns)
  float* losses;
  const int* targets;
  float dloss;
  index V, Vp;
  template <class Lanes>
  GPT2_HOST_DEVICE void operator()(index row, const Lanes& lanes) const {
    float* l = logits + row * Vp;
    const warp_lanes::exp_sum stats = lanes.max_and_exp_sum(V, [&](index c) { return l[c]; });
    const index target = static_cast<index>(targets[row]);
    lanes.for_each(Vp, [&](index c) {
      if (c >= V) {
        l[c] = 0.0f;
        return;
      }
      const float probability = softmax_probability(expf(l[c] - stats.max), stats.sum);
      if (c == target) losses[row] = -logf(probability);
      l[c] = (probability - (c == target ? 1.0f : 0.0f)) * dloss;
    });
  }
};

}  // namespace gpt2::device_kernels
