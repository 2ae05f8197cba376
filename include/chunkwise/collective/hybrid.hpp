#pragma once
// hybrid<G> (HSDP): ZeRO-3 within groups of G consecutive ranks (one machine, fast links), replicated across the
// groups: a chunk is gathered within the group, its gradient reduce-scattered within the group and the shard then
// all-reduced across the n/G groups (ranks with the same place in their group). G = 1 is replicated, G = n is
// sharded. The world must be a multiple of G.
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/collective/concepts.hpp>
#include <chunkwise/collective/shard.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/error.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace chunkwise {

template <int GroupSize>
struct hybrid {
  static_assert(GroupSize >= 1, "hybrid<G>: a group has at least one rank");

 private:
  static constexpr auto name_chars = [] {
    std::array<char, 20> text{"hybrid<"};
    std::size_t at = 7;
    char digits[12]{};
    int length = 0;
    for (int value = GroupSize; value > 0; value /= 10) digits[length++] = static_cast<char>('0' + value % 10);
    while (length > 0) text[at++] = digits[--length];
    text[at++] = '>';
    return text;
  }();
  static constexpr std::size_t name_length = [] {
    std::size_t length = 0;
    while (name_chars[length] != '\0') ++length;
    return length;
  }();

  static constexpr void check(int ranks) {
    if (!supports(ranks))
      detail::raise(error_code::invalid_argument,
                    "hybrid<" + std::to_string(GroupSize) + "> over " + std::to_string(ranks) +
                        " ranks: the world must be a positive multiple of the group size " + std::to_string(GroupSize));
  }

 public:
  static constexpr std::string_view name{name_chars.data(), name_length};
  static constexpr bool shards_parameters = true;
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_optimizer_state = true;
  static constexpr int group_size = GroupSize;
  static constexpr int gathers_per_step = 2;  // as sharded: forward and backward

  static constexpr bool supports(int ranks) noexcept { return ranks >= 1 && ranks % GroupSize == 0; }

  static constexpr byte_count bytes_per_rank(tensor_role, byte_count chunk_bytes, std::size_t chunks, int ranks) {
    check(ranks);
    return byte_count{chunks} * shard_bytes(chunk_bytes, GroupSize);
  }
  static constexpr byte_count working_bytes(tensor_role role, byte_count chunk_bytes, int ranks) {
    check(ranks);
    if (role == tensor_role::optimizer_state) return 0;
    return padded_chunk_bytes(chunk_bytes, GroupSize);
  }

  static constexpr step_traffic traffic(byte_count parameter_chunk_bytes, byte_count gradient_chunk_bytes,
                                        std::size_t chunks, int ranks) {
    check(ranks);
    const int groups = ranks / GroupSize;
    const byte_count gradient_shard = shard_bytes(gradient_chunk_bytes, GroupSize);
    return {.all_gather = byte_count{chunks} * gathers_per_step *
                          detail::ring_gather_bytes(padded_chunk_bytes(parameter_chunk_bytes, GroupSize), GroupSize),
            .reduce_scatter = byte_count{chunks} *
                              detail::ring_gather_bytes(padded_chunk_bytes(gradient_chunk_bytes, GroupSize), GroupSize),
            .cross_group_all_reduce = byte_count{chunks} * detail::ring_all_reduce_bytes(gradient_shard, groups)};
  }

  template <communicator Comm>
  static chunk_collectives<hybrid, Comm> bind(Comm& comm) {
    return chunk_collectives<hybrid, Comm>(comm);
  }
};

static_assert(collective_strategy<hybrid<2>>);
static_assert(collective_strategy<hybrid<8>>);

}  // namespace chunkwise
