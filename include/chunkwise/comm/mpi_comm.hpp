#pragma once
// mpi_comm: ranks as MPI processes (Open MPI), for multi-process CPU runs and for bootstrapping NCCL across machines.
// Built only with the chunkwise::mpi component (CHUNKWISE_HAS_MPI); without it this header is empty.
//
//   chunkwise::mpi_environment mpi(argc, argv);   // MPI_Init_thread / MPI_Finalize, unless the program did it
//   chunkwise::mpi_comm comm;                     // a duplicate of MPI_COMM_WORLD
//   comm.all_reduce(std::span<const float>(g), std::span<float>(g), chunkwise::reduce_op::average).wait();
//
// Operations are MPI-3 nonblocking collectives. Reductions do not use MPI's reduction operators (no bf16/fp16, and
// no promise about the order of additions): a reduce-scatter is an all-to-all of the blocks followed by the same
// rank-order fp32 reduction thread_comm uses, and an all-reduce is that reduce-scatter followed by an all-gather, so
// mpi_comm, thread_comm and a plain reference agree bit for bit, and the bytes on the wire are those of a ring.
// The local reduction of a stage runs when the request is waited for or tested (MPI progresses the same way).
// Issue order: before it posts an operation, mpi_comm completes the operations in flight on this communicator and
// on every communicator split from the same one; so a collective overlaps computation but not another collective.
// Use it from one thread per process (MPI_THREAD_FUNNELED). A peer that never arrives: with a timeout
// (mpi_comm(comm, timeout)), a wait that lasts longer throws comm_error saying which peers on this machine are stopped
// or gone (peer_watch.hpp), and the communicator fails from then on; without one, it waits as long as MPI does
// (mpirun ends the job when a process dies, but not when one stops or hangs).
#if CHUNKWISE_HAS_MPI

#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/comm/detail/peer_watch.hpp>
#include <chunkwise/comm/detail/reduce.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/mpi_checked_call.hpp>

#include <mpi.h>  // after core/mpi_checked_call.hpp, which asks for the C API only
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace chunkwise {

namespace detail {

/// MPI counts are int: a message of more bytes than that must be cut by the caller (chunks are far smaller).
inline int mpi_count(std::size_t bytes, const char* what) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    raise(error_code::invalid_argument, std::string("mpi_comm: ") + what + " of " + std::to_string(bytes) +
                                            " bytes exceeds MPI's int count (" + std::to_string(INT_MAX) +
                                            " bytes); use chunks under 2 GiB");
  return static_cast<int>(bytes);
}

/// One operation in flight: the MPI request of its current stage and what runs when that stage completed (which
/// may post the next stage).
struct mpi_operation {
  MPI_Request request = MPI_REQUEST_NULL;
  std::function<void(mpi_operation&)> then;
  std::vector<std::byte> scratch;
  std::vector<int> counts, displacements, send_counts, receive_counts, receive_displacements;
  bool done = false;
  std::shared_ptr<peer_watch> watch;  // the communicator's timeout and peers; null: none
  std::string what;                   // "all_reduce of 4096 bytes", for the timeout's message

  void finish() {
    if (!watch || watch->timeout.count() == 0) {
      while (!done) {
        CHUNKWISE_MPI_TRY(MPI_Wait(&request, MPI_STATUS_IGNORE), "mpi_comm");
        advance();
      }
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + watch->timeout;
    for (std::uint64_t spins = 0; !poll(); ++spins)
      if (spins % 1024 == 1023 && std::chrono::steady_clock::now() >= deadline) {
        watch->failure = "mpi_comm: rank " + std::to_string(watch->rank) + " waited " +
                         std::to_string(watch->timeout.count()) + " ms for " + what + " to complete; " +
                         watch->describe_peers();
        raise(error_code::comm_error, watch->failure);
      }
  }
  bool poll() {
    while (!done) {
      int flag = 0;
      CHUNKWISE_MPI_TRY(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), "mpi_comm");
      if (!flag) return false;
      advance();
    }
    return true;
  }

 private:
  void advance() {
    if (then) {
      auto next = std::move(then);
      then = nullptr;
      next(*this);
    }
    if (request == MPI_REQUEST_NULL && !then) done = true;
  }
};

/// The operations in flight on a communicator and every communicator split from the same one, oldest first, and
/// the scratch of the last one finished, which the next reuses: a fresh buffer per operation costs its page faults,
/// as much time as the transfer itself at chunk sizes (measured: a 16 MiB reduce-scatter 50 ms, MPI's 39 ms).
struct mpi_issue_order {
  std::deque<std::shared_ptr<mpi_operation>> in_flight;
  std::vector<std::byte> spare;
  void complete_all() {
    while (!in_flight.empty()) {
      auto oldest = in_flight.front();
      in_flight.pop_front();
      oldest->finish();
      if (oldest->scratch.capacity() > spare.capacity()) spare = std::move(oldest->scratch);
    }
  }
};

struct mpi_handle {
  MPI_Comm comm = MPI_COMM_NULL;
  std::shared_ptr<mpi_issue_order> order;
  std::shared_ptr<peer_watch> watch;
  mpi_handle(MPI_Comm c, std::shared_ptr<mpi_issue_order> o) : comm(c), order(std::move(o)) {}
  mpi_handle(const mpi_handle&) = delete;
  mpi_handle& operator=(const mpi_handle&) = delete;
  ~mpi_handle() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (watch && !watch->failure.empty()) return;  // its operations never complete: leave them to MPI_Abort
    try {
      order->complete_all();
    } catch (...) {  // a destructor cannot report it; the operation's own request did, if anyone waited
    }
    MPI_Comm_free(&comm);
  }
};

}  // namespace detail

/// Initialises MPI (MPI_THREAD_FUNNELED) unless the program already did, and finalises what it initialised.
class mpi_environment {
 public:
  mpi_environment(int& argc, char**& argv) {
    int initialized = 0;
    CHUNKWISE_MPI_TRY(MPI_Initialized(&initialized), "mpi_comm");
    if (initialized) return;
    int provided = 0;
    CHUNKWISE_MPI_TRY(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "mpi_comm");
    owns_ = true;
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  ~mpi_environment() {
    if (owns_) MPI_Finalize();
  }

 private:
  bool owns_ = false;
};

class mpi_comm {
 public:
  /// Completion of one operation. wait() completes it (running its local reduction) and rethrows its error;
  /// test() progresses it without blocking. Default-constructed: complete.
  class request {
   public:
    request() = default;
    void wait() {
      if (operation_) operation_->finish();
    }
    [[nodiscard]] bool test() { return !operation_ || operation_->poll(); }

   private:
    friend class mpi_comm;
    explicit request(std::shared_ptr<detail::mpi_operation> operation) : operation_(std::move(operation)) {}
    std::shared_ptr<detail::mpi_operation> operation_;
  };

  /// A duplicate of `comm` (MPI_COMM_WORLD by default), with errors returned instead of aborting. MPI must be
  /// initialised (mpi_environment). Copies share the duplicate. A positive `timeout` bounds every wait (above);
  /// split communicators keep it.
  explicit mpi_comm(MPI_Comm comm = MPI_COMM_WORLD,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    int initialized = 0;
    CHUNKWISE_MPI_TRY(MPI_Initialized(&initialized), "mpi_comm");
    if (!initialized)
      detail::raise(error_code::invalid_argument,
                    "mpi_comm: MPI is not initialised; create a chunkwise::mpi_environment (or call MPI_Init) first");
    MPI_Comm duplicate = MPI_COMM_NULL;
    CHUNKWISE_MPI_TRY(MPI_Comm_dup(comm, &duplicate), "mpi_comm");
    adopt(duplicate, std::make_shared<detail::mpi_issue_order>(), timeout);
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] MPI_Comm native() const noexcept { return handle_->comm; }

  template <transferable_element T>
  request all_gather(std::span<const T> in, std::span<T> out) {
    const bool in_place = detail::check_all_gather("mpi_comm", in, out, rank_, size_);
    const int bytes = detail::mpi_count(in.size_bytes(), "all_gather");
    return post("all_gather of " + std::to_string(bytes) + " bytes per rank", [&](detail::mpi_operation& op) {
      CHUNKWISE_MPI_TRY(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data(), bytes, MPI_BYTE, out.data(), bytes,
                                       MPI_BYTE, native(), &op.request), "mpi_comm");
    });
  }

  /// All-to-all of the blocks (a rank's own block stays where it is), then the rank-order reduction of the ranks'
  /// copies of block `rank`.
  template <reducible_element T>
  request reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    detail::check_reduce_scatter("mpi_comm", in, out, rank_, size_);
    const int bytes = detail::mpi_count(out.size_bytes(), "reduce_scatter block");
    const int ranks = size_, me = rank_;
    const std::string what = "reduce_scatter of " + std::to_string(in.size_bytes()) + " bytes";
    return post(what, [&](detail::mpi_operation& operation) {
      operation.scratch.resize(in.size_bytes());
      // Block q to rank q, and rank q's copy of block `me` to scratch[q]; nothing to or from this rank itself.
      const auto q_count = static_cast<std::size_t>(ranks);
      operation.send_counts.assign(q_count, bytes);
      operation.send_counts[static_cast<std::size_t>(me)] = 0;
      operation.displacements.resize(q_count);
      for (int q = 0; q < ranks; ++q) operation.displacements[static_cast<std::size_t>(q)] = q * bytes;
      CHUNKWISE_MPI_TRY(MPI_Ialltoallv(in.data(), operation.send_counts.data(), operation.displacements.data(),
                                       MPI_BYTE, operation.scratch.data(), operation.send_counts.data(),
                                       operation.displacements.data(), MPI_BYTE, native(), &operation.request),
                        "mpi_comm");
      const T* own = in.data() + static_cast<std::size_t>(me) * out.size();
      operation.then = [out, op, ranks, me, own](detail::mpi_operation& self) {
        reduce_received<T>(self.scratch, out.size(), ranks, out.data(), op, me, own);
      };
    });
  }

  /// Reduce-scatter of segments (all-to-all-v and the rank-order reduction), then an all-gather-v in place.
  template <reducible_element T>
  request all_reduce(std::span<const T> in, std::span<T> out, reduce_op op) {
    detail::check_all_reduce("mpi_comm", in, out);
    detail::mpi_count(out.size_bytes(), "all_reduce");
    const int ranks = size_, me = rank_;
    return post("all_reduce of " + std::to_string(out.size_bytes()) + " bytes", [&](detail::mpi_operation& operation) {
      const std::size_t count = out.size();
      const std::size_t segment = (count + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
      operation.counts.resize(static_cast<std::size_t>(ranks));
      operation.displacements.resize(static_cast<std::size_t>(ranks));
      for (std::size_t q = 0; q < static_cast<std::size_t>(ranks); ++q) {
        const std::size_t begin = std::min(count, q * segment);
        operation.displacements[q] = static_cast<int>(begin * sizeof(T));
        operation.counts[q] = static_cast<int>((std::min(count, begin + segment) - begin) * sizeof(T));
      }
      const int mine = operation.counts[static_cast<std::size_t>(me)];
      // As reduce_scatter: this rank's own segment is reduced from `in` where it is, not sent to itself.
      operation.send_counts = operation.counts;
      operation.send_counts[static_cast<std::size_t>(me)] = 0;
      operation.receive_counts.assign(static_cast<std::size_t>(ranks), mine);
      operation.receive_counts[static_cast<std::size_t>(me)] = 0;
      operation.receive_displacements.resize(static_cast<std::size_t>(ranks));
      for (int q = 0; q < ranks; ++q) operation.receive_displacements[static_cast<std::size_t>(q)] = q * mine;
      operation.scratch.resize(static_cast<std::size_t>(mine) * static_cast<std::size_t>(ranks));
      CHUNKWISE_MPI_TRY(MPI_Ialltoallv(in.data(), operation.send_counts.data(), operation.displacements.data(),
                                       MPI_BYTE, operation.scratch.data(), operation.receive_counts.data(),
                                       operation.receive_displacements.data(), MPI_BYTE, native(),
                                       &operation.request), "mpi_comm");
      const T* in_data = in.data();
      operation.then = [out, op, ranks, me, in_data, comm = native()](detail::mpi_operation& self) {
        const auto mine_bytes = static_cast<std::size_t>(self.counts[static_cast<std::size_t>(me)]);
        const auto begin = static_cast<std::size_t>(self.displacements[static_cast<std::size_t>(me)]) / sizeof(T);
        reduce_received<T>(self.scratch, mine_bytes / sizeof(T), ranks, out.data() + begin, op, me, in_data + begin);
        CHUNKWISE_MPI_TRY(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, out.data(), self.counts.data(),
                                          self.displacements.data(), MPI_BYTE, comm, &self.request), "mpi_comm");
      };
    });
  }

  template <transferable_element T>
  request broadcast(std::span<T> buffer, int root) {
    detail::check_root("mpi_comm", root, size_);
    const int bytes = detail::mpi_count(buffer.size_bytes(), "broadcast");
    return post("broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root),
                [&](detail::mpi_operation& op) {
      CHUNKWISE_MPI_TRY(MPI_Ibcast(buffer.data(), bytes, MPI_BYTE, root, native(), &op.request), "mpi_comm");
    });
  }

  request barrier() {
    return post("barrier",
                [&](detail::mpi_operation& op) { CHUNKWISE_MPI_TRY(MPI_Ibarrier(native(), &op.request), "mpi_comm"); });
  }

  /// MPI_Comm_split; the new communicator keeps issue order with this one.
  mpi_comm split(int color, int key) {
    if (color < 0)
      detail::raise(error_code::invalid_argument,
                    "mpi_comm: split color " + std::to_string(color) + " is negative; colors are >= 0");
    handle_->order->complete_all();
    MPI_Comm part = MPI_COMM_NULL;
    CHUNKWISE_MPI_TRY(MPI_Comm_split(native(), color, key, &part), "mpi_comm");
    const auto timeout = handle_->watch ? handle_->watch->timeout : std::chrono::milliseconds(0);
    return mpi_comm(adopt_tag{}, part, handle_->order, timeout);
  }

 private:
  struct adopt_tag {};
  mpi_comm(adopt_tag, MPI_Comm comm, std::shared_ptr<detail::mpi_issue_order> order,
           std::chrono::milliseconds timeout) {
    adopt(comm, std::move(order), timeout);
  }

  void adopt(MPI_Comm comm, std::shared_ptr<detail::mpi_issue_order> order, std::chrono::milliseconds timeout) {
    handle_ = std::make_shared<detail::mpi_handle>(comm, std::move(order));
    CHUNKWISE_MPI_TRY(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "mpi_comm");
    CHUNKWISE_MPI_TRY(MPI_Comm_rank(comm, &rank_), "mpi_comm");
    CHUNKWISE_MPI_TRY(MPI_Comm_size(comm, &size_), "mpi_comm");
    if (timeout.count() > 0) handle_->watch = watch_peers(comm, timeout);
  }

  /// Every rank's process id and host name, for the timeout's message (a collective call, at construction).
  std::shared_ptr<detail::peer_watch> watch_peers(MPI_Comm comm, std::chrono::milliseconds timeout) const {
    struct identity {
      std::int64_t pid;
      char host[64];
    };
    identity mine{static_cast<std::int64_t>(::getpid()), {}};
    ::gethostname(mine.host, sizeof mine.host - 1);
    std::vector<identity> all(static_cast<std::size_t>(size_));
    CHUNKWISE_MPI_TRY(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm),
                      "mpi_comm");
    auto watch = std::make_shared<detail::peer_watch>();
    watch->timeout = timeout;
    watch->rank = rank_;
    for (const auto& peer : all) {
      watch->pids.push_back(static_cast<long>(peer.pid));
      watch->hosts.emplace_back(peer.host, ::strnlen(peer.host, sizeof peer.host));
    }
    return watch;
  }

  /// Completes what is in flight (issue order), then posts a new operation with `start`.
  template <class Start>
  request post(std::string what, Start&& start) {
    if (handle_->watch && !handle_->watch->failure.empty())
      detail::raise(error_code::comm_error,
                    "mpi_comm: " + what + " on a failed communicator: " + handle_->watch->failure);
    handle_->order->complete_all();
    auto operation = std::make_shared<detail::mpi_operation>();
    operation->watch = handle_->watch;
    if (handle_->watch) operation->what = std::move(what);
    operation->scratch = std::move(handle_->order->spare);  // sized by start(); its pages already mapped
    handle_->order->spare = {};
    start(*operation);
    if (operation->request == MPI_REQUEST_NULL && !operation->then) operation->done = true;
    handle_->order->in_flight.push_back(operation);
    return request(std::move(operation));
  }

  /// Reduces rank q's `count` elements at received[q * count] for q != me, and this rank's own at `own`.
  template <reducible_element T>
  static void reduce_received(const std::vector<std::byte>& received, std::size_t count, int ranks, T* out,
                              reduce_op op, int me, const T* own) {
    if (count == 0) return;
    std::vector<const T*> sources(static_cast<std::size_t>(ranks));
    for (std::size_t q = 0; q < sources.size(); ++q)
      sources[q] = reinterpret_cast<const T*>(received.data()) + q * count;
    sources[static_cast<std::size_t>(me)] = own;
    detail::reduce_in_rank_order<T>(sources, out, count, op, ranks);
  }

  std::shared_ptr<detail::mpi_handle> handle_;
  int rank_ = 0;
  int size_ = 1;
};

static_assert(communicator<mpi_comm>);

}  // namespace chunkwise

#endif  // CHUNKWISE_HAS_MPI
