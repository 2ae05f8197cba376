#pragma once
// One training step's optimizer half, in mixed precision: the global gradient norm over all chunks (summed across
// ranks), the fp16 overflow check, dynamic loss scaling, clipping by global norm, then the optimizer update with
// gradients unscaled and clipped in the same pass (grad_scale = clip coefficient / loss scale).
#include <chunkwise/core/error.hpp>
#include <chunkwise/optim/concepts.hpp>
#include <chunkwise/optim/loss_scaler.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace chunkwise::optim {

struct precision_options {
  /// Clip gradients to this global L2 norm (of the unscaled gradients); 0 turns clipping off.
  float max_grad_norm = 0.0f;
  /// Dynamic loss scaling (fp16 training). Off: gradients are used as stored.
  std::optional<loss_scaler_config> loss_scaling;
};

struct step_report {
  bool skipped = false;    // gradients were not finite: no memory was changed
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients before clipping (inf/NaN when skipped;
                           // 0 when neither clipping nor loss scaling asked for it)
  float clip_coefficient = 1.0f;
  float loss_scale = 1.0f;  // the scale these gradients carried
  std::uint64_t step = 0;   // optimizer steps taken so far (a skipped step does not count)
};

/// One step's gradient factor from the global sum of squares of the gradients as stored (loss-scaled): the unscaled
/// norm, whether the step must be skipped (not finite), torch.nn.utils.clip_grad_norm_'s coefficient
/// (max_norm / (norm + 1e-6), never above 1; 1 when max_grad_norm is 0) and what every gradient element is multiplied
/// by (clip coefficient / loss scale). The one place these rules live: mixed_precision_step and the runtime's
/// optimizer stage both use it.
struct step_scaling {
  bool skipped = false;
  double grad_norm = 0.0;
  float clip_coefficient = 1.0f;
  float grad_scale = 1.0f;
};
inline step_scaling scale_step(double sum_of_squares, float loss_scale, float max_grad_norm) {
  step_scaling s;
  s.grad_norm = std::sqrt(sum_of_squares) / static_cast<double>(loss_scale);
  if (!std::isfinite(s.grad_norm)) {
    s.skipped = true;
    return s;
  }
  if (max_grad_norm > 0.0f)
    s.clip_coefficient =
        static_cast<float>(std::min(static_cast<double>(max_grad_norm) / (s.grad_norm + 1e-6), 1.0));
  s.grad_scale = static_cast<float>(static_cast<double>(s.clip_coefficient) / static_cast<double>(loss_scale));
  return s;
}

/// Drives a chunk_optimizer through mixed-precision steps. `Reduce` sums the squared norm across ranks (the
/// communicator's all-reduce of one double); the NaN/inf of an overflow on any rank reaches every rank through it,
/// so all ranks skip together.
template <chunk_optimizer Optimizer, rank_reduction Reduce = single_rank>
class mixed_precision_step {
 public:
  explicit mixed_precision_step(Optimizer& optimizer, const precision_options& options = {}, Reduce reduce = {})
      : optimizer_(&optimizer), options_(options), reduce_(std::move(reduce)) {
    if (!(options.max_grad_norm >= 0.0f))
      throw error(error_code::invalid_argument,
                  "mixed_precision_step: max_grad_norm must be >= 0 (0 = no clipping), got " +
                      std::to_string(options.max_grad_norm));
    if (options.loss_scaling) scaler_.emplace(*options.loss_scaling);
  }

  /// The factor the trainer multiplies its loss by before backward (1 without loss scaling).
  [[nodiscard]] float loss_scale() const noexcept { return scaler_ ? scaler_->scale() : 1.0f; }
  [[nodiscard]] const std::optional<loss_scaler>& scaler() const noexcept { return scaler_; }
  [[nodiscard]] std::optional<loss_scaler>& scaler() noexcept { return scaler_; }
  [[nodiscard]] std::uint64_t steps_taken() const noexcept { return steps_; }
  /// For resuming from a checkpoint: the next update is number `steps + 1`.
  void set_steps_taken(std::uint64_t steps) noexcept { steps_ = steps; }

  /// One step over this rank's chunks with learning rate `lr` (the trainer's schedule). Without clipping or loss
  /// scaling no norm is computed. With them, a non-finite norm skips the update on every rank (and backs off the
  /// loss scale when scaling is on).
  step_report step(std::span<const chunk_arrays> chunks, float lr) {
    step_report report;
    report.loss_scale = loss_scale();
    const bool clipping = options_.max_grad_norm > 0.0f;
    float grad_scale = 1.0f / report.loss_scale;
    if (clipping || scaler_) {
      double sum_of_squares = optimizer_->grad_sum_of_squares(chunks);
      reduce_(sum_of_squares);
      const step_scaling scaling = scale_step(sum_of_squares, report.loss_scale, options_.max_grad_norm);
      report.grad_norm = scaling.grad_norm;
      if (scaling.skipped) {
        if (scaler_) scaler_->update(true);
        report.skipped = true;
        report.step = steps_;
        return report;
      }
      report.clip_coefficient = scaling.clip_coefficient;
      grad_scale = scaling.grad_scale;
    }
    optimizer_->step(chunks, step_args{lr, steps_ + 1, grad_scale});
    ++steps_;
    if (scaler_) scaler_->update(false);
    report.step = steps_;
    return report;
  }

 private:
  Optimizer* optimizer_;
  precision_options options_;
  Reduce reduce_;
  std::optional<loss_scaler> scaler_;
  std::uint64_t steps_ = 0;
};

}  // namespace chunkwise::optim
