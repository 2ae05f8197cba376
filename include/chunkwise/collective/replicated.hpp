#pragma once
// replicated (plain data parallel): every rank holds every chunk's parameters, gradients and optimizer state;
// each chunk's gradient is all-reduced as one bucket once its backward is done.
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/collective/concepts.hpp>
#include <chunkwise/comm/concepts.hpp>

#include <cstddef>
#include <string_view>

namespace chunkwise {

struct replicated {
  static constexpr std::string_view name = "replicated";
  static constexpr bool shards_parameters = false;
  static constexpr bool shards_gradients = false;
  static constexpr bool shards_optimizer_state = false;
  static constexpr int group_size = 0;  // the whole world

  static constexpr bool supports(int ranks) noexcept { return ranks >= 1; }

  static constexpr byte_count bytes_per_rank(tensor_role, byte_count chunk_bytes, std::size_t chunks, int) noexcept {
    return byte_count{chunks} * chunk_bytes;
  }
  static constexpr byte_count working_bytes(tensor_role, byte_count, int) noexcept { return 0; }

  /// One all-reduce of every gradient chunk: 2 (n-1)/n of it per rank.
  static constexpr step_traffic traffic(byte_count, byte_count gradient_chunk_bytes, std::size_t chunks,
                                        int ranks) noexcept {
    return {.all_reduce = byte_count{chunks} * detail::ring_all_reduce_bytes(gradient_chunk_bytes, ranks)};
  }

  template <communicator Comm>
  static chunk_collectives<replicated, Comm> bind(Comm& comm) {
    return chunk_collectives<replicated, Comm>(comm);
  }
};

static_assert(collective_strategy<replicated>);

}  // namespace chunkwise
