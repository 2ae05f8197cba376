#pragma once
// A byte budget with in-use, peak and traffic counters, shared by every tier. Thread-safe (atomics): allocations
// come from the trainer thread, counters are bumped by transfer workers.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/tier/concepts.hpp>

#include <atomic>
#include <string>
#include <string_view>

namespace chunkwise::detail {

class byte_budget {
 public:
  byte_budget(std::string_view tier_name, byte_count capacity) : name_(tier_name), capacity_(capacity) {}

  /// Takes `bytes` from the budget or throws out_of_memory naming the bytes asked, in use and the budget.
  void reserve(byte_count bytes) {
    byte_count used = in_use_.load(std::memory_order_relaxed);
    do {
      if (bytes > capacity_ || used > capacity_ - bytes) {
        raise(error_code::out_of_memory,
              name_ + " tier: cannot allocate " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                  " bytes): " + format_bytes(used) + " (" + std::to_string(used) + " bytes) in use of a " +
                  format_bytes(capacity_) + " (" + std::to_string(capacity_) + " bytes) budget; " +
                  format_bytes(capacity_ - used) + " free");
      }
    } while (!in_use_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    byte_count peak = peak_.load(std::memory_order_relaxed);
    while (used + bytes > peak && !peak_.compare_exchange_weak(peak, used + bytes, std::memory_order_relaxed)) {
    }
  }
  void release(byte_count bytes) noexcept { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }
  void note_read(byte_count bytes) noexcept { read_.fetch_add(bytes, std::memory_order_relaxed); }
  void note_written(byte_count bytes) noexcept { written_.fetch_add(bytes, std::memory_order_relaxed); }

  [[nodiscard]] byte_count capacity() const noexcept { return capacity_; }
  [[nodiscard]] byte_count in_use() const noexcept { return in_use_.load(std::memory_order_relaxed); }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] tier_stats stats() const noexcept {
    return {capacity_, in_use_.load(std::memory_order_relaxed), peak_.load(std::memory_order_relaxed),
            read_.load(std::memory_order_relaxed), written_.load(std::memory_order_relaxed)};
  }

 private:
  std::string name_;
  byte_count capacity_;
  std::atomic<byte_count> in_use_{0};
  std::atomic<byte_count> peak_{0};
  std::atomic<byte_count> read_{0};
  std::atomic<byte_count> written_{0};
};

}  // namespace chunkwise::detail
