#pragma once
// How the CPU optimizers run: threads (or worker threads to share), instruction set, tile size.
#include <chunkwise/optim/cpu_isa.hpp>
#include <chunkwise/core/worker_threads.hpp>

#include <cstddef>

namespace chunkwise::optim {

/// How the CPU optimizers run. `tile_elements` is the unit of work handed to a thread: 32 Ki elements are 128 KiB
/// per fp32 array, so the 4-5 streams of a tile stay within a core's L2 while it is processed. A multiple of 16,
/// so tiles start where the 16-lane sums start. Updates never depend on it, on `threads` or on `isa`; the gradient
/// sum of squares (summed per tile, then tile after tile) depends on it alone.
/// `threads` counts the calling thread, which works too: `threads = 4` starts 3 workers.
/// `pool`: threads the caller already has (shared with other work; one parallel_for at a time); when set,
/// `threads` is ignored, the optimizer starts none of its own and runs on `pool->parallel_width()` threads.
struct cpu_options {
  unsigned threads = 1;
  cpu_isa isa = cpu_isa::best;
  std::size_t tile_elements = std::size_t{1} << 15;
  worker_threads* pool = nullptr;
};

}  // namespace chunkwise::optim
