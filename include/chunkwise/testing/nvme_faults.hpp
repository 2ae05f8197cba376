#pragma once
// Fault injection for the NVMe tier (tests only): every attempt of every request of an `nvme_tier` whose
// `nvme_options::faults` holds an injector asks it whether to report a short transfer, an errno, or to sleep first.
// The tier acts on the answer where it handles the real system call's result, on both I/O paths; without an injector
// the cost is one null-pointer test per attempt. Std only: the tier includes it, it includes nothing of chunkwise.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace chunkwise::testing {

enum class nvme_op : std::uint8_t { read, write, allocate, submit };

constexpr const char* to_string(nvme_op op) noexcept {
  switch (op) {
    case nvme_op::read: return "read";
    case nvme_op::write: return "write";
    case nvme_op::allocate: return "allocate";
    case nvme_op::submit: return "submit";
  }
  return "?";
}

/// One attempt of one request, as the fault injector sees it. `allocate` is the store's fallocate (block, request
/// and attempt 0; bytes: the store file's size). `submit` is an io_uring_submit of a batch of requests (io_uring
/// path only; request: the first of the batch, bytes: 0); only an error or a delay acts on it, and an error stands
/// in for the call: the batch stays unsubmitted, as when the kernel refuses it.
struct nvme_attempt {
  nvme_op op = nvme_op::read;
  std::uint32_t block = 0;    // the block's slot
  std::uint32_t request = 0;  // the request's index within the block
  std::uint64_t offset = 0;      // file offset this attempt starts at
  std::uint64_t bytes = 0;       // bytes this attempt asked for
  unsigned attempt = 0;       // 0, then 1, 2, ... for the resumptions of a short transfer
};

/// What happens to one attempt: nothing, a short transfer (`missing` bytes fewer than the system call moved, at
/// least 1 byte still moved), a failure with `error_number` (whatever the call did), or a sleep before the result is
/// handled.
struct nvme_fault {
  enum class kind : std::uint8_t { none, short_transfer, error, delay };
  kind what = kind::none;
  std::uint64_t missing = 0;
  int error_number = 0;
  std::chrono::microseconds delay{0};

  static nvme_fault short_by(std::uint64_t missing) { return {kind::short_transfer, missing, 0, {}}; }
  static nvme_fault fail(int error_number) { return {kind::error, 0, error_number, {}}; }
  static nvme_fault sleep(std::chrono::microseconds delay) { return {kind::delay, 0, 0, delay}; }
};

/// A thread-safe list of rules, consulted by the store for every attempt (requests complete on several threads).
/// The first live rule that matches an attempt acts on it.
///
///   auto faults = std::make_shared<chunkwise::testing::nvme_fault_injector>();
///   faults->add({.fault = chunkwise::testing::nvme_fault::fail(EIO), .op = chunkwise::testing::nvme_op::read, .block = 3});
///   options.faults = faults;   // the store's next read of block 3 fails with EIO; the one after succeeds
class nvme_fault_injector {
 public:
  struct rule {
    nvme_fault fault{};
    std::optional<nvme_op> op{};             // empty: any read or write (allocate and submit only when named)
    std::optional<std::uint32_t> block{};    // empty: any block
    std::optional<std::uint32_t> request{};  // empty: any request of the block
    std::uint64_t skip = 0;                  // matching attempts let through before it acts
    std::uint64_t times = 1;                 // attempts it acts on, then it is spent; 0: every matching attempt
  };

  void add(const rule& r) {
    std::lock_guard lock(mutex_);
    rules_.push_back(live_rule{r, 0, 0});
  }
  /// Removes every rule and zeroes the count: later attempts run clean.
  void clear() {
    std::lock_guard lock(mutex_);
    rules_.clear();
    injected_ = 0;
  }
  /// Faults injected since construction or the last clear().
  [[nodiscard]] std::uint64_t injected() const {
    std::lock_guard lock(mutex_);
    return injected_;
  }

  [[nodiscard]] nvme_fault on_attempt(const nvme_attempt& attempt) {
    std::lock_guard lock(mutex_);
    for (live_rule& live : rules_) {
      const rule& r = live.spec;
      const bool transfer = attempt.op == nvme_op::read || attempt.op == nvme_op::write;
      if ((r.op ? *r.op != attempt.op : !transfer) || (r.block && *r.block != attempt.block) ||
          (r.request && *r.request != attempt.request))
        continue;
      if (live.seen++ < r.skip) continue;
      if (r.times != 0 && live.acted >= r.times) continue;
      ++live.acted;
      ++injected_;
      return r.fault;
    }
    return {};
  }

 private:
  struct live_rule {
    rule spec;
    std::uint64_t seen;   // matching attempts so far
    std::uint64_t acted;  // attempts it acted on
  };
  mutable std::mutex mutex_;
  std::vector<live_rule> rules_;
  std::uint64_t injected_ = 0;
};

}  // namespace chunkwise::testing
