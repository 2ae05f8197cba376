#pragma once
// shard_grads (ZeRO-2): parameters replicated; each chunk's gradient reduce-scattered so that every rank keeps the
// gradient, optimizer state and master weights of its shard only; after the step the updated shards are
// all-gathered back into every rank's parameters. Same bytes on the wire as replicated (a reduce-scatter plus an
// all-gather is an all-reduce), 1/n of the gradient and optimizer memory.
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/collective/concepts.hpp>
#include <chunkwise/collective/shard.hpp>
#include <chunkwise/comm/concepts.hpp>

#include <cstddef>
#include <string_view>

namespace chunkwise {

struct shard_grads {
  static constexpr std::string_view name = "shard_grads";
  static constexpr bool shards_parameters = false;
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_optimizer_state = true;
  static constexpr int group_size = 0;  // the whole world

  static constexpr bool supports(int ranks) noexcept { return ranks >= 1; }

  /// Parameters: the padded chunk (the all-gather of the update writes whole shards). Gradients and optimizer state
  /// (master weights included): one shard.
  static constexpr byte_count bytes_per_rank(tensor_role role, byte_count chunk_bytes, std::size_t chunks,
                                             int ranks) {
    return byte_count{chunks} *
           (role == tensor_role::parameter ? padded_chunk_bytes(chunk_bytes, ranks) : shard_bytes(chunk_bytes, ranks));
  }
  /// The whole (padded) gradient of the chunk being reduced, before it is scattered.
  static constexpr byte_count working_bytes(tensor_role role, byte_count chunk_bytes, int ranks) {
    return role == tensor_role::gradient ? padded_chunk_bytes(chunk_bytes, ranks) : 0;
  }

  static constexpr step_traffic traffic(byte_count parameter_chunk_bytes, byte_count gradient_chunk_bytes,
                                        std::size_t chunks, int ranks) {
    return {.all_gather =
                byte_count{chunks} * detail::ring_gather_bytes(padded_chunk_bytes(parameter_chunk_bytes, ranks), ranks),
            .reduce_scatter =
                byte_count{chunks} * detail::ring_gather_bytes(padded_chunk_bytes(gradient_chunk_bytes, ranks), ranks)};
  }

  template <communicator Comm>
  static chunk_collectives<shard_grads, Comm> bind(Comm& comm) {
    return chunk_collectives<shard_grads, Comm>(comm);
  }
};

static_assert(collective_strategy<shard_grads>);

}  // namespace chunkwise
