#pragma once
// Fused Adam/AdamW for chunks resident on the GPU: one launch updates every chunk of a table (pointers and sizes
// in device memory), float4-vectorised where the arrays allow, with the bf16/fp16 working copy written in the
// same pass. The element update is the CPU kernels' (explicit __fmaf_rn/__fmul_rn/__fsqrt_rn/__fdiv_rn, so nvcc
// cannot contract it differently): with the same coefficients GPU and CPU results are bit-identical.
//
// Two ways to drive it:
//  - step(chunks, args) / grad_sum_of_squares(chunks): host-driven, synchronous, models chunk_optimizer (so
//    mixed_precision_step can drive it like the CPU optimizer).
//  - bind(chunks) once, then enqueue_step(): device-driven mixed precision with no host synchronisation and no
//    allocation: CUB block reductions compute the global squared norm, an optional device all-reduce hook sums it
//    across ranks, a one-thread kernel decides skip / clip / loss-scale / bias correction from device-resident
//    state and the learning-rate schedule table, and the update kernel reads that decision. The whole sequence
//    can be captured in a CUDA graph and replayed every step.
#if CHUNKWISE_HAS_CUDA

#include <chunkwise/core/cuda/checked_call.cuh>
#include <chunkwise/core/cuda/host_wait.cuh>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/optim/concepts.hpp>
#include <chunkwise/optim/hyperparameters.hpp>
#include <chunkwise/optim/loss_scaler.hpp>
#include <chunkwise/optim/mixed_precision.hpp>

#include <cub/block/block_reduce.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace chunkwise::optim {

// Kernels and device-side types; `cuda_kernels`, not `cuda`, so a using-directive never makes ::cuda ambiguous. The
// kernels are static: each translation unit that includes this header launches its own copy, so a program of several
// .cu files that include it links (tests/cuda: chunkwise_cuda_header_check links every .cuh's unit into one program).
namespace detail::cuda_kernels {


enum type_code : std::uint8_t { none = 0, f32 = 1, b16 = 2, f16 = 3 };

/// One row of the chunk table (device memory).
struct device_chunk {
  float* master;
  const void* grad;
  float* moment1;
  float* moment2;
  void* working;
  unsigned long long count;
  std::uint8_t grad_type, working_type;
  bool vectorized;  // every array aligned for 4-element loads and stores
};

/// Device-resident state of the device-driven path; only kernels write it between bind() and read_report().
struct device_state {
  adam_coefficients coefficients;  // this step's
  double sum_of_squares;           // of the stored (loss-scaled) gradients, after the cross-rank hook
  double grad_norm;                // unscaled
  float clip_coefficient;
  float loss_scale;
  unsigned good_steps;
  int skipped;                     // 1: this step's gradients were not finite, nothing was updated
  unsigned long long steps;        // updates taken
  unsigned long long skipped_steps;
};

/// Fixed per-run settings of the device-driven path (kernel argument, by value).
struct device_settings {
  adam_config config;
  float max_grad_norm;  // 0: no clipping
  int scaling;          // dynamic loss scaling on
  loss_scaler_config scaler;
  int need_norm;
};

constexpr int block_threads = 256;

__device__ __forceinline__ float load(const float* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, unsigned long long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load(const __half* p, unsigned long long i) { return __half2float(p[i]); }
__device__ __forceinline__ void store(__nv_bfloat16* p, unsigned long long i, float x) { p[i] = __float2bfloat16_rn(x); }
__device__ __forceinline__ void store(__half* p, unsigned long long i, float x) { p[i] = __float2half_rn(x); }
__device__ __forceinline__ void store(void*, unsigned long long, float) {}

__device__ __forceinline__ float4 load4(const float* p, unsigned long long i) {
  return *reinterpret_cast<const float4*>(p + i);
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p, unsigned long long i) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p + i);
  return make_float4(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
                     __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u));
}
__device__ __forceinline__ float4 load4(const __half* p, unsigned long long i) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p + i);
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ unsigned pack(__nv_bfloat16 a, __nv_bfloat16 b) {
  return static_cast<unsigned>(__bfloat16_as_ushort(a)) | (static_cast<unsigned>(__bfloat16_as_ushort(b)) << 16);
}
__device__ __forceinline__ unsigned pack(__half a, __half b) {
  return static_cast<unsigned>(__half_as_ushort(a)) | (static_cast<unsigned>(__half_as_ushort(b)) << 16);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, unsigned long long i, float4 x) {
  *reinterpret_cast<uint2*>(p + i) = make_uint2(pack(__float2bfloat16_rn(x.x), __float2bfloat16_rn(x.y)),
                                                pack(__float2bfloat16_rn(x.z), __float2bfloat16_rn(x.w)));
}
__device__ __forceinline__ void store4(__half* p, unsigned long long i, float4 x) {
  *reinterpret_cast<uint2*>(p + i) =
      make_uint2(pack(__float2half_rn(x.x), __float2half_rn(x.y)), pack(__float2half_rn(x.z), __float2half_rn(x.w)));
}
__device__ __forceinline__ void store4(void*, unsigned long long, float4) {}

/// The element update of adam_coefficients, rounding for rounding the CPU kernels'.
__device__ __forceinline__ void adam_element(const adam_coefficients& c, float& p, float grad, float& m, float& v) {
  const float g = __fmaf_rn(c.l2, p, __fmul_rn(grad, c.grad_scale));
  m = __fmaf_rn(c.beta1, m, __fmul_rn(c.one_minus_beta1, g));
  v = __fmaf_rn(c.beta2, v, __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom = __fmaf_rn(__fsqrt_rn(v), c.inv_sqrt_bias2, c.eps);
  p = __fmaf_rn(c.neg_step_size, __fdiv_rn(m, denom), __fmul_rn(p, c.decay));
}

template <class Grad, class Working>
__device__ void adam_chunk(const adam_coefficients& c, const device_chunk& chunk) {
  const auto* grad = static_cast<const Grad*>(chunk.grad);
  auto* working = static_cast<Working*>(chunk.working);
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  const unsigned long long first = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long tail = 0;
  if (chunk.vectorized) {
    const unsigned long long groups = chunk.count / 4;
    for (unsigned long long q = first; q < groups; q += stride) {
      const unsigned long long i = q * 4;
      float4 p = load4(chunk.master, i), m = load4(chunk.moment1, i), v = load4(chunk.moment2, i);
      const float4 g = load4(grad, i);
      adam_element(c, p.x, g.x, m.x, v.x);
      adam_element(c, p.y, g.y, m.y, v.y);
      adam_element(c, p.z, g.z, m.z, v.z);
      adam_element(c, p.w, g.w, m.w, v.w);
      *reinterpret_cast<float4*>(chunk.master + i) = p;
      *reinterpret_cast<float4*>(chunk.moment1 + i) = m;
      *reinterpret_cast<float4*>(chunk.moment2 + i) = v;
      store4(working, i, p);
    }
    tail = groups * 4;
  }
  for (unsigned long long i = tail + first; i < chunk.count; i += stride) {
    float p = chunk.master[i], m = chunk.moment1[i], v = chunk.moment2[i];
    adam_element(c, p, load(grad, i), m, v);
    chunk.master[i] = p;
    chunk.moment1[i] = m;
    chunk.moment2[i] = v;
    store(working, i, p);
  }
}

template <class Grad>
__device__ void adam_chunk_working(const adam_coefficients& c, const device_chunk& chunk) {
  if (chunk.working_type == b16) adam_chunk<Grad, __nv_bfloat16>(c, chunk);
  else if (chunk.working_type == f16) adam_chunk<Grad, __half>(c, chunk);
  else adam_chunk<Grad, void>(c, chunk);
}

/// Every block walks every chunk (grid-stride), so one launch balances chunks of any sizes.
static __global__ void __launch_bounds__(block_threads)
    adam_kernel(const device_chunk* table, int chunks, const device_state* state) {
  if (state->skipped) return;
  const adam_coefficients c = state->coefficients;
  for (int k = 0; k < chunks; ++k) {
    const device_chunk chunk = table[k];
    if (chunk.grad_type == f32) adam_chunk_working<float>(c, chunk);
    else if (chunk.grad_type == b16) adam_chunk_working<__nv_bfloat16>(c, chunk);
    else adam_chunk_working<__half>(c, chunk);
  }
}

template <class Grad>
__device__ double chunk_squares(const device_chunk& chunk) {
  const auto* grad = static_cast<const Grad*>(chunk.grad);
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  const unsigned long long first = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  double sum = 0.0;
  unsigned long long tail = 0;
  if (chunk.vectorized) {
    for (unsigned long long q = first; q < chunk.count / 4; q += stride) {
      const float4 g = load4(grad, q * 4);
      sum += static_cast<double>(g.x) * g.x + static_cast<double>(g.y) * g.y + static_cast<double>(g.z) * g.z +
             static_cast<double>(g.w) * g.w;
    }
    tail = chunk.count / 4 * 4;
  }
  for (unsigned long long i = tail + first; i < chunk.count; i += stride) {
    const double g = load(grad, i);
    sum += g * g;
  }
  return sum;
}

/// Per-block partial sums of grad^2 (fixed grid: the result is deterministic), reduced with cub::BlockReduce.
static __global__ void __launch_bounds__(block_threads)
    squares_kernel(const device_chunk* table, int chunks, double* partials) {
  double sum = 0.0;
  for (int k = 0; k < chunks; ++k) {
    const device_chunk chunk = table[k];
    if (chunk.grad_type == f32) sum += chunk_squares<float>(chunk);
    else if (chunk.grad_type == b16) sum += chunk_squares<__nv_bfloat16>(chunk);
    else sum += chunk_squares<__half>(chunk);
  }
  using reduce = cub::BlockReduce<double, block_threads>;
  __shared__ typename reduce::TempStorage storage;
  const double block_sum = reduce(storage).Sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

/// One block folds the partials (in a fixed order) into state->sum_of_squares.
static __global__ void __launch_bounds__(block_threads) fold_kernel(const double* partials, int count, double* out) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += block_threads) sum += partials[i];
  using reduce = cub::BlockReduce<double, block_threads>;
  __shared__ typename reduce::TempStorage storage;
  const double total = reduce(storage).Sum(sum);
  if (threadIdx.x == 0) *out = total;
}

/// Decides this step on the device: skip on non-finite gradients (backing off the loss scale), else the clip
/// coefficient, the learning rate from the schedule table, the bias corrections (make_coefficients' formula) and
/// the loss-scale growth.
static __global__ void decide_kernel(device_state* state, device_settings settings, const float* lr_schedule,
                              unsigned long long schedule_length) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const float loss_scale = settings.scaling ? state->loss_scale : 1.0f;
  double norm = 0.0;
  float clip = 1.0f;
  if (settings.need_norm) {
    norm = sqrt(state->sum_of_squares) / static_cast<double>(loss_scale);
    if (!isfinite(norm)) {
      state->grad_norm = norm;
      state->skipped = 1;
      ++state->skipped_steps;
      if (settings.scaling) {
        state->loss_scale = fmaxf(state->loss_scale * settings.scaler.backoff_factor, settings.scaler.min_scale);
        state->good_steps = 0;
      }
      return;
    }
    if (settings.max_grad_norm > 0.0f)
      clip = static_cast<float>(fmin(static_cast<double>(settings.max_grad_norm) / (norm + 1e-6), 1.0));
  }
  const unsigned long long t = ++state->steps;
  const float lr = lr_schedule[t - 1 < schedule_length ? t - 1 : schedule_length - 1];
  const adam_config& cfg = settings.config;
  const double bias1 = 1.0 - pow(static_cast<double>(cfg.beta1), static_cast<double>(t));
  const double bias2 = 1.0 - pow(static_cast<double>(cfg.beta2), static_cast<double>(t));
  const bool decoupled = cfg.decay_mode == weight_decay_mode::decoupled;
  adam_coefficients c;
  c.beta1 = cfg.beta1;
  c.one_minus_beta1 = 1.0f - cfg.beta1;
  c.beta2 = cfg.beta2;
  c.one_minus_beta2 = 1.0f - cfg.beta2;
  c.eps = cfg.eps;
  c.neg_step_size = static_cast<float>(-static_cast<double>(lr) / bias1);
  c.inv_sqrt_bias2 = static_cast<float>(1.0 / sqrt(bias2));
  c.decay = decoupled ? static_cast<float>(1.0 - static_cast<double>(lr) * cfg.weight_decay) : 1.0f;
  c.l2 = decoupled ? 0.0f : cfg.weight_decay;
  c.grad_scale = static_cast<float>(static_cast<double>(clip) / static_cast<double>(loss_scale));
  state->coefficients = c;
  state->grad_norm = norm;
  state->clip_coefficient = clip;
  state->skipped = 0;
  if (settings.scaling && ++state->good_steps == settings.scaler.growth_interval) {
    state->loss_scale = fminf(state->loss_scale * settings.scaler.growth_factor, settings.scaler.max_scale);
    state->good_steps = 0;
  }
}

}  // namespace detail::cuda_kernels

/// Sums a device double across ranks in place on a stream (an ncclAllReduce of one double); one rank: nothing.
struct no_device_reduction {
  void operator()(double*, cudaStream_t) const noexcept {}
};

class cuda_adam {
 public:
  using config_type = adam_config;
  static constexpr std::size_t state_arrays = 2;

  /// Allocates everything it will use (chunk table for `max_chunks`, reduction partials, state, pinned staging):
  /// nothing is allocated afterwards. The chunk arrays themselves must be device memory.
  explicit cuda_adam(const adam_config& config = {}, cudaStream_t stream = nullptr, std::size_t max_chunks = 1024)
      : config_(config), stream_(stream), max_chunks_(max_chunks) {
    validate(config_);
    if (max_chunks == 0) throw error(error_code::invalid_argument, "cuda_adam: max_chunks must be >= 1");
    int device = 0, sms = 0;
    CHUNKWISE_CUDA_TRY(cudaGetDevice(&device), "cuda_adam constructor");
    CHUNKWISE_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                             "cuda_adam constructor");
    blocks_ = sms * 4;  // 1024 resident threads per SM, each with four 16-byte loads in flight
    try {
      allocate(reinterpret_cast<void**>(&table_), max_chunks * sizeof(detail::cuda_kernels::device_chunk), false);
      allocate(reinterpret_cast<void**>(&partials_), static_cast<std::size_t>(blocks_) * sizeof(double), false);
      allocate(reinterpret_cast<void**>(&state_), sizeof(detail::cuda_kernels::device_state), false);
      allocate(reinterpret_cast<void**>(&host_table_), max_chunks * sizeof(detail::cuda_kernels::device_chunk), true);
      allocate(reinterpret_cast<void**>(&host_state_), sizeof(detail::cuda_kernels::device_state), true);
    } catch (...) {
      release();
      throw;
    }
  }
  cuda_adam(const cuda_adam&) = delete;
  cuda_adam& operator=(const cuda_adam&) = delete;
  ~cuda_adam() { release(); }

  [[nodiscard]] const adam_config& config() const noexcept { return config_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  // ---- host-driven (chunk_optimizer): synchronous, returns when the memory is updated ----

  void step(std::span<const chunk_arrays> chunks, const step_args& args) {
    check_unbound("step");
    validate(args);
    synchronized_after("cuda_adam::step", [&] {
      upload_table(chunks, true);
      *host_state_ = detail::cuda_kernels::device_state{};
      host_state_->coefficients = make_coefficients(config_, args);
      CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(state_, host_state_, sizeof(detail::cuda_kernels::device_state),
                                         cudaMemcpyHostToDevice, stream_),
                         "cuda_adam::step (coefficients)");
      launch_update();
    });
  }
  void step(const chunk_arrays& chunk, const step_args& args) { step(std::span<const chunk_arrays>(&chunk, 1), args); }

  double grad_sum_of_squares(std::span<const chunk_arrays> chunks) {
    check_unbound("grad_sum_of_squares");
    synchronized_after("cuda_adam::grad_sum_of_squares", [&] {
      upload_table(chunks, false);
      launch_squares();
      CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(&host_state_->sum_of_squares, &state_->sum_of_squares, sizeof(double),
                                         cudaMemcpyDeviceToHost, stream_),
                         "cuda_adam::grad_sum_of_squares");
    });
    return host_state_->sum_of_squares;
  }

  // ---- device-driven (graph-capturable) mixed precision ----

  /// Fixes the chunks, the precision options and the learning-rate schedule (lr of update t is
  /// schedule[min(t, size) - 1]) for enqueue_step(); resets the device state (step count, loss scale). Synchronous;
  /// call outside graph capture.
  void bind(std::span<const chunk_arrays> chunks, const precision_options& options, std::span<const float> lr_schedule) {
    if (lr_schedule.empty()) throw error(error_code::invalid_argument, "cuda_adam::bind: empty learning-rate schedule");
    if (!(options.max_grad_norm >= 0.0f))
      throw error(error_code::invalid_argument, "cuda_adam::bind: max_grad_norm must be >= 0");
    const loss_scaler validated(options.loss_scaling.value_or(loss_scaler_config{}));  // throws on bad settings
    synchronized_after("cuda_adam::bind (chunk table upload)", [&] { upload_table(chunks, true); });
    settings_ = {config_, options.max_grad_norm, options.loss_scaling ? 1 : 0, validated.config(),
                 (options.max_grad_norm > 0.0f || options.loss_scaling) ? 1 : 0};
    cudaFree(lr_schedule_);
    lr_schedule_ = nullptr;
    allocate(reinterpret_cast<void**>(&lr_schedule_), lr_schedule.size_bytes(), false);
    schedule_length_ = lr_schedule.size();
    CHUNKWISE_CUDA_TRY(cudaMemcpy(lr_schedule_, lr_schedule.data(), lr_schedule.size_bytes(),
                                        cudaMemcpyHostToDevice),
                             "cuda_adam::bind (learning-rate schedule)");
    *host_state_ = detail::cuda_kernels::device_state{};
    host_state_->loss_scale = options.loss_scaling ? validated.scale() : 1.0f;  // no scaling: the loss as it is
    CHUNKWISE_CUDA_TRY(cudaMemcpy(state_, host_state_, sizeof(detail::cuda_kernels::device_state), cudaMemcpyHostToDevice),
                             "cuda_adam::bind (state)");
    bound_ = true;
  }

  /// Enqueues one mixed-precision step of the bound chunks on the stream: kernels only (plus whatever `reduce`
  /// enqueues), no host synchronisation, no allocation; capturable in a CUDA graph.
  template <class DeviceReduce = no_device_reduction>
  void enqueue_step(DeviceReduce&& reduce = {}) {
    if (!bound_) throw error(error_code::illegal_state, "cuda_adam::enqueue_step before bind()");
    if (settings_.need_norm) {
      launch_squares();
      reduce(&state_->sum_of_squares, stream_);
    }
    detail::cuda_kernels::decide_kernel<<<1, 32, 0, stream_>>>(state_, settings_, lr_schedule_, schedule_length_);
    CHUNKWISE_CUDA_TRY(cudaGetLastError(), "cuda_adam::enqueue_step (decide kernel launch)");
    launch_update();
  }

  /// The device state after the last step (synchronises the stream: for logging, not for the hot path).
  step_report read_report() {
    CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(host_state_, state_, sizeof(detail::cuda_kernels::device_state),
                                             cudaMemcpyDeviceToHost, stream_),
                             "cuda_adam::read_report");
    done_.wait_for_stream(stream_, "cuda_adam::read_report");
    step_report report;
    report.skipped = host_state_->skipped != 0;
    report.grad_norm = host_state_->grad_norm;
    report.clip_coefficient = report.skipped ? 1.0f : host_state_->clip_coefficient;
    report.loss_scale = host_state_->loss_scale;  // the scale for the next backward
    report.step = host_state_->steps;
    return report;
  }

  /// Where the current loss scale lives, for a captured training step that scales its loss on the device.
  [[nodiscard]] const float* device_loss_scale() const noexcept { return &state_->loss_scale; }

 private:
  void release() noexcept {  // null pointers are fine for both calls
    cudaFree(table_);
    cudaFree(partials_);
    cudaFree(state_);
    cudaFree(lr_schedule_);
    cudaFreeHost(host_table_);
    cudaFreeHost(host_state_);
  }

  // Runs `queue` (work on the stream reading or writing the pinned host table and state), then waits for the stream
  // (asleep: the runtime's optimizer thread calls this beside the CPU Adam's threads), also when `queue` throws: the
  // host copies are free for the next call's writes once this returns.
  template <class Queue>
  void synchronized_after(const char* context, Queue&& queue) {
    try {
      queue();
    } catch (...) {
      (void)cudaStreamSynchronize(stream_);
      throw;
    }
    done_.wait_for_stream(stream_, context);
  }

  // The host-driven calls would overwrite the bound chunk table and device state (step count, loss scale).
  void check_unbound(const char* call) const {
    if (bound_)
      throw error(error_code::illegal_state, std::string("cuda_adam::") + call + " after bind(): a bound optimizer "
                                             "runs enqueue_step() only (use another cuda_adam for host-driven steps)");
  }

  void allocate(void** where, std::size_t bytes, bool pinned) {
    const cudaError_t status = pinned ? cudaMallocHost(where, bytes) : cudaMalloc(where, bytes);
    if (status != cudaSuccess)
      throw_error(error_code::out_of_memory, std::string("cuda_adam: ") + (pinned ? "cudaMallocHost" : "cudaMalloc") +
                                                 " of " + std::to_string(bytes) + " bytes failed with " +
                                                 cudaGetErrorName(status));
  }

  void upload_table(std::span<const chunk_arrays> chunks, bool for_update) {
    if (chunks.size() > max_chunks_)
      throw error(error_code::invalid_argument, "cuda_adam: " + std::to_string(chunks.size()) +
                                                    " chunks, the table holds " + std::to_string(max_chunks_) +
                                                    " (construct with a larger max_chunks)");
    const auto code = [](dtype t) -> std::uint8_t {
      return t == dtype::fp32 ? detail::cuda_kernels::f32 : t == dtype::bf16 ? detail::cuda_kernels::b16 : t == dtype::fp16 ? detail::cuda_kernels::f16 : 0;
    };
    const auto aligned = [](const void* p, std::size_t bytes) {
      return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
    };
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      const chunk_arrays& c = chunks[k];
      const std::string where = "cuda_adam: chunk " + std::to_string(k) + " (" + std::to_string(c.count) + " elements)";
      if (c.count > 0 && c.grad == nullptr) throw error(error_code::invalid_argument, where + " has no gradients");
      if (c.count > 0 && for_update && (c.master == nullptr || c.moment1 == nullptr || c.moment2 == nullptr))
        throw error(error_code::invalid_argument, where + " lacks master weights or a moment array");
      const std::uint8_t grad = code(c.grad_type);
      const std::uint8_t working = c.working == nullptr ? detail::cuda_kernels::none : code(c.working_type);
      if (grad == 0) throw error(error_code::invalid_argument, where + ": gradients must be fp32, bf16 or fp16");
      if (c.working != nullptr && working != detail::cuda_kernels::b16 && working != detail::cuda_kernels::f16)
        throw error(error_code::invalid_argument, where + ": the working copy must be bf16 or fp16");
      const std::size_t grad_bytes = grad == detail::cuda_kernels::f32 ? 16 : 8;
      const bool vectorized = aligned(c.master, 16) && aligned(c.moment1, 16) && aligned(c.moment2, 16) &&
                              aligned(c.grad, grad_bytes) && aligned(c.working, 8);
      host_table_[k] = {c.master, c.grad, c.moment1, c.moment2, c.working, c.count, grad, working, vectorized};
    }
    chunks_ = static_cast<int>(chunks.size());
    // Queued only: every caller waits for the stream before it returns (synchronized_after), so the pinned table is
    // not written again while this copy may still read it; the kernels after it on the stream see the new table.
    CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(table_, host_table_, chunks.size() * sizeof(detail::cuda_kernels::device_chunk),
                                       cudaMemcpyHostToDevice, stream_),
                       "cuda_adam (chunk table upload)");
  }

  void launch_squares() {
    detail::cuda_kernels::squares_kernel<<<blocks_, detail::cuda_kernels::block_threads, 0, stream_>>>(table_, chunks_, partials_);
    CHUNKWISE_CUDA_TRY(cudaGetLastError(), "cuda_adam (squares kernel launch)");
    detail::cuda_kernels::fold_kernel<<<1, detail::cuda_kernels::block_threads, 0, stream_>>>(partials_, blocks_, &state_->sum_of_squares);
    CHUNKWISE_CUDA_TRY(cudaGetLastError(), "cuda_adam (fold kernel launch)");
  }

  void launch_update() {
    detail::cuda_kernels::adam_kernel<<<blocks_, detail::cuda_kernels::block_threads, 0, stream_>>>(table_, chunks_, state_);
    CHUNKWISE_CUDA_TRY(cudaGetLastError(), "cuda_adam (update kernel launch)");
  }

  adam_config config_;
  cudaStream_t stream_;
  std::size_t max_chunks_;
  int blocks_ = 0;
  int chunks_ = 0;
  detail::cuda_kernels::device_chunk* table_ = nullptr;
  detail::cuda_kernels::device_chunk* host_table_ = nullptr;
  double* partials_ = nullptr;
  detail::cuda_kernels::device_state* state_ = nullptr;
  detail::cuda_kernels::device_state* host_state_ = nullptr;
  float* lr_schedule_ = nullptr;
  unsigned long long schedule_length_ = 0;
  detail::cuda_kernels::device_settings settings_{};
  bool bound_ = false;
  host_wait_event done_{"cuda_adam constructor (event)"};
};

static_assert(chunk_optimizer<cuda_adam>);

}  // namespace chunkwise::optim

#endif  // CHUNKWISE_HAS_CUDA
