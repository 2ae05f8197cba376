#pragma once
// The collective seam: how ranks share a chunk's parameters, gradients and optimizer state.
//
// A collective strategy S is a small literal type. For the cost model, all constexpr (chunk_bytes: one chunk of that
// role, in its own dtype; chunks: how many; ranks: world size):
//   S::name                                  "replicated", "shard_grads", "sharded", "hybrid<8>"
//   S::shards_parameters / shards_gradients / shards_optimizer_state
//   S::supports(ranks)                       false where the world cannot be cut (hybrid<G> with ranks % G != 0)
//   S::bytes_per_rank(role, chunk_bytes, chunks, ranks)
//                                            persistent bytes of `role` each rank holds, padding included
//   S::working_bytes(role, chunk_bytes, ranks)
//                                            bytes of the full-chunk buffer a rank needs while one chunk of `role` is
//                                            gathered (parameters) or reduced (gradients); 0 when the home serves
//   S::traffic(parameter_chunk_bytes, gradient_chunk_bytes, chunks, ranks)
//                                            bytes each rank sends per training step, per collective kind
// For the runtime, generic over any communicator:
//   auto ops = S::bind(comm);                a chunk_collectives<S, Comm> (hybrid splits comm: every rank calls it)
//   ops.owned<T>(n) / full_elements<T>(n) / home_elements<T>(n)
//   ops.gather_params(home, full)            before compute: `full` holds the whole (padded) chunk
//   ops.reduce_grads(full_grad, owned_grad, op)
//                                            after backward: `owned_grad` holds the reduced gradient of owned(n)
//   ops.publish_update(home)                 after the optimizer updated ops.owned_params(home): every rank's home
//                                            holds what the strategy says it holds
// (chunk_collectives.hpp says what each does per strategy; collective_strategy_for<S, Comm> checks that S binds to
// Comm.)
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/tensor_spec.hpp>

#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace chunkwise {

/// Bytes one rank sends in one training step, by collective kind: bus bytes as nccl-tests count them, so that
/// time = bytes / bus bandwidth of that kind. A ring all-gather or reduce-scatter of a buffer of B bytes sends
/// B (n-1)/n per rank; a ring all-reduce sends 2 B (n-1)/n.
struct step_traffic {
  byte_count all_gather = 0;              // parameters gathered before use
  byte_count reduce_scatter = 0;          // gradients reduced to their owners
  byte_count all_reduce = 0;              // gradients all-reduced over the whole world (replicated)
  byte_count cross_group_all_reduce = 0;  // hybrid: gradient shards all-reduced across groups (often the slow link)

  [[nodiscard]] constexpr byte_count total() const noexcept {
    return all_gather + reduce_scatter + all_reduce + cross_group_all_reduce;
  }
  constexpr bool operator==(const step_traffic&) const = default;
};

namespace detail {
constexpr byte_count ring_gather_bytes(byte_count buffer, int ranks) noexcept {
  return ranks <= 1 ? 0 : buffer * static_cast<byte_count>(ranks - 1) / static_cast<byte_count>(ranks);
}
constexpr byte_count ring_all_reduce_bytes(byte_count buffer, int ranks) noexcept {
  return ranks <= 1 ? 0 : 2 * buffer * static_cast<byte_count>(ranks - 1) / static_cast<byte_count>(ranks);
}
/// The smallest world a strategy supports (hybrid<8>: 8), to check its functions in a constant expression.
template <class S>
constexpr int smallest_world() noexcept {
  for (int ranks = 1; ranks < 4096; ++ranks)
    if (S::supports(ranks)) return ranks;
  return 1;
}
}  // namespace detail

template <class S>
concept collective_strategy =
    std::is_empty_v<S> &&
    requires(tensor_role role, byte_count chunk_bytes, std::size_t chunks, int ranks) {
      { S::name } -> std::convertible_to<std::string_view>;
      { S::shards_parameters } -> std::convertible_to<bool>;
      { S::shards_gradients } -> std::convertible_to<bool>;
      { S::shards_optimizer_state } -> std::convertible_to<bool>;
      { S::supports(ranks) } -> std::same_as<bool>;
      { S::bytes_per_rank(role, chunk_bytes, chunks, ranks) } -> std::same_as<byte_count>;
      { S::working_bytes(role, chunk_bytes, ranks) } -> std::same_as<byte_count>;
      { S::traffic(chunk_bytes, chunk_bytes, chunks, ranks) } -> std::same_as<step_traffic>;
    } &&
    // constexpr: usable by the search at compile time
    std::bool_constant<(S::bytes_per_rank(tensor_role::parameter, byte_count{1}, std::size_t{1},
                                          detail::smallest_world<S>()),
                        S::traffic(byte_count{1}, byte_count{1}, std::size_t{1}, detail::smallest_world<S>()).total(),
                        true)>::value;

/// A strategy whose run-time operations bind to communicator `Comm`.
template <class S, class Comm>
concept collective_strategy_for = collective_strategy<S> && communicator<Comm> && requires(Comm& comm) {
  { S::bind(comm) } -> std::same_as<chunk_collectives<S, Comm>>;
};

}  // namespace chunkwise
