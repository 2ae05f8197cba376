#pragma once
// SGD with momentum (torch.optim.SGD semantics: L2 weight decay, dampening, Nesterov) over chunk memory on the
// CPU, with the same vector paths, threads and working-copy write-back as cpu_adam.
#include <chunkwise/optim/concepts.hpp>
#include <chunkwise/optim/detail/cpu_engine.hpp>
#include <chunkwise/optim/hyperparameters.hpp>

#include <cstddef>
#include <span>

namespace chunkwise::optim {

class cpu_sgd {
 public:
  using config_type = sgd_config;
  static constexpr std::size_t state_arrays = 1;  // the momentum buffer (moment1); unused when momentum is 0

  explicit cpu_sgd(const sgd_config& config = {}, const cpu_options& options = {}) : config_(config), engine_(options) {
    validate(config_);
  }

  [[nodiscard]] const sgd_config& config() const noexcept { return config_; }
  [[nodiscard]] cpu_isa isa() const noexcept { return engine_.isa(); }

  /// One SGD update of every chunk in place; step 1 initialises the momentum buffer with the gradient.
  void step(std::span<const chunk_arrays> chunks, const step_args& args) {
    validate(args);
    const bool momentum = config_.momentum != 0.0f;
    for (std::size_t c = 0; c < chunks.size(); ++c) detail::check_chunk(chunks[c], c, "sgd", true, momentum);
    const sgd_coefficients coefficients = make_coefficients(config_, args);
    const cpu_isa isa = engine_.isa();
    engine_.for_each_tile(chunks, [&](const chunk_arrays& chunk, std::size_t begin, std::size_t end) noexcept {
      detail::visit_types(chunk, [&](const auto* grad, auto* working) noexcept {
#if CHUNKWISE_OPTIM_X86
        if (isa == cpu_isa::avx512)
          return detail::avx512::sgd(coefficients, chunk.master, grad, chunk.moment1, working, begin, end);
        if (isa == cpu_isa::avx2)
          return detail::avx2::sgd(coefficients, chunk.master, grad, chunk.moment1, working, begin, end);
#endif
        detail::sgd_scalar(coefficients, chunk.master, grad, chunk.moment1, working, begin, end);
      });
    });
  }
  void step(const chunk_arrays& chunk, const step_args& args) { step(std::span<const chunk_arrays>(&chunk, 1), args); }

  double grad_sum_of_squares(std::span<const chunk_arrays> chunks) {
    for (std::size_t c = 0; c < chunks.size(); ++c) detail::check_chunk(chunks[c], c, "sgd", false);
    return engine_.sum_of_squares(chunks);
  }

 private:
  sgd_config config_;
  detail::cpu_engine engine_;
};

static_assert(chunk_optimizer<cpu_sgd>);

}  // namespace chunkwise::optim
