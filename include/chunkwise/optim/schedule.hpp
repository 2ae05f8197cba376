#pragma once
// Learning-rate schedules as nanoGPT and llm.c users know them: linear warm-up, then cosine decay to a fraction of
// the peak. A schedule is a function of the step (counting from 1), so the runtime knows each step's rate before
// the step and can start a chunk's update as soon as its gradient is reduced (runtime_options::learning_rate).
#include <chunkwise/core/error.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>

namespace chunkwise::optim {

/// lr(step): peak * step / warmup during the warm-up (steps 1..warmup), then
/// final + (peak - final) * (1 + cos(pi * progress)) / 2 with progress = (step - warmup) / (total - warmup) going
/// from 0 to 1, final = peak * final_fraction (llm.c's learning_rate_decay_frac; 1: constant after warm-up).
struct warmup_cosine {
  float peak = 3e-4f;
  std::uint64_t warmup = 0;
  std::uint64_t total = 1;
  float final_fraction = 1.0f;

  void validate() const {
    if (!(peak > 0.0f) || !std::isfinite(peak))
      throw error(error_code::invalid_argument, "learning rate: the peak must be a positive number, got " +
                                                    std::to_string(peak));
    if (!(final_fraction >= 0.0f && final_fraction <= 1.0f))
      throw error(error_code::invalid_argument, "learning rate: the final fraction must lie in [0, 1], got " +
                                                    std::to_string(final_fraction));
    if (warmup > total)
      throw error(error_code::invalid_argument, "learning rate: " + std::to_string(warmup) +
                                                    " warm-up steps in a run of " + std::to_string(total));
  }

  [[nodiscard]] float operator()(std::uint64_t step) const noexcept {
    if (step <= warmup) return peak * static_cast<float>(step) / static_cast<float>(warmup);
    if (final_fraction == 1.0f || total <= warmup) return peak;
    const double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(total - warmup));
    const double final_rate = static_cast<double>(peak) * final_fraction;
    return static_cast<float>(final_rate + (peak - final_rate) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
  }
};

}  // namespace chunkwise::optim
