#pragma once
// thread_comm: N ranks as threads of one process, the single-machine and test communicator.
//
//   chunkwise::thread_world world(4, std::chrono::milliseconds(500));   // 4 ranks, give up on a peer after 500 ms
//   // on the thread of rank r:
//   auto comm = world.comm(r);
//   comm.all_reduce(std::span<const float>(grad), std::span<float>(grad), chunkwise::reduce_op::average).wait();
//
// How it works. Each rank has one worker thread that runs the rank's operations in issue order (on every
// communicator split from the world too), so an operation returns a request at once and the rank's own thread goes on
// computing. An operation is a rendezvous of the workers: each publishes its buffers in a slot, waits until every
// rank has published, then reads the peers' buffers directly (shared memory, no staging copy) and writes only its
// own output, and waits once more before completing, so no peer still reads its buffers when its request completes.
// all_reduce is a reduce-scatter and an all-gather in place: rank q adds segment q of every input in rank order,
// then every rank copies the other segments from their owners. Every element is therefore summed by exactly one
// rank, in rank order: the result is the same bits on every rank and for every order of arrival.
// Waiting (a rendezvous, a rank's worker between operations, a request's wait()) polls for 200 us, yielding the
// core, before it sleeps: a wake-up of a sleeping thread costs tens of microseconds on a virtual machine whose idle
// cores halt, several per operation (an 8-byte all-reduce among 2 thread ranks took 60-75 us sleeping at once, 5-9 us
// so). 200 us rather than 50 covers the ranks' skew in a step too: per_tensor/resident/sharded (84 collectives a
// step) ran 15-24% faster at 2 and 4 ranks on 2 cores, paired run by run.
//
// A rank that never arrives makes every waiting peer throw error_code::comm_error after the timeout (counted from the
// peer's own arrival at the operation), naming the missing rank; from then on the group is failed and every operation
// on it throws at once, naming the first failure. Once all ranks have arrived, an operation runs to its end.
// Ranks that call different operations at the same point (kind, dtype, element count, reduce op or root differ)
// also fail the group, with a message that shows both calls.
//
// Tests switch on faults through a testing::thread_fault_injector given to the world: a rank's worker sleeps before arriving
// at a chosen operation (a stall), or stops arriving from a chosen operation on (a rank that died). A stall shorter
// than the timeout changes nothing but the time; a longer one, or a stop, fails the operation with comm_error on every
// rank, naming the late rank, before any rank touched an output buffer. Without an injector the cost is one
// null-pointer test per operation.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/comm/detail/reduce.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/poll_until.hpp>
#include <chunkwise/core/worker_threads.hpp>
#include <chunkwise/testing/thread_comm_faults.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace chunkwise {

namespace detail {

enum class op_kind : std::uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier, split };

constexpr const char* to_string(op_kind kind) noexcept {
  switch (kind) {
    case op_kind::all_gather: return "all_gather";
    case op_kind::reduce_scatter: return "reduce_scatter";
    case op_kind::all_reduce: return "all_reduce";
    case op_kind::broadcast: return "broadcast";
    case op_kind::barrier: return "barrier";
    case op_kind::split: return "split";
  }
  return "?";
}

template <class T>
constexpr const char* element_name() noexcept {
  if constexpr (reducible_element<T>) return to_string(dtype_of<T>()).data();
  else return "bytes";
}

class thread_group;

/// What one rank publishes for one operation.
struct op_slot {
  op_kind kind = op_kind::barrier;
  const char* element = "";  // "fp32", "bf16", "fp16" or "bytes"
  std::size_t bytes = 0;     // per rank: all_gather input, reduce_scatter output, all_reduce and broadcast buffer
  reduce_op op = reduce_op::sum;
  int root = 0;
  const void* in = nullptr;
  void* out = nullptr;
  int color = 0, key = 0;  // split
};

/// The rendezvous of a set of ranks (a world or one part of a split).
class thread_group {
 public:
  thread_group(int ranks, std::chrono::milliseconds timeout, std::string name,
               std::shared_ptr<testing::thread_fault_injector> faults = nullptr)
      : ranks_(ranks), timeout_(timeout), name_(std::move(name)), faults_(std::move(faults)),
        arrived_(std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(ranks))), slots_(ranks),
        operations_(ranks, 0), created_(ranks) {}

  [[nodiscard]] int size() const noexcept { return ranks_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const std::shared_ptr<testing::thread_fault_injector>& faults() const noexcept { return faults_; }
  /// How long a waiter spins before it sleeps: a peer usually arrives within microseconds, and waking a sleeping
  /// thread costs tens of them on a virtual machine whose idle core halts.
  static constexpr std::chrono::microseconds spin_before_sleep{200};

  /// What a running operation sees once every rank has published its slot.
  class view {
   public:
    [[nodiscard]] const op_slot& slot(int rank) const { return group_.slots_[rank]; }
    [[nodiscard]] int size() const noexcept { return group_.ranks_; }
    /// split: the group this rank created for its color (only its worker writes there), and a peer's.
    [[nodiscard]] std::shared_ptr<thread_group>& created() { return group_.created_[rank_]; }
    [[nodiscard]] const std::shared_ptr<thread_group>& created(int rank) const { return group_.created_[rank]; }
    /// One more rendezvous inside the operation (all_reduce between its two halves).
    void sync() { group_.arrive_and_wait(rank_, nullptr, number_, false); }

   private:
    friend class thread_group;
    view(thread_group& group, int rank, std::uint64_t number) : group_(group), rank_(rank), number_(number) {}
    thread_group& group_;
    int rank_;
    std::uint64_t number_;
  };

  /// Runs one operation on the worker of `rank`: publish, wait for all, check that all called the same operation,
  /// `body(view)`, wait for all once more so that nobody reads this rank's buffers after it returns.
  /// Only the first rendezvous times out: past it every rank is inside the operation, doing bounded local work
  /// (copies, reductions) on its peers' buffers, and leaving early would free buffers a peer still reads.
  template <class Body>
  void run(int rank, const op_slot& mine, Body&& body) {
    const std::uint64_t number = ++operations_[rank];  // only this rank's worker touches its counter
    if (faults_) inject_fault(rank, mine, number);
    arrive_and_wait(rank, &mine, number, true);
    check_same_call(number);
    view v(*this, rank, number);
    body(v);
    arrive_and_wait(rank, nullptr, number, false);
  }
  /// A rank that cannot take part in its next operation (its input failed to arrive): the group fails now, naming
  /// it and why, instead of its peers timing out.
  void fail(int rank, const std::string& reason) {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) set_failure("rank " + std::to_string(rank) + " cannot take part: " + reason);
    ready_.notify_all();
  }

 private:
  void set_failure(std::string message) {  // under mutex_
    failure_ = std::move(message);
    failed_.store(true, std::memory_order_release);
  }

  [[nodiscard]] bool all_arrived(std::uint64_t phase) const noexcept {
    for (int q = 0; q < ranks_; ++q)
      if (arrived_[q].load(std::memory_order_acquire) < phase) return false;
    return true;
  }

  void arrive_and_wait(int rank, const op_slot* publish, std::uint64_t number, bool may_time_out) {
    std::unique_lock lock(mutex_);
    const char* what = to_string(slots_[rank].kind);
    if (publish != nullptr) {
      slots_[rank] = *publish;
      what = to_string(publish->kind);
    }
    const std::uint64_t phase = arrived_[rank].load(std::memory_order_relaxed) + 1;
    arrived_[rank].store(phase, std::memory_order_release);
    ready_.notify_all();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    if (failure_.empty() && !all_arrived(phase)) {
      // Poll a while before sleeping: a peer usually arrives within microseconds, and waking a sleeping thread
      // costs tens of them on a virtual machine whose idle core halts. A failed group is left to the locked path
      // below (a rank arriving after the failure was set publishes its arrival after `failed_`, so a poller that
      // sees every arrival sees the failure too).
      lock.unlock();
      const bool settled = poll_until(
          spin_before_sleep, [&] { return failed_.load(std::memory_order_relaxed) || all_arrived(phase); });
      if (settled && !failed_.load(std::memory_order_acquire)) return;  // read after the arrivals, as said above
      lock.lock();
    }
    for (;;) {
      if (!failure_.empty())
        throw error(error_code::comm_error, "thread_comm '" + name_ + "': rank " + std::to_string(rank) +
                                                " abandons " + what + " #" + std::to_string(number) +
                                                " because the group failed: " + failure_);
      std::vector<int> missing;
      for (int q = 0; q < ranks_; ++q)
        if (arrived_[q].load(std::memory_order_relaxed) < phase) missing.push_back(q);
      if (missing.empty()) return;
      if (!may_time_out) {
        ready_.wait(lock);
        continue;
      }
      if (ready_.wait_until(lock, deadline) == std::cv_status::timeout && failure_.empty()) {
        missing.clear();
        for (int q = 0; q < ranks_; ++q)
          if (arrived_[q].load(std::memory_order_relaxed) < phase) missing.push_back(q);
        if (missing.empty()) return;
        set_failure("rank " + std::to_string(rank) + " waited " + std::to_string(timeout_.count()) + " ms in " +
                    what + " #" + std::to_string(number) + " (group of " + std::to_string(ranks_) + " ranks) for " +
                    (missing.size() == 1 ? "rank " : "ranks ") + join(missing) +
                    (missing.size() == 1 ? ", which has" : ", which have") +
                    " not arrived; a rank that stopped calling collectives, or called them in another order, "
                    "stalls the group");
        ready_.notify_all();
        throw error(error_code::comm_error, "thread_comm '" + name_ + "': " + failure_);
      }
    }
  }

  // Before arriving: a stall sleeps, a stop throws from this rank's worker without arriving (its peers time out).
  void inject_fault(int rank, const op_slot& mine, std::uint64_t number) const {
    const testing::thread_fault_injector::action fault = faults_->before(name_, rank, number);
    if (fault.stall.count() > 0) std::this_thread::sleep_for(fault.stall);
    if (fault.stop)
      throw error(error_code::comm_error, "thread_comm '" + name_ + "': rank " + std::to_string(rank) +
                                              " stopped before " + to_string(mine.kind) + " #" +
                                              std::to_string(number) +
                                              " (fault injected): it no longer arrives at operations of this group");
  }

  void check_same_call(std::uint64_t number) {
    // Under the lock: after a mismatch a peer may already be publishing its next operation.
    std::unique_lock lock(mutex_);
    const op_slot& first = slots_[0];
    for (int q = 1; q < ranks_; ++q) {
      const op_slot& other = slots_[q];
      const bool same = other.kind == first.kind &&
                        (first.kind == op_kind::split || first.kind == op_kind::barrier ||
                         (other.bytes == first.bytes && std::strcmp(other.element, first.element) == 0 &&
                          other.op == first.op && other.root == first.root));
      if (same) continue;
      std::string message = "operation #" + std::to_string(number) + " differs between ranks: rank 0 called " +
                            describe(first) + ", rank " + std::to_string(q) + " called " + describe(other);
      if (failure_.empty()) set_failure(message);
      ready_.notify_all();
      throw error(error_code::comm_error, "thread_comm '" + name_ + "': " + message);
    }
  }

  static std::string describe(const op_slot& slot) {
    std::string text = to_string(slot.kind);
    if (slot.kind == op_kind::barrier || slot.kind == op_kind::split) return text;
    text += " of " + std::to_string(slot.bytes) + " bytes of " + slot.element;
    if (slot.kind == op_kind::reduce_scatter || slot.kind == op_kind::all_reduce)
      text += std::string(" (") + std::string(to_string(slot.op)) + ")";
    if (slot.kind == op_kind::broadcast) text += " from root " + std::to_string(slot.root);
    return text;
  }

  static std::string join(const std::vector<int>& ranks) {
    std::string text;
    for (std::size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
    return text;
  }

  const int ranks_;
  const std::chrono::milliseconds timeout_;
  const std::string name_;
  const std::shared_ptr<testing::thread_fault_injector> faults_;  // null: no faults (tests only)
  std::mutex mutex_;
  std::condition_variable ready_;
  // Rendezvous each rank has reached: stored under mutex_ (a sleeping waiter sees it), read also without it.
  std::unique_ptr<std::atomic<std::uint64_t>[]> arrived_;
  std::vector<op_slot> slots_;             // written under mutex_ before arriving; read after the rendezvous
  std::vector<std::uint64_t> operations_;  // operations each rank has started (each rank's worker only)
  std::string failure_;                    // first failure; non-empty means every later wait throws
  std::atomic<bool> failed_{false};        // !failure_.empty(), readable without the lock (the spin)
  std::vector<std::shared_ptr<thread_group>> created_;  // split: written by its rank before a rendezvous
};

}  // namespace detail

class thread_world;

class thread_comm {
 public:
  /// Completion of one operation: wait() blocks until it ran and rethrows its error (at every call); test() polls
  /// (true also when it failed: wait() then throws). Default-constructed: complete.
  ///
  /// A shared_future, not a future: future::get() drops the caller's reference to the shared state before the
  /// caller's handler reads the exception, leaving the worker's task the last owner, which may then free the
  /// exception while it is read as far as ThreadSanitizer can tell (exception_ptr counts live in uninstrumented
  /// libstdc++). Here the request keeps the state, and the exception, until it is destroyed on the caller's side.
  class request {
   public:
    request() = default;
    void wait() {
      if (!done_.valid()) return;
      // As the rendezvous: poll before sleeping (poll_until), since the worker usually finishes within microseconds.
      (void)poll_until(detail::thread_group::spin_before_sleep, [this] { return test(); });
      done_.get();
    }
    [[nodiscard]] bool test() {
      return !done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    }

   private:
    friend class thread_comm;
    explicit request(std::future<void> done) : done_(done.share()) {}
    std::shared_future<void> done_;
  };

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return group_->size(); }
  [[nodiscard]] const std::string& name() const noexcept { return group_->name(); }

  template <transferable_element T>
  request all_gather(std::span<const T> in, std::span<T> out) {
    return all_gather_after(in, out, {});
  }

  /// all_gather whose input is still being filled: this rank's worker runs `before` (waits for the input; may be
  /// empty) and then meets its peers; the caller does not wait.
  template <transferable_element T>
  request all_gather_after(std::span<const T> in, std::span<T> out, std::function<void()> before) {
    detail::check_all_gather("thread_comm", in, out, rank_, size());
    const detail::op_slot mine{.kind = detail::op_kind::all_gather, .element = detail::element_name<T>(),
                               .bytes = in.size_bytes(), .in = in.data(), .out = out.data()};
    return submit(mine,
                  [out, count = in.size()](detail::thread_group::view& peers) {
                    for (int q = 0; q < peers.size(); ++q) {
                      const T* source = static_cast<const T*>(peers.slot(q).in);
                      T* target = out.data() + static_cast<std::size_t>(q) * count;
                      if (source != target && count != 0) std::memcpy(target, source, count * sizeof(T));
                    }
                  },
                  std::move(before));
  }

  template <reducible_element T>
  request reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    detail::check_reduce_scatter("thread_comm", in, out, rank_, size());
    const detail::op_slot mine{.kind = detail::op_kind::reduce_scatter, .element = detail::element_name<T>(),
                               .bytes = out.size_bytes(), .op = op, .in = in.data(), .out = out.data()};
    return submit(mine, [out, op, rank = rank_](detail::thread_group::view& peers) {
      reduce_block<T>(peers, static_cast<std::size_t>(rank) * out.size(), out.size(), out.data(), op);
    });
  }

  template <reducible_element T>
  request all_reduce(std::span<const T> in, std::span<T> out, reduce_op op) {
    detail::check_all_reduce("thread_comm", in, out);
    const detail::op_slot mine{.kind = detail::op_kind::all_reduce, .element = detail::element_name<T>(),
                               .bytes = out.size_bytes(), .op = op, .in = in.data(), .out = out.data()};
    return submit(mine, [out, op, rank = rank_](detail::thread_group::view& peers) {
      // Segment q (of ceil(n / ranks) elements, the last ones shorter or empty) is reduced by rank q.
      const std::size_t count = out.size();
      const std::size_t ranks = static_cast<std::size_t>(peers.size());
      const std::size_t segment = (count + ranks - 1) / ranks;
      const auto bounds = [&](std::size_t q) {
        const std::size_t begin = std::min(count, q * segment);
        return std::pair{begin, std::min(count, begin + segment) - begin};
      };
      const auto [begin, length] = bounds(static_cast<std::size_t>(rank));
      reduce_block<T>(peers, begin, length, out.data() + begin, op);
      peers.sync();  // every segment is final in its owner's output
      for (int q = 0; q < peers.size(); ++q) {
        if (q == rank) continue;
        const auto [other_begin, other_length] = bounds(static_cast<std::size_t>(q));
        if (other_length != 0)
          std::memcpy(out.data() + other_begin, static_cast<const T*>(peers.slot(q).out) + other_begin,
                      other_length * sizeof(T));
      }
    });
  }

  template <transferable_element T>
  request broadcast(std::span<T> buffer, int root) {
    detail::check_root("thread_comm", root, size());
    const detail::op_slot mine{.kind = detail::op_kind::broadcast, .element = detail::element_name<T>(),
                               .bytes = buffer.size_bytes(), .root = root, .out = buffer.data()};
    return submit(mine, [buffer, root, rank = rank_](detail::thread_group::view& peers) {
      if (rank != root && !buffer.empty())
        std::memcpy(buffer.data(), peers.slot(root).out, buffer.size_bytes());
    });
  }

  request barrier() {
    return submit(detail::op_slot{.kind = detail::op_kind::barrier}, [](detail::thread_group::view&) {});
  }

  /// The ranks that pass the same color form a new communicator, ordered by (key, rank). Collective: every rank of
  /// this communicator calls it. The new one shares this rank's worker, so issue order holds across both.
  thread_comm split(int color, int key) {
    if (color < 0)
      detail::raise(error_code::invalid_argument,
                    "thread_comm: split color " + std::to_string(color) + " is negative; colors are >= 0");
    const detail::op_slot mine{.kind = detail::op_kind::split, .color = color, .key = key};
    // The task keeps only what it produces (never a thread_comm: the worker must not own a reference to itself).
    struct outcome {
      std::shared_ptr<detail::thread_group> group;
      int rank = 0;
    };
    auto result = std::make_shared<outcome>();
    request done = submit(mine, [result, color, rank = rank_, parent = group_.get()](detail::thread_group::view& peers) {
      std::vector<std::pair<int, int>> members;  // (key, rank) of my color
      for (int q = 0; q < peers.size(); ++q)
        if (peers.slot(q).color == color) members.push_back({peers.slot(q).key, q});
      std::sort(members.begin(), members.end());
      const int leader = members.front().second;
      if (rank == leader)
        peers.created() = std::make_shared<detail::thread_group>(static_cast<int>(members.size()), parent->timeout(),
                                                                 parent->name() + "/" + std::to_string(color),
                                                                 parent->faults());
      peers.sync();  // the leader's group is published
      result->group = peers.created(leader);
      for (std::size_t i = 0; i < members.size(); ++i)
        if (members[i].second == rank) result->rank = static_cast<int>(i);
    });
    done.wait();
    return thread_comm(std::move(result->group), result->rank, worker_);
  }

 private:
  friend class thread_world;
  thread_comm(std::shared_ptr<detail::thread_group> group, int rank, std::shared_ptr<worker_threads> worker)
      : group_(std::move(group)), rank_(rank), worker_(std::move(worker)) {}

  // `before`: runs on the worker before this rank arrives (an input still being filled); if it throws, the group
  // fails at once with its reason.
  template <class Body>
  request submit(const detail::op_slot& mine, Body body, std::function<void()> before = {}) {
    std::packaged_task<void()> task(
        [group = group_, rank = rank_, mine, body = std::move(body), before = std::move(before)]() mutable {
          if (before) {
            try {
              before();
            } catch (const std::exception& e) {
              group->fail(rank, std::string(to_string(mine.kind)) + "'s input: " + e.what());
              throw;
            }
          }
          group->run(rank, mine, body);
        });
    // A one-rank group meets no peer: run inline (no fault injection to honour, which needs the worker's timing).
    if (group_->size() == 1 && group_->faults() == nullptr) return request(worker_->run_now_or_submit(std::move(task)));
    return request(worker_->submit(std::move(task)));
  }

  /// out[0, length) = op over ranks of their inputs' elements [begin, begin + length), in rank order.
  template <reducible_element T>
  static void reduce_block(detail::thread_group::view& peers, std::size_t begin, std::size_t length, T* out,
                           reduce_op op) {
    if (length == 0) return;
    std::vector<const T*> sources(static_cast<std::size_t>(peers.size()));
    for (int q = 0; q < peers.size(); ++q) sources[q] = static_cast<const T*>(peers.slot(q).in) + begin;
    detail::reduce_in_rank_order<T>(sources, out, length, op, peers.size());
  }

  std::shared_ptr<detail::thread_group> group_;
  int rank_ = 0;
  std::shared_ptr<worker_threads> worker_;
};

/// The shared object that creates the N communicators of one in-process world.
class thread_world {
 public:
  static constexpr std::chrono::milliseconds default_timeout{60'000};

  /// `faults` (tests): stalls and stops of ranks, in this world and in every communicator split from it.
  explicit thread_world(int ranks, std::chrono::milliseconds timeout = default_timeout,
                        std::shared_ptr<testing::thread_fault_injector> faults = nullptr) {
    if (ranks < 1)
      detail::raise(error_code::invalid_argument,
                    "thread_world of " + std::to_string(ranks) + " ranks: a world has at least 1 rank");
    if (timeout.count() <= 0)
      detail::raise(error_code::invalid_argument, "thread_world timeout of " + std::to_string(timeout.count()) +
                                                      " ms: give a positive time to wait for a peer");
    group_ = std::make_shared<detail::thread_group>(ranks, timeout, "world", std::move(faults));
    for (int r = 0; r < ranks; ++r)
      workers_.push_back(std::make_shared<worker_threads>(1, detail::thread_group::spin_before_sleep));
  }

  [[nodiscard]] int size() const noexcept { return group_->size(); }

  /// The communicator of `rank`; copies share the rank's worker and are interchangeable.
  [[nodiscard]] thread_comm comm(int rank) const {
    if (rank < 0 || rank >= size())
      detail::raise(error_code::invalid_argument, "thread_world::comm(" + std::to_string(rank) +
                                                      "): ranks of this world are 0.." + std::to_string(size() - 1));
    return thread_comm(group_, rank, workers_[static_cast<std::size_t>(rank)]);
  }

 private:
  std::shared_ptr<detail::thread_group> group_;
  std::vector<std::shared_ptr<worker_threads>> workers_;
};

static_assert(communicator<thread_comm>);

}  // namespace chunkwise
