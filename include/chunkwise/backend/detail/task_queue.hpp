#pragma once
// A FIFO of tasks run by a fixed set of worker threads. With one thread it is a stream: tasks run in the order they
// were queued. A task that throws does not kill its thread: the first exception is kept and rethrown by
// `rethrow_if_failed()`.
#include <chunkwise/core/error.hpp>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace chunkwise::inline CHUNKWISE_ABI::detail {

class task_queue {
 public:
  explicit task_queue(std::size_t threads = 1) {
    if (threads == 0) raise(error_code::invalid_argument, "task_queue: asked for 0 worker threads; need at least 1");
    workers_.reserve(threads);
    try {
      for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
    } catch (const std::system_error& e) {
      stop();
      raise(error_code::unsupported, std::string("task_queue: std::thread failed after ") +
                                         std::to_string(workers_.size()) + " of " + std::to_string(threads) +
                                         " worker threads: " + e.what());
    }
  }
  task_queue(const task_queue&) = delete;
  task_queue& operator=(const task_queue&) = delete;
  ~task_queue() { stop(); }

  void push(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
      ++pending_;
    }
    wake_.notify_one();
  }

  /// Blocks until every task queued so far has run.
  void drain() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return pending_ == 0; });
  }

  void rethrow_if_failed() {
    std::exception_ptr failure;
    {
      std::lock_guard lock(mutex_);
      failure = std::exchange(failure_, nullptr);
    }
    if (failure) std::rethrow_exception(failure);
  }

  [[nodiscard]] std::size_t threads() const noexcept { return workers_.size(); }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      try {
        task();
      } catch (...) {
        std::lock_guard failure_lock(mutex_);
        if (!failure_) failure_ = std::current_exception();
      }
      lock.lock();
      if (--pending_ == 0) idle_.notify_all();
    }
  }

  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& worker : workers_)
      if (worker.joinable()) worker.join();
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> tasks_;
  std::size_t pending_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::vector<std::thread> workers_;
};

/// A one-shot completion flag with an optional error, waited on by any thread.
class completion {
 public:
  void complete(std::exception_ptr failure = nullptr) noexcept {
    {
      std::lock_guard lock(mutex_);
      failure_ = failure;
      done_ = true;
    }
    done_cv_.notify_all();
  }
  [[nodiscard]] bool ready() const noexcept {
    std::lock_guard lock(mutex_);
    return done_;
  }
  /// Blocks until complete; rethrows the task's error, if any.
  void wait() const {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [this] { return done_; });
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr failure_;
};

}  // namespace chunkwise::detail
