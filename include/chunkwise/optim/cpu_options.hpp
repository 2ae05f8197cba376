#pragma once
// How the CPU optimizers run: threads (or a pool to share), instruction set, tile size.
#include <chunkwise/optim/cpu_isa.hpp>
#include <chunkwise/optim/thread_pool.hpp>

#include <cstddef>

namespace chunkwise::inline CHUNKWISE_ABI::optim {

/// How the CPU optimizers run. `tile_elements` is the unit of work handed to a thread: 32 Ki elements are 128 KiB
/// per fp32 array, so the 4-5 streams of a tile stay within a core's L2 while it is processed. A multiple of 16,
/// so tiles start where the 16-lane sums start. Updates never depend on it, on `threads` or on `isa`; the gradient
/// sum of squares (summed per tile, then tile after tile) depends on it alone.
/// `pool`: threads the caller already has (shared with other work; one parallel_for at a time); when set,
/// `threads` is ignored and the optimizer starts none of its own.
struct cpu_options {
  unsigned threads = 1;
  cpu_isa isa = cpu_isa::best;
  std::size_t tile_elements = std::size_t{1} << 15;
  thread_pool* pool = nullptr;
};

}  // namespace chunkwise::optim
