#pragma once
// worker_threads: the one thread type of chunkwise. A fixed set of worker threads takes tasks from one FIFO queue;
// every threaded part is built on it:
//   - a stream of work in order (one worker): the host backend's copy engine, the transfer engine's movers, a
//     thread_comm rank's operations (`submit`, `run_now_or_submit`);
//   - a pool of requests (several workers): the NVMe tier's pread/pwrite path (`push`, `drain`);
//   - fork-join over indices with the caller working too (`parallel_for`): the CPU optimizers' tiles.
// Zero workers is allowed: then every task runs on the calling thread, at once.
//
// Failures: a task given to `push` that throws does not kill its worker; the first exception is kept and rethrown
// by `rethrow_if_failed()`. A task given to `submit` reports through its future. `parallel_for` tasks are noexcept.
// The destructor runs what is queued, then joins: every queued task ends.
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/poll_until.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace chunkwise {

class worker_threads {
 public:
  /// `workers`: threads this object starts (the caller is not counted). `spin_before_sleep`: how long an idle
  /// worker polls for the next task before it sleeps (a latency-bound stream of short tasks, as a thread rank's
  /// collectives, saves the wake-up of a sleeping thread, tens of microseconds on a virtual machine; 0: sleep at once).
  explicit worker_threads(std::size_t workers = 1, std::chrono::microseconds spin_before_sleep = {})
      : worker_count_(workers), spin_before_sleep_(spin_before_sleep) {
    workers_.reserve(workers);
    try {
      for (std::size_t i = 0; i < workers; ++i) workers_.emplace_back([this] { run(); });
    } catch (const std::system_error& e) {
      stop();
      throw_error(error_code::unsupported, std::string("worker_threads: std::thread failed after ") +
                                               std::to_string(workers_.size()) + " of " + std::to_string(workers) +
                                               " worker threads: " + e.what());
    }
  }
  worker_threads(const worker_threads&) = delete;
  worker_threads& operator=(const worker_threads&) = delete;
  ~worker_threads() { stop(); }

  /// Worker threads started.
  [[nodiscard]] std::size_t threads() const noexcept { return worker_count_; }
  /// Threads that share a parallel_for: the workers and the caller.
  [[nodiscard]] unsigned parallel_width() const noexcept { return static_cast<unsigned>(worker_count_) + 1; }

  /// Queues `task`; if it throws, the first such exception is kept for rethrow_if_failed().
  void push(std::function<void()> task) {
    enqueue(std::packaged_task<void()>([this, task = std::move(task)] {
      try {
        task();
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!failure_) failure_ = std::current_exception();
      }
    }));
  }

  /// Queues `task`; its result (or exception) arrives through the future.
  std::future<void> submit(std::packaged_task<void()> task) {
    std::future<void> done = task.get_future();
    enqueue(std::move(task));
    return done;
  }

  /// Runs `task` on the calling thread when nothing is queued or running, so queue order still holds (an operation
  /// that waits for nothing then costs no thread hand-off); otherwise queues it as submit() does.
  std::future<void> run_now_or_submit(std::packaged_task<void()> task) {
    {
      std::unique_lock lock(mutex_);
      if (worker_count_ != 0 && (!tasks_.empty() || running_ != 0)) {
        lock.unlock();
        return submit(std::move(task));
      }
      ++running_;
    }
    std::future<void> done = task.get_future();
    task();  // exceptions land in the future
    finish_one();
    return done;
  }

  /// Blocks until every task queued so far has run.
  void drain() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return tasks_.empty() && running_ == 0; });
  }

  /// Rethrows (once) the first exception a pushed task threw.
  void rethrow_if_failed() {
    std::exception_ptr failure;
    {
      std::lock_guard lock(mutex_);
      failure = std::exchange(failure_, nullptr);
    }
    if (failure) std::rethrow_exception(failure);
  }

  /// Calls `task(i)` once for every i in [0, tasks) on the workers and the calling thread; returns when all are done.
  /// `task` must be noexcept. Safe to call from a worker of this object (the caller then does what no worker takes).
  template <class Task>
  void parallel_for(std::size_t tasks, Task&& task) {
    static_assert(std::is_nothrow_invocable_v<Task&, std::size_t>, "parallel_for: the task must be noexcept");
    const std::size_t helpers = tasks == 0 ? 0 : std::min(worker_count_, tasks - 1);
    if (helpers == 0) {
      for (std::size_t i = 0; i < tasks; ++i) task(i);
      return;
    }
    // The join state is shared with the helpers: one that starts after every index is taken only reads it.
    auto join = std::make_shared<fork_join>();
    join->tasks = tasks;
    join->context = &task;
    join->body = [](void* context, std::size_t i) noexcept { (*static_cast<std::remove_reference_t<Task>*>(context))(i); };
    for (std::size_t h = 0; h < helpers; ++h) enqueue(std::packaged_task<void()>([join] { join->work(); }));
    join->work();
    std::unique_lock lock(join->mutex);
    join->all_done.wait(lock, [&] { return join->done.load(std::memory_order_acquire) == tasks; });
  }

 private:
  struct fork_join {
    std::size_t tasks = 0;
    void* context = nullptr;
    void (*body)(void*, std::size_t) noexcept = nullptr;
    std::atomic<std::size_t> next{0};
    std::atomic<std::size_t> done{0};
    std::mutex mutex;
    std::condition_variable all_done;

    void work() noexcept {
      for (std::size_t i = next.fetch_add(1, std::memory_order_relaxed); i < tasks;
           i = next.fetch_add(1, std::memory_order_relaxed)) {
        body(context, i);
        if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == tasks) {
          std::lock_guard lock(mutex);  // the caller checks `done` under it: no lost wake-up
          all_done.notify_all();
        }
      }
    }
  };

  void enqueue(std::packaged_task<void()> task) {
    if (worker_count_ == 0) {  // no worker: the caller runs it, now
      task();
      return;
    }
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
      queued_.store(tasks_.size(), std::memory_order_relaxed);
    }
    wake_.notify_one();
  }

  void finish_one() {
    {
      std::lock_guard lock(mutex_);
      --running_;
    }
    wake_.notify_one();  // a queued task may wait for an inline one to end
    idle_.notify_all();
  }

  void run() {
    for (;;) {
      std::packaged_task<void()> task;
      if (spin_before_sleep_.count() > 0)  // poll for the next task before sleeping
        (void)poll_until(spin_before_sleep_, [this] { return queued_.load(std::memory_order_relaxed) != 0; });
      {
        std::unique_lock lock(mutex_);
        // With one worker, a task run inline by run_now_or_submit holds back the queue, which keeps issue order.
        wake_.wait(lock, [this] { return stopping_ || (!tasks_.empty() && (worker_count_ > 1 || running_ == 0)); });
        if (tasks_.empty()) return;  // stopping and drained
        task = std::move(tasks_.front());
        tasks_.pop_front();
        queued_.store(tasks_.size(), std::memory_order_relaxed);
        ++running_;
      }
      task();  // packaged_task keeps any exception for its future (push() catches its own first)
      finish_one();
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

  const std::size_t worker_count_;  // workers_.size() once started; read by the workers while they start
  const std::chrono::microseconds spin_before_sleep_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::packaged_task<void()>> tasks_;
  std::size_t running_ = 0;  // tasks running now, on a worker or inline
  std::atomic<std::size_t> queued_{0};  // tasks_.size(), readable without the lock (the spin before sleeping)
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::vector<std::thread> workers_;  // last: started once the queue exists
};

/// A one-shot completion flag with an optional error, waited on by any thread: what a host "event" is.
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

/// Runs f on the calling thread, then completes `done` (when given) with its outcome; f's exception is rethrown too.
template <class F>
void run_then_complete(const std::shared_ptr<completion>& done, F&& f) {
  try {
    f();
  } catch (...) {
    if (done) done->complete(std::current_exception());
    throw;
  }
  if (done) done->complete();
}

}  // namespace chunkwise
