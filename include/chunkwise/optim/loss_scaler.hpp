#pragma once
// Dynamic loss scaling for fp16 training (as torch.cuda.amp.GradScaler): the loss is multiplied by `scale()`
// before backward; a step whose gradients overflowed is skipped and the scale backed off; after
// `growth_interval` good steps in a row the scale grows.
#include <chunkwise/core/error.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace chunkwise::optim {

struct loss_scaler_config {
  float initial_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  std::uint32_t growth_interval = 2000;
  float min_scale = 1.0f;            // backing off never goes below
  float max_scale = 16777216.0f;     // 2^24: growth never goes above
};

class loss_scaler {
 public:
  explicit loss_scaler(const loss_scaler_config& config = {}) : config_(config), scale_(config.initial_scale) {
    const auto fail = [](const std::string& what) { throw error(error_code::invalid_argument, "loss_scaler: " + what); };
    if (!(config.growth_factor > 1.0f)) fail("growth_factor must be > 1, got " + std::to_string(config.growth_factor));
    if (!(config.backoff_factor > 0.0f && config.backoff_factor < 1.0f))
      fail("backoff_factor must lie in (0, 1), got " + std::to_string(config.backoff_factor));
    if (config.growth_interval == 0) fail("growth_interval must be >= 1");
    if (!(config.min_scale > 0.0f && config.min_scale <= config.initial_scale &&
          config.initial_scale <= config.max_scale))
      fail("needs 0 < min_scale <= initial_scale <= max_scale, got " + std::to_string(config.min_scale) +
           " <= " + std::to_string(config.initial_scale) + " <= " + std::to_string(config.max_scale));
  }

  [[nodiscard]] float scale() const noexcept { return scale_; }
  [[nodiscard]] std::uint32_t good_steps() const noexcept { return good_steps_; }
  [[nodiscard]] const loss_scaler_config& config() const noexcept { return config_; }

  /// Records the outcome of one step: on overflow back off (and restart the count of good steps), else count the
  /// step and grow once `growth_interval` good steps have passed in a row.
  void update(bool overflow) noexcept {
    if (overflow) {
      scale_ = std::max(scale_ * config_.backoff_factor, config_.min_scale);
      good_steps_ = 0;
      return;
    }
    if (++good_steps_ == config_.growth_interval) {
      scale_ = std::min(scale_ * config_.growth_factor, config_.max_scale);
      good_steps_ = 0;
    }
  }

  /// Restores a checkpointed state.
  void restore(float scale, std::uint32_t good_steps) {
    if (!(scale > 0.0f) || good_steps >= config_.growth_interval)
      throw error(error_code::invalid_argument, "loss_scaler: cannot restore scale " + std::to_string(scale) +
                                                    " with " + std::to_string(good_steps) + " good steps (interval " +
                                                    std::to_string(config_.growth_interval) + ")");
    scale_ = scale;
    good_steps_ = good_steps;
  }

 private:
  loss_scaler_config config_;
  float scale_;
  std::uint32_t good_steps_ = 0;
};

}  // namespace chunkwise::optim
