#pragma once
// Adam and AdamW over chunk memory on the CPU: one streaming pass per chunk reads gradient, master weights and
// both moments and writes them back (28 bytes per fp32 parameter, 30 with a bf16/fp16 working copy), vectorised
// (AVX-512, AVX2 or scalar, chosen at run time) and split over a persistent thread pool.
#include <chunkwise/optim/concepts.hpp>
#include <chunkwise/optim/detail/cpu_engine.hpp>
#include <chunkwise/optim/hyperparameters.hpp>

#include <cstddef>
#include <span>

namespace chunkwise::optim {

class cpu_adam {
 public:
  using config_type = adam_config;
  static constexpr std::size_t state_arrays = 2;  // exp_avg, exp_avg_sq

  explicit cpu_adam(const adam_config& config = {}, const cpu_options& options = {})
      : config_(config), engine_(options) {
    validate(config_);
  }

  [[nodiscard]] const adam_config& config() const noexcept { return config_; }
  [[nodiscard]] cpu_isa isa() const noexcept { return engine_.isa(); }
  [[nodiscard]] unsigned threads() const noexcept { return engine_.threads(); }

  /// One Adam/AdamW update of every chunk in place (see adam_coefficients for the element formula). Chunks are
  /// validated before any memory is touched.
  void step(std::span<const chunk_arrays> chunks, const step_args& args) {
    validate(args);
    for (std::size_t c = 0; c < chunks.size(); ++c) detail::check_chunk(chunks[c], c, "adam", true, true, true);
    const adam_coefficients coefficients = make_coefficients(config_, args);
    const cpu_isa isa = engine_.isa();
    engine_.for_each_tile(chunks, [&](const chunk_arrays& chunk, std::size_t begin, std::size_t end) noexcept {
      detail::visit_types(chunk, [&](const auto* grad, auto* working) noexcept {
#if CHUNKWISE_OPTIM_X86
        if (isa == cpu_isa::avx512)
          return detail::avx512::adam(coefficients, chunk.master, grad, chunk.moment1, chunk.moment2, working, begin,
                                      end);
        if (isa == cpu_isa::avx2)
          return detail::avx2::adam(coefficients, chunk.master, grad, chunk.moment1, chunk.moment2, working, begin,
                                    end);
#endif
        detail::adam_scalar(coefficients, chunk.master, grad, chunk.moment1, chunk.moment2, working, begin, end);
      });
    });
  }
  void step(const chunk_arrays& chunk, const step_args& args) { step(std::span<const chunk_arrays>(&chunk, 1), args); }

  /// Sum of grad^2 over all chunks (as stored, i.e. loss-scaled), in double and in a fixed order: the same value
  /// for every thread count and instruction set. Infinite or NaN when any gradient is.
  double grad_sum_of_squares(std::span<const chunk_arrays> chunks) {
    for (std::size_t c = 0; c < chunks.size(); ++c) detail::check_chunk(chunks[c], c, "adam", false);
    return engine_.sum_of_squares(chunks);
  }

 private:
  adam_config config_;
  detail::cpu_engine engine_;
};

static_assert(chunk_optimizer<cpu_adam>);

}  // namespace chunkwise::optim
