#pragma once
// sharded (ZeRO-3): each rank holds one shard of every chunk's parameters, gradients and optimizer state. A chunk is
// all-gathered before use and freed after, so a step gathers it twice (forward, then backward: gathers_per_step),
// and its gradient is reduce-scattered to the owners.
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/collective/concepts.hpp>
#include <chunkwise/collective/shard.hpp>
#include <chunkwise/comm/concepts.hpp>

#include <cstddef>
#include <string_view>

namespace chunkwise {

struct sharded {
  static constexpr std::string_view name = "sharded";
  static constexpr bool shards_parameters = true;
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_optimizer_state = true;
  static constexpr int group_size = 0;  // the whole world
  /// Parameter all-gathers of each chunk per step: forward and backward. A placement that keeps a gathered chunk
  /// between its forward and backward use (the last layers) saves one; the cost model may take that into account.
  static constexpr int gathers_per_step = 2;

  static constexpr bool supports(int ranks) noexcept { return ranks >= 1; }

  static constexpr byte_count bytes_per_rank(tensor_role, byte_count chunk_bytes, std::size_t chunks, int ranks) {
    return byte_count{chunks} * shard_bytes(chunk_bytes, ranks);
  }
  /// The gathered (padded) chunk while it is in use, and the whole gradient of a chunk before it is scattered.
  static constexpr byte_count working_bytes(tensor_role role, byte_count chunk_bytes, int ranks) {
    if (role == tensor_role::optimizer_state) return 0;
    return padded_chunk_bytes(chunk_bytes, ranks);
  }

  static constexpr step_traffic traffic(byte_count parameter_chunk_bytes, byte_count gradient_chunk_bytes,
                                        std::size_t chunks, int ranks) {
    return {.all_gather = byte_count{chunks} * gathers_per_step *
                          detail::ring_gather_bytes(padded_chunk_bytes(parameter_chunk_bytes, ranks), ranks),
            .reduce_scatter =
                byte_count{chunks} * detail::ring_gather_bytes(padded_chunk_bytes(gradient_chunk_bytes, ranks), ranks)};
  }

  template <communicator Comm>
  static chunk_collectives<sharded, Comm> bind(Comm& comm) {
    return chunk_collectives<sharded, Comm>(comm);
  }
};

static_assert(collective_strategy<sharded>);

}  // namespace chunkwise
