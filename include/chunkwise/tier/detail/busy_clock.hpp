#pragma once
// A drive's busy time: the seconds during which at least one of its requests was in flight, overlapping requests
// counted once. What the cost model's drive term predicts (bytes over the drive's rates, time-shared), so a run can
// say whether its drive ran at the profiled rate. Thread-safe: the transfer engine's workers and the update
// pipeline's threads read and write the store at once.
#include <chrono>
#include <mutex>

namespace chunkwise::detail {

template <class Clock = std::chrono::steady_clock>
class basic_busy_clock {
 public:
  /// Busy from construction to destruction (one request).
  class scope {
   public:
    explicit scope(basic_busy_clock& clock) : clock_(&clock) { clock_->start(); }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope() { clock_->stop(); }

   private:
    basic_busy_clock* clock_;
  };

  [[nodiscard]] scope busy() { return scope(*this); }

  /// Busy seconds so far, the interval still open included.
  [[nodiscard]] double seconds() const {
    std::lock_guard lock(mutex_);
    return total_ + (in_flight_ > 0 ? std::chrono::duration<double>(Clock::now() - since_).count() : 0.0);
  }

 private:
  void start() {
    std::lock_guard lock(mutex_);
    if (in_flight_++ == 0) since_ = Clock::now();
  }
  void stop() {
    std::lock_guard lock(mutex_);
    if (--in_flight_ == 0) total_ += std::chrono::duration<double>(Clock::now() - since_).count();
  }

  mutable std::mutex mutex_;
  int in_flight_ = 0;
  typename Clock::time_point since_{};
  double total_ = 0;
};

using busy_clock = basic_busy_clock<>;

}  // namespace chunkwise::detail
