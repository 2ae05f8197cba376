#pragma once
// What the CPU optimizers share: validation of chunk views, the split of chunks into cache-sized tiles handed to
// the thread pool, dispatch on element types and instruction set, and the deterministic gradient sum of squares.
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/optim/concepts.hpp>
#include <chunkwise/optim/cpu_isa.hpp>
#include <chunkwise/optim/cpu_options.hpp>
#include <chunkwise/optim/detail/avx2_kernels.hpp>
#include <chunkwise/optim/detail/avx512_kernels.hpp>
#include <chunkwise/optim/detail/scalar_kernels.hpp>
#include <chunkwise/core/worker_threads.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace chunkwise::optim {

namespace detail {

/// `for_update`: the chunk will be stepped (needs master weights and the moments asked for), else only its
/// gradients are read.
inline void check_chunk(const chunk_arrays& chunk, std::size_t index, const char* optimizer, bool for_update,
                        bool needs_moment1 = false, bool needs_moment2 = false) {
  const auto fail = [&](const std::string& what) {
    throw error(error_code::invalid_argument,
                std::string(optimizer) + ": chunk " + std::to_string(index) + " (" + std::to_string(chunk.count) +
                    " elements) " + what);
  };
  if (chunk.count == 0) return;
  if (chunk.grad == nullptr) fail("has no gradients");
  if (for_update && chunk.master == nullptr) fail("has no master weights");
  if (needs_moment1 && chunk.moment1 == nullptr) fail("has no first-moment (moment1) array");
  if (needs_moment2 && chunk.moment2 == nullptr) fail("has no second-moment (moment2) array");
  if (chunk.grad_type != dtype::fp32 && chunk.grad_type != dtype::bf16 && chunk.grad_type != dtype::fp16)
    fail("has gradients of type " + std::string(to_string(chunk.grad_type)) + "; fp32, bf16 or fp16 are supported");
  if (chunk.working != nullptr && chunk.working_type != dtype::bf16 && chunk.working_type != dtype::fp16)
    fail("asks for a working copy of type " + std::string(to_string(chunk.working_type)) +
         "; bf16 or fp16 are supported (or no copy: working = nullptr)");
}

/// Calls f(grad, working) with the chunk's arrays as typed pointers (working is no_copy* when there is none).
/// The chunk must have passed check_chunk.
template <class F>
void visit_types(const chunk_arrays& chunk, F&& f) noexcept {
  const auto with_grad = [&](const auto* grad) {
    if (chunk.working == nullptr) f(grad, static_cast<no_copy*>(nullptr));
    else if (chunk.working_type == dtype::bf16) f(grad, static_cast<bf16*>(chunk.working));
    else f(grad, static_cast<fp16*>(chunk.working));
  };
  if (chunk.grad_type == dtype::fp32) with_grad(static_cast<const float*>(chunk.grad));
  else if (chunk.grad_type == dtype::bf16) with_grad(static_cast<const bf16*>(chunk.grad));
  else with_grad(static_cast<const fp16*>(chunk.grad));
}

class cpu_engine {
 public:
  explicit cpu_engine(const cpu_options& options)
      : own_pool_(options.pool != nullptr ? nullptr : std::make_unique<worker_threads>(workers_for(options.threads))),
        pool_(options.pool != nullptr ? options.pool : own_pool_.get()),
        isa_(resolve(options.isa)),
        tile_(options.tile_elements) {
    if (tile_ == 0 || tile_ % sum_lanes != 0)
      throw error(error_code::invalid_argument, "cpu optimizer: tile_elements must be a positive multiple of 16, got " +
                                                    std::to_string(tile_));
  }

  [[nodiscard]] cpu_isa isa() const noexcept { return isa_; }
  [[nodiscard]] unsigned threads() const noexcept { return pool_->parallel_width(); }

  /// Runs kernel(chunk, begin, end) over every tile of every chunk, on all threads.
  template <class Kernel>
  void for_each_tile(std::span<const chunk_arrays> chunks, Kernel&& kernel) {
    split(chunks);
    pool_->parallel_for(tiles_.size(), [&](std::size_t t) noexcept {
      const tile& piece = tiles_[t];
      kernel(chunks[piece.chunk], piece.begin, piece.end);
    });
  }

  double sum_of_squares(std::span<const chunk_arrays> chunks) {
    split(chunks);
    partials_.assign(tiles_.size(), 0.0);
    pool_->parallel_for(tiles_.size(), [&](std::size_t t) noexcept {
      const tile& piece = tiles_[t];
      visit_types(chunks[piece.chunk], [&](const auto* grad, auto*) noexcept {
        partials_[t] = run_sum_of_squares(grad, piece.begin, piece.end);
      });
    });
    double total = 0.0;  // tiles in order: the same sum for every thread count
    for (const double partial : partials_) total += partial;
    return total;
  }

 private:
  struct tile {
    std::size_t chunk, begin, end;
  };

  void split(std::span<const chunk_arrays> chunks) {
    tiles_.clear();
    for (std::size_t c = 0; c < chunks.size(); ++c)
      for (std::size_t begin = 0; begin < chunks[c].count; begin += tile_)
        tiles_.push_back({c, begin, std::min(chunks[c].count, begin + tile_)});
  }

  template <class Grad>
  double run_sum_of_squares(const Grad* grad, std::size_t begin, std::size_t end) const noexcept {
#if CHUNKWISE_OPTIM_X86
    if (isa_ == cpu_isa::avx512) return avx512::sum_of_squares(grad, begin, end);
    if (isa_ == cpu_isa::avx2) return avx2::sum_of_squares(grad, begin, end);
#endif
    return sum_of_squares_scalar(grad, begin, end);
  }

  static std::size_t workers_for(unsigned threads) {
    if (threads == 0) throw error(error_code::invalid_argument, "cpu optimizer: needs at least 1 thread, got 0");
    return threads - 1;  // the caller is one of them
  }

  std::unique_ptr<worker_threads> own_pool_;
  worker_threads* pool_;
  cpu_isa isa_;
  std::size_t tile_;
  std::vector<tile> tiles_;
  std::vector<double> partials_;
};

}  // namespace detail
}  // namespace chunkwise::optim
