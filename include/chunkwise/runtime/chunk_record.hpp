#pragma once
// chunk_record<Comm>: everything the runtime knows about one chunk on one rank, in one place: its geometry, its
// checked life cycle, the buffers it holds on the device, and the operations in flight for it (the fetch that makes
// it `fetching`, the gradient reduction of `grad_pending`, the optimizer update of `reduced`). Its home parameters
// and optimizer moments live in the home storage (runtime/home_storage.hpp), found by its index.
#include <chunkwise/collective/pending.hpp>
#include <chunkwise/collective/shard.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/runtime/chunk_state.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>

#include <cstddef>
#include <cstdint>
#include <future>
#include <span>
#include <string>

namespace chunkwise {

template <communicator Comm>
struct chunk_record {
  std::uint32_t index = 0;
  std::size_t full_elements = 0;  // the gathered chunk (padding included)
  std::size_t home_elements = 0;  // the parameters this rank keeps between uses
  shard_range owned;              // the elements this rank's optimizer updates
  bool shards_parameters = false; // the home is this rank's shard (ZeRO-3, hybrid)
  chunk_life life{0};

  std::byte* compute = nullptr;        // the working parameters the trainer reads while the chunk is in use
  bool home_held = false;              // the home storage lent its device copy (a cache block) to this chunk
  detail::tier_buffer full;            // the gathered copy (sharded parameters)
  detail::tier_buffer gradient;        // the full-chunk gradient accumulator, from the first backward use
  detail::tier_buffer owned_gradient;  // the reduced gradient of the owned elements (where the states live)
                                       // (all three in the compute type: fp32, bf16 or fp16)
  bool states_on_device = true;

  pending<Comm> fetch;      // `fetching`: the all-gather of the home shards into `full`
  pending<Comm> reduction;  // `grad_pending`: the reduce(-scatter) of `gradient` into `owned_gradient`
  std::future<void> update; // `reduced`: the optimizer update running beside backward (empty: none started)
  std::uint32_t micro_batches_done = 0;  // backward completions since the last reduction (gradient accumulation)

  // Element ranges inside the chunk: the home parameters [home_first, home_end) without padding, the owned
  // elements [owned.offset, owned_end).
  [[nodiscard]] std::size_t home_first() const noexcept { return shards_parameters ? owned.offset : 0; }
  [[nodiscard]] std::size_t home_end() const noexcept { return shards_parameters ? owned_end() : full_elements; }
  [[nodiscard]] std::size_t owned_end() const noexcept { return owned.offset + owned.valid; }
};

}  // namespace chunkwise

namespace chunkwise::detail {

/// step() needs every chunk's gradient handed over: after the iteration's last backward pass each is grad_pending
/// (or already reduced).
template <communicator Comm>
void require_backward_done(std::span<const chunk_record<Comm>> chunks) {
  for (const auto& b : chunks)
    if (b.life.state() != chunk_state::grad_pending && b.life.state() != chunk_state::reduced)
      raise(error_code::illegal_state, "runtime::step: chunk " + std::to_string(b.index) + " is " +
                                           std::string(to_string(b.life.state())) +
                                           ", not grad_pending: run every backward pass (acquire and release) "
                                           "before step()");
}

/// The life-cycle counts of all chunks together.
template <communicator Comm>
chunk_statistics total_statistics(std::span<const chunk_record<Comm>> chunks) {
  chunk_statistics total;
  for (const auto& b : chunks) total += b.life.statistics();
  return total;
}

}  // namespace chunkwise::detail
