#pragma once
// chunk_collectives<Strategy, Comm>: a strategy's run-time operations on one chunk, generic over any communicator.
// Made by Strategy::bind(comm); keeps a reference to `comm` (which must outlive it) and, for hybrid, the two
// communicators split from it.
//
// Buffers, for a chunk of n elements of T (sizes from the geometry functions; `full` is padded):
//                   home (parameters held)   full (compute, gradients)   owned (optimizer updates)
//   replicated      n, the whole chunk       n, the home itself          [0, n)
//   shard_grads     padded chunk             padded chunk                this rank's shard of the world
//   sharded         this rank's shard        padded chunk                this rank's shard of the world
//   hybrid<G>       this rank's group shard  padded over G               this rank's shard of its group
//
//   gather_params(home, full)      replicated, shard_grads: nothing to move (pass the home as `full`);
//                                  sharded: all-gather over the world; hybrid: all-gather within the group.
//                                  With a third argument, the home may still be filling (prefetches).
//   reduce_grads(full_grad, owned_grad, op)
//                                  replicated: all-reduce of the whole chunk (owned_grad may be full_grad itself);
//                                  shard_grads, sharded: reduce-scatter over the world; hybrid: reduce-scatter in
//                                  the group, then all-reduce of the shard across groups (average: the mean of the
//                                  group means, which is the mean for equal groups).
//   publish_update(home)           shard_grads: all-gather of the updated shards in place; others: nothing (each
//                                  rank's home already holds the update).
#include <chunkwise/collective/pending.hpp>
#include <chunkwise/collective/shard.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/error.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>

namespace chunkwise {

template <class Strategy, communicator Comm>
class chunk_collectives {
 public:
  explicit chunk_collectives(Comm& comm) : world_(&comm) {
    const int ranks = comm.size();
    if (!Strategy::supports(ranks))
      detail::raise(error_code::unsupported, std::string(Strategy::name) + " cannot cut a world of " +
                                                 std::to_string(ranks) + " ranks into groups of " +
                                                 std::to_string(Strategy::group_size) +
                                                 "; use a group size that divides the world");
    if constexpr (Strategy::group_size != 0) {
      const int group = Strategy::group_size;
      if (group != ranks) {
        group_.emplace(comm.split(comm.rank() / group, comm.rank()));     // my group: ranks g*G .. g*G+G-1
        across_.emplace(comm.split(comm.rank() % group, comm.rank()));    // the same place in every group
      }
    }
  }

  [[nodiscard]] int rank() const { return world_->rank(); }
  /// The communicator of every rank (for what is not a chunk operation: norms, agreements).
  [[nodiscard]] Comm& world() const { return *world_; }
  [[nodiscard]] int ranks() const { return world_->size(); }
  /// Ranks a chunk is cut over (1 when it is not cut).
  [[nodiscard]] int shard_ranks() const { return Strategy::shards_gradients ? shard_comm().size() : 1; }

  /// Elements of the chunk this rank owns: its optimizer state and the gradient it receives cover these.
  template <class T>
  [[nodiscard]] shard_range owned(std::size_t chunk_elements) const {
    if constexpr (!Strategy::shards_gradients) return {0, chunk_elements, chunk_elements};
    else return shard_of(chunk_elements, sizeof(T), shard_comm().rank(), shard_comm().size());
  }
  /// Elements of the full-chunk buffers (parameters for compute, gradients), padding included.
  template <class T>
  [[nodiscard]] std::size_t full_elements(std::size_t chunk_elements) const {
    if constexpr (!Strategy::shards_gradients) return chunk_elements;
    else return owned<T>(chunk_elements).elements * static_cast<std::size_t>(shard_comm().size());
  }
  /// Elements of parameters this rank keeps between uses.
  template <class T>
  [[nodiscard]] std::size_t home_elements(std::size_t chunk_elements) const {
    if constexpr (Strategy::shards_parameters) return owned<T>(chunk_elements).elements;
    else return full_elements<T>(chunk_elements);
  }
  /// The owned parameters inside the home: what the optimizer updates.
  template <class T>
  [[nodiscard]] std::span<T> owned_params(std::span<T> home) const {
    if constexpr (Strategy::shards_parameters || !Strategy::shards_gradients) return home;
    else {
      const std::size_t shard = home.size() / static_cast<std::size_t>(shard_comm().size());
      return home.subspan(shard * static_cast<std::size_t>(shard_comm().rank()), shard);
    }
  }

  template <transferable_element T>
  pending<Comm> gather_params(std::span<const T> home, std::span<T> full) {
    if constexpr (Strategy::shards_parameters) {
      return pending<Comm>(shard_comm().all_gather(home, full));
    } else {
      if (home.data() != full.data() || home.size() != full.size())
        detail::raise(error_code::invalid_argument,
                      std::string(Strategy::name) + " keeps whole parameters: compute on the home buffer (pass it "
                                                    "as `full`), there is nothing to gather");
      return {};
    }
  }

  /// gather_params whose home is still being filled (a cache block whose fetch is in flight): `home_ready` returns
  /// once it holds its bytes. The gather takes its place in this rank's order now; a communicator that can, waits
  /// where the gather runs (thread_comm: its worker), others wait here.
  template <transferable_element T>
  pending<Comm> gather_params(std::span<const T> home, std::span<T> full, std::function<void()> home_ready) {
    if constexpr (Strategy::shards_parameters && gathers_after_input<Comm, T>) {
      return pending<Comm>(shard_comm().all_gather_after(home, full, std::move(home_ready)));
    } else {
      if (home_ready) home_ready();
      return gather_params(home, full);
    }
  }

  template <reducible_element T>
  pending<Comm> reduce_grads(std::span<const T> full_grad, std::span<T> owned_grad, reduce_op op) {
    if constexpr (!Strategy::shards_gradients) {
      return pending<Comm>(world_->all_reduce(full_grad, owned_grad, op));
    } else {
      auto scattered = shard_comm().reduce_scatter(full_grad, owned_grad, op);
      if (!across_) return pending<Comm>(std::move(scattered));
      // Issue order makes the all-reduce see the reduce-scatter's result without a wait in between.
      return pending<Comm>(std::move(scattered),
                           across_->all_reduce(std::span<const T>(owned_grad), owned_grad, op));
    }
  }

  template <transferable_element T>
  pending<Comm> publish_update(std::span<T> home) {
    if constexpr (Strategy::shards_gradients && !Strategy::shards_parameters) {
      const auto mine = owned_params(home);
      return pending<Comm>(world_->all_gather(std::span<const T>(mine), home));
    } else {
      return {};
    }
  }

 private:
  [[nodiscard]] Comm& shard_comm() const { return group_ ? *group_ : *world_; }

  Comm* world_;
  mutable std::optional<Comm> group_;   // hybrid: the ranks of my group
  std::optional<Comm> across_;          // hybrid: the ranks at my place in every group
};

}  // namespace chunkwise
