#pragma once
// The optimizer seam: what a chunk's optimizer state looks like in memory, the per-step arguments the trainer
// supplies, and the concept every optimizer (CPU SIMD, fused CUDA) models.
#include <chunkwise/core/dtype.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

namespace chunkwise::optim {

/// One chunk's optimizer view: parallel arrays of `count` elements in the chunk's home memory. The optimizer
/// updates them in place, in one pass.
///  - `master`:  fp32 master weights.
///  - `grad`:    gradients in `grad_type` (fp32, bf16 or fp16; fp16 gradients are usually loss-scaled).
///  - `moment1`: fp32 first moment (Adam's exp_avg; SGD's momentum buffer, may be null when momentum is 0).
///  - `moment2`: fp32 second moment (Adam's exp_avg_sq; unused by SGD).
///  - `working`: optional 16-bit working copy of the weights (`working_type` bf16 or fp16), rewritten from the
///               updated master weights in the same pass, rounded to nearest even. Null: no write-back.
struct chunk_arrays {
  float* master = nullptr;
  const void* grad = nullptr;
  dtype grad_type = dtype::fp32;
  float* moment1 = nullptr;
  float* moment2 = nullptr;
  void* working = nullptr;
  dtype working_type = dtype::bf16;
  std::size_t count = 0;
};

/// What changes from step to step, supplied by the trainer (its learning-rate schedule) or the mixed-precision
/// driver (`grad_scale` = clip coefficient / loss scale, multiplied into every gradient element before use).
struct step_args {
  float lr = 1e-3f;
  std::uint64_t step = 1;  // 1 for the first update; bias correction uses it
  float grad_scale = 1.0f;
};

/// Sums a value over all ranks in place (an all-reduce of one double). The communicator provides it; one rank
/// needs nothing.
template <class R>
concept rank_reduction = std::invocable<R&, double&>;

/// The reduction of a single-rank run: the local value is already the global one.
struct single_rank {
  void operator()(double&) const noexcept {}
};
static_assert(rank_reduction<single_rank>);

/// An optimizer over chunk memory.
///  - `state_arrays`: fp32 state arrays per parameter besides the master weights (Adam 2, SGD with momentum 1),
///    what the planner counts as optimizer-state bytes.
///  - `step(chunks, args)`: one update of every chunk, in place; returns when the memory is updated.
///  - `grad_sum_of_squares(chunks)`: sum over all elements of grad^2 (of the gradients as stored, i.e. still
///    loss-scaled), in double; infinite or NaN when any gradient is. The input of global-norm clipping and the
///    fp16 overflow check. Deterministic: the same for every thread count.
template <class O>
concept chunk_optimizer = requires(O& optimizer, std::span<const chunk_arrays> chunks, const step_args& args) {
  typename O::config_type;
  { O::state_arrays } -> std::convertible_to<std::size_t>;
  { optimizer.config() } -> std::convertible_to<typename O::config_type>;
  optimizer.step(chunks, args);
  { optimizer.grad_sum_of_squares(chunks) } -> std::same_as<double>;
};

}  // namespace chunkwise::optim
