#pragma once
// pending<Comm>: the completion of one strategy operation, which is at most two communicator operations
// (hybrid's reduce_grads: a reduce-scatter in the group, then an all-reduce across groups).
#include <chunkwise/comm/concepts.hpp>

#include <array>
#include <utility>

namespace chunkwise {

template <communicator Comm>
class pending {
 public:
  using request = typename Comm::request;

  pending() = default;  // complete
  explicit pending(request first) { parts_[0] = std::move(first); }
  pending(request first, request second) {
    parts_[0] = std::move(first);
    parts_[1] = std::move(second);
  }

  /// Blocks until every part completed; rethrows the first part's error.
  void wait() {
    for (auto& part : parts_) part.wait();
  }
  [[nodiscard]] bool test() {
    bool done = true;
    for (auto& part : parts_) done = part.test() && done;
    return done;
  }

 private:
  std::array<request, 2> parts_{};
};

}  // namespace chunkwise
