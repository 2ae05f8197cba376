#pragma once
// Fault injection for thread_comm's ranks (tests only): a rank's worker consults the injector before each operation
// and stalls or stops (as a rank that died) where a rule says so. Std only.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace chunkwise::testing {

/// Faults for a thread_world's ranks (tests). Thread-safe: every rank's worker consults it before each operation.
///
///   auto faults = std::make_shared<chunkwise::testing::thread_fault_injector>();
///   faults->stall(2, 1, std::chrono::milliseconds(300));  // rank 2 sleeps 300 ms before its first operation
///   chunkwise::thread_world world(4, std::chrono::milliseconds(100), faults);
class thread_fault_injector {
 public:
  /// Rank `rank` of the groups named `group` (the world is "world", the parts of its split by color c "world/c";
  /// empty: every group) sleeps `delay` before arriving at its operation number `operation` (from 1, per group).
  void stall(int rank, std::uint64_t operation, std::chrono::milliseconds delay, std::string group = "world") {
    std::lock_guard lock(mutex_);
    rules_.push_back(rule{rank, operation, delay, false, std::move(group)});
  }
  /// Rank `rank` stops at its operation number `operation` of the groups named `group`: from then on it never
  /// arrives there, as a rank that died; its own requests fail with comm_error at once, its peers' at the timeout.
  void stop(int rank, std::uint64_t operation, std::string group = "world") {
    std::lock_guard lock(mutex_);
    rules_.push_back(rule{rank, operation, std::chrono::milliseconds{0}, true, std::move(group)});
  }
  void clear() {
    std::lock_guard lock(mutex_);
    rules_.clear();
  }

  struct action {
    std::chrono::milliseconds stall{0};
    bool stop = false;
  };
  /// What rank `rank` of group `group` meets before its operation number `operation`.
  [[nodiscard]] action before(const std::string& group, int rank, std::uint64_t operation) const {
    std::lock_guard lock(mutex_);
    action result;
    for (const rule& r : rules_) {
      if (r.rank != rank || (!r.group.empty() && r.group != group)) continue;
      if (r.stop && operation >= r.operation) result.stop = true;
      if (!r.stop && operation == r.operation) result.stall += r.delay;
    }
    return result;
  }

 private:
  struct rule {
    int rank;
    std::uint64_t operation;
    std::chrono::milliseconds delay;
    bool stop;
    std::string group;
  };
  mutable std::mutex mutex_;
  std::vector<rule> rules_;
};

}  // namespace chunkwise::testing
