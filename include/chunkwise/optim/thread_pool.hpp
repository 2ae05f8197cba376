#pragma once
// A small persistent pool of std::threads for the CPU optimizer: the caller plus `size() - 1` workers share the
// tasks of one parallel_for, handed out by an atomic counter. Threads sleep on a condition variable between
// steps; nothing is allocated per call.
#include <chunkwise/core/error.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace chunkwise::inline CHUNKWISE_ABI::optim {

class thread_pool {
 public:
  /// `threads` counts the caller: thread_pool(1) starts no worker and runs everything on the calling thread.
  explicit thread_pool(unsigned threads = 1) {
    if (threads == 0) throw error(error_code::invalid_argument, "thread_pool: needs at least 1 thread, got 0");
    workers_.reserve(threads - 1);
    for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      ++generation_;
    }
    wake_.notify_all();
    for (auto& worker : workers_) worker.join();
  }

  [[nodiscard]] unsigned size() const noexcept { return static_cast<unsigned>(workers_.size()) + 1; }

  /// Calls `task(i)` once for every i in [0, tasks), on the pool's threads and the caller; returns when all are
  /// done. `task` must not throw. Not reentrant: one parallel_for at a time per pool.
  template <class Task>
  void parallel_for(std::size_t tasks, Task&& task) {
    static_assert(std::is_nothrow_invocable_v<Task&, std::size_t>, "parallel_for: the task must be noexcept");
    if (tasks == 0) return;
    if (workers_.empty() || tasks == 1) {
      for (std::size_t i = 0; i < tasks; ++i) task(i);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      job_ = &task;
      run_ = [](void* job, std::size_t i) noexcept { (*static_cast<std::remove_reference_t<Task>*>(job))(i); };
      tasks_ = tasks;
      next_.store(0, std::memory_order_relaxed);
      busy_ = static_cast<unsigned>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return busy_ == 0; });
    job_ = nullptr;
  }

 private:
  void drain() noexcept {
    for (std::size_t i = next_.fetch_add(1, std::memory_order_relaxed); i < tasks_;
         i = next_.fetch_add(1, std::memory_order_relaxed))
      run_(job_, i);
  }

  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stopping_) return;
      }
      drain();
      bool last = false;
      {
        std::lock_guard lock(mutex_);
        last = --busy_ == 0;
      }
      if (last) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  unsigned busy_ = 0;
  void* job_ = nullptr;
  void (*run_)(void*, std::size_t) noexcept = nullptr;
  std::size_t tasks_ = 0;
  std::atomic<std::size_t> next_{0};
};

}  // namespace chunkwise::optim
