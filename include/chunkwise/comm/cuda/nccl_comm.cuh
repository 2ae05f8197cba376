#pragma once
// nccl_comm: ranks as GPUs, through NCCL. Buffers are device memory; every operation is enqueued on the
// communicator's CUDA stream and its request is a CUDA event recorded after it, so the order of effect is the
// stream order (later kernels on the same stream see the result without any host wait) and wait() is needed only
// where the host must know.
//
// Creating one needs rank 0's ncclUniqueId on every rank:
//   - through any communicator:  auto nccl = chunkwise::make_nccl_comm(mpi, stream);     // mpi_comm, thread_comm
//   - through a file:            auto nccl = chunkwise::make_nccl_comm("/shared/job42.ncclid", rank, ranks, stream);
//                                (bootstrap_file.hpp: rank 0 writes atomically, the others poll with a timeout)
//   - as torchrun or srun set:   auto nccl = chunkwise::make_nccl_comm(chunkwise::launcher_environment(), stream);
//                                (launcher.hpp; rank 0 hands the id over TCP at MASTER_ADDR:MASTER_PORT)
// Several chunks' collectives go into one NCCL group (one launch, overlapping transfers):
//   { auto group = nccl.group(); for (...) requests.push_back(nccl.all_gather(shard[c], full[c])); }
//   // the requests of a group complete together, once the group is closed
//
// Reductions are NCCL's: fp32 exactly as thread_comm for 2 ranks (one addition); for more ranks NCCL's ring adds in
// its own order, and for bf16/fp16 it rounds partial sums to 16 bits on each hop, so results agree with the host
// communicators within rounding, not bit for bit. `average` is ncclAvg.
#if CHUNKWISE_HAS_CUDA && CHUNKWISE_HAS_NCCL

#include <chunkwise/comm/bootstrap_file.hpp>
#include <chunkwise/comm/bootstrap_tcp.hpp>
#include <chunkwise/comm/launcher.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/comm/detail/reduce.hpp>
#include <chunkwise/core/cuda/checked_call.cuh>
#include <chunkwise/core/cuda/host_wait.cuh>
#include <chunkwise/core/error.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace chunkwise {

namespace detail {

template <class T>
constexpr ncclDataType_t nccl_type() noexcept {
  if constexpr (std::same_as<T, float>) return ncclFloat32;
  else if constexpr (std::same_as<T, bf16>) return ncclBfloat16;
  else return ncclFloat16;
}

/// A CUDA event without timing, recorded on the communicator's stream after an operation (or a group); a rank
/// waiting for it sleeps (host_wait.cuh). Taken from cuda_event_pool for the current device, given back at the end.
class comm_event {
 public:
  comm_event() {
    CHUNKWISE_CUDA_TRY(cudaGetDevice(&device_), std::string("nccl_comm"));
    event_ = cuda_event_pool::instance().take(device_, "nccl_comm");
  }
  comm_event(const comm_event&) = delete;
  comm_event& operator=(const comm_event&) = delete;
  ~comm_event() { cuda_event_pool::instance().give_back(device_, event_); }
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }
  /// The group that was to launch the operation failed to: the event was never recorded, and CUDA reports an
  /// unrecorded event complete, so the requests must say so themselves.
  void fail() noexcept { failed_ = true; }
  [[nodiscard]] bool failed() const noexcept { return failed_; }

 private:
  int device_ = 0;
  cudaEvent_t event_ = nullptr;
  bool failed_ = false;
};

/// NCCL's groups belong to the calling thread, across communicators: ncclGroupEnd launches the operations only at the
/// outermost close. The events of the requests issued inside (one per communicator) are recorded then.
struct nccl_open_groups {
  struct pending_event {
    const void* comm;
    cudaStream_t stream;
    std::shared_ptr<comm_event> event;
  };
  int depth = 0;
  std::vector<pending_event> pending;
  static nccl_open_groups& of_this_thread() {
    thread_local nccl_open_groups groups;
    return groups;
  }
  [[nodiscard]] bool holds(const std::shared_ptr<comm_event>& event) const {
    for (const auto& p : pending)
      if (p.event == event) return true;
    return false;
  }
};

}  // namespace detail

class nccl_comm {
 public:
  /// Completion of an operation: an event on the communicator's stream. wait() blocks the host; test() polls;
  /// wait_on(stream) makes another stream wait without the host. Default-constructed: complete.
  class request {
   public:
    request() = default;
    void wait() {
      check_launched("wait");
      if (event_) CHUNKWISE_CUDA_TRY(cudaEventSynchronize(event_->get()), std::string("nccl_comm"));
    }
    [[nodiscard]] bool test() {
      check_launched("test");
      if (!event_) return true;
      const cudaError_t state = cudaEventQuery(event_->get());
      if (state == cudaErrorNotReady) return cuda_not_ready();
      CHUNKWISE_CUDA_TRY(state, std::string("nccl_comm"));
      return true;
    }
    void wait_on(cudaStream_t stream) {
      check_launched("wait_on");
      if (event_) CHUNKWISE_CUDA_TRY(cudaStreamWaitEvent(stream, event_->get(), 0), std::string("nccl_comm"));
    }

   private:
    // An operation of a group still open on this thread is not launched: its event is not recorded yet, and CUDA
    // would report an unrecorded event complete.
    void check_launched(const char* what) const {
      if (event_ && event_->failed())
        detail::raise(error_code::comm_error, std::string("nccl_comm: request::") + what +
                                                  ": the group that issued it failed to launch (ncclGroupEnd)");
      if (event_ && detail::nccl_open_groups::of_this_thread().holds(event_))
        detail::raise(error_code::illegal_state, std::string("nccl_comm: request::") + what +
                                                     " inside the group that issued it; close the group first");
    }
    friend class nccl_comm;
    explicit request(std::shared_ptr<detail::comm_event> event) : event_(std::move(event)) {}
    std::shared_ptr<detail::comm_event> event_;
  };

  /// Joins the communicator of `ranks` ranks named by `id` as `rank` (blocks until every rank joined), on the
  /// current CUDA device. `stream` is not owned, and must be ordered with the legacy default stream (nullptr,
  /// cudaStreamPerThread or a stream made without cudaStreamNonBlocking): the runtime's collectives read gradients
  /// that the trainer's kernels wrote there, and write buffers the stream-ordered allocator reuses there, with no
  /// event between.
  nccl_comm(const ncclUniqueId& id, int rank, int ranks, cudaStream_t stream) : stream_(stream) {
    if (ranks < 1 || rank < 0 || rank >= ranks)
      detail::raise(error_code::invalid_argument, "nccl_comm: rank " + std::to_string(rank) + " of " +
                                                      std::to_string(ranks) + " ranks does not exist");
    check_ordered_with_legacy(stream);
    CHUNKWISE_NCCL_TRY(ncclCommInitRank(&comm_, ranks, id, rank), "nccl_comm");
    try {
      finish_setup();
    } catch (...) {
      (void)ncclCommDestroy(std::exchange(comm_, nullptr));
      throw;
    }
  }

  nccl_comm(nccl_comm&& other) noexcept { swap(other); }
  nccl_comm& operator=(nccl_comm&& other) noexcept {
    nccl_comm moved(std::move(other));
    swap(moved);
    return *this;
  }
  nccl_comm(const nccl_comm&) = delete;
  nccl_comm& operator=(const nccl_comm&) = delete;
  ~nccl_comm() {
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  static ncclUniqueId make_unique_id() {
    ncclUniqueId id{};
    CHUNKWISE_NCCL_TRY(ncclGetUniqueId(&id), "nccl_comm");
    return id;
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] ncclComm_t native() const noexcept { return comm_; }

  template <transferable_element T>
  request all_gather(std::span<const T> in, std::span<T> out) {
    detail::check_all_gather("nccl_comm", in, out, rank_, size_);
    CHUNKWISE_NCCL_TRY(ncclAllGather(in.data(), out.data(), in.size_bytes(), ncclUint8, comm_, stream_), "nccl_comm");
    return completed();
  }

  template <reducible_element T>
  request reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    detail::check_reduce_scatter("nccl_comm", in, out, rank_, size_);
    CHUNKWISE_NCCL_TRY(
        ncclReduceScatter(in.data(), out.data(), out.size(), detail::nccl_type<T>(), nccl_op(op), comm_, stream_), "nccl_comm");
    return completed();
  }

  template <reducible_element T>
  request all_reduce(std::span<const T> in, std::span<T> out, reduce_op op) {
    detail::check_all_reduce("nccl_comm", in, out);
    CHUNKWISE_NCCL_TRY(
        ncclAllReduce(in.data(), out.data(), out.size(), detail::nccl_type<T>(), nccl_op(op), comm_, stream_), "nccl_comm");
    return completed();
  }

  template <transferable_element T>
  request broadcast(std::span<T> buffer, int root) {
    detail::check_root("nccl_comm", root, size_);
    CHUNKWISE_NCCL_TRY(ncclBroadcast(buffer.data(), buffer.data(), buffer.size_bytes(), ncclUint8, root, comm_, stream_), "nccl_comm");
    return completed();
  }

  /// NCCL has no barrier: an all-reduce of one device word, which completes on a rank once every rank joined it.
  request barrier() {
    CHUNKWISE_NCCL_TRY(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), "nccl_comm");
    return completed();
  }

  /// ncclCommSplit: the ranks with the same color, ordered by (key, rank), on the same stream (issue order holds).
  nccl_comm split(int color, int key) {
    if (color < 0)
      detail::raise(error_code::invalid_argument,
                    "nccl_comm: split color " + std::to_string(color) + " is negative; colors are >= 0");
    nccl_comm result;
    result.stream_ = stream_;
    CHUNKWISE_NCCL_TRY(ncclCommSplit(comm_, color, key, &result.comm_, nullptr), "nccl_comm");
    result.finish_setup();  // on failure result's destructor destroys the split communicator
    return result;
  }

  /// Collectives issued while a group is open are launched together when it closes (ncclGroupStart/End); their
  /// requests on one communicator share one event, recorded at the close. Groups nest, across communicators too, as
  /// NCCL's do (the calling thread's): everything launches, and the events are recorded, at the outermost close.
  class group_guard {
   public:
    explicit group_guard(nccl_comm& /*comm: NCCL's groups are the thread's*/) {
      CHUNKWISE_NCCL_TRY(ncclGroupStart(), "nccl_comm");
      ++detail::nccl_open_groups::of_this_thread().depth;
    }
    group_guard(const group_guard&) = delete;
    group_guard& operator=(const group_guard&) = delete;
    /// Closes the group (ncclGroupEnd; the outermost one records the requests' events); call it to see errors as
    /// exceptions.
    void close() {
      if (!std::exchange(open_, false)) return;
      auto& groups = detail::nccl_open_groups::of_this_thread();
      const bool outermost = --groups.depth == 0;
      std::vector<detail::nccl_open_groups::pending_event> launched;
      if (outermost) launched.swap(groups.pending);
      const ncclResult_t ended = ncclGroupEnd();
      if (ended != ncclSuccess)
        for (const auto& p : launched) p.event->fail();
      CHUNKWISE_NCCL_TRY(ended, "nccl_comm");
      for (const auto& p : launched)
        CHUNKWISE_CUDA_TRY(cudaEventRecord(p.event->get(), p.stream), std::string("nccl_comm"));
    }
    ~group_guard() {
      try {
        close();
      } catch (...) {  // a destructor cannot throw; call close() to see the error
      }
    }

   private:
    bool open_ = true;
  };
  [[nodiscard]] group_guard group() { return group_guard(*this); }

 private:
  nccl_comm() = default;

  void swap(nccl_comm& other) noexcept {
    std::swap(comm_, other.comm_);
    std::swap(stream_, other.stream_);
    std::swap(rank_, other.rank_);
    std::swap(size_, other.size_);
    std::swap(scratch_, other.scratch_);
  }

  static void check_ordered_with_legacy(cudaStream_t stream) {
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return;
    unsigned flags = 0;
    CHUNKWISE_CUDA_TRY(cudaStreamGetFlags(stream, &flags), std::string("nccl_comm: the stream"));
    if ((flags & cudaStreamNonBlocking) != 0)
      detail::raise(error_code::invalid_argument,
                    "nccl_comm: the stream was made with cudaStreamNonBlocking, so nothing orders the collectives "
                    "after the kernels that write their buffers on the default stream; pass nullptr (the default "
                    "stream) or a stream made with cudaStreamCreate");
  }

  void finish_setup() {
    CHUNKWISE_NCCL_TRY(ncclCommUserRank(comm_, &rank_), "nccl_comm");
    CHUNKWISE_NCCL_TRY(ncclCommCount(comm_, &size_), "nccl_comm");
    CHUNKWISE_CUDA_TRY(cudaMalloc(&scratch_, sizeof(int)), std::string("nccl_comm"));
    CHUNKWISE_CUDA_TRY(cudaMemsetAsync(scratch_, 0, sizeof(int), stream_), std::string("nccl_comm"));
  }

  static ncclRedOp_t nccl_op(reduce_op op) noexcept { return op == reduce_op::sum ? ncclSum : ncclAvg; }

  /// The request of the operation just enqueued: its own event, or this communicator's in the open group.
  request completed() {
    if (auto& groups = detail::nccl_open_groups::of_this_thread(); groups.depth > 0) {
      for (const auto& p : groups.pending)
        if (p.comm == this) return request(p.event);
      groups.pending.push_back({this, stream_, std::make_shared<detail::comm_event>()});
      return request(groups.pending.back().event);
    }
    auto event = std::make_shared<detail::comm_event>();
    CHUNKWISE_CUDA_TRY(cudaEventRecord(event->get(), stream_), std::string("nccl_comm"));
    return request(std::move(event));
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  int* scratch_ = nullptr;  // the barrier's device word
};

static_assert(communicator<nccl_comm>);

/// Its collectives take GPU memory: the runtime gives it device buffers only (runtime/detail/host_exchange.hpp).
template <>
inline constexpr bool reaches_device_memory<nccl_comm> = true;
template <>
inline constexpr bool follows_compute_stream<nccl_comm> = true;  // its stream is ordered with the legacy one

/// Joins an NCCL communicator with the rank and size of `via`, rank 0's unique id broadcast through it (mpi_comm
/// across machines, thread_comm for the GPUs of one process).
template <communicator Bootstrap>
nccl_comm make_nccl_comm(Bootstrap& via, cudaStream_t stream) {
  ncclUniqueId id{};
  if (via.rank() == 0) id = nccl_comm::make_unique_id();
  via.broadcast(std::span<std::byte>(reinterpret_cast<std::byte*>(&id), sizeof id), 0).wait();
  return nccl_comm(id, via.rank(), via.size(), stream);
}

/// Joins an NCCL communicator whose unique id rank 0 publishes in `id_file` (see bootstrap_file.hpp: use a fresh
/// path per job); the other ranks wait up to `timeout` for it.
inline nccl_comm make_nccl_comm(const std::filesystem::path& id_file, int rank, int ranks, cudaStream_t stream,
                                std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
  ncclUniqueId id{};
  if (rank == 0) {
    id = nccl_comm::make_unique_id();
    publish_bootstrap_file(id_file, std::span<const std::byte>(reinterpret_cast<const std::byte*>(&id), sizeof id));
  } else {
    const auto bytes = await_bootstrap_file(id_file, sizeof id, timeout);
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  return nccl_comm(id, rank, ranks, stream);
}

/// Joins an NCCL communicator as the launcher started this process (launcher.hpp: torchrun's RANK, WORLD_SIZE,
/// MASTER_ADDR, MASTER_PORT; or srun's ranks with MASTER_PORT set): rank 0 hands its unique id to the others over
/// TCP at MASTER_ADDR:MASTER_PORT (bootstrap_tcp.hpp). `stream` is on this process's GPU: cudaSetDevice(
/// launcher.local_rank) before creating it, one GPU per process on each machine.
inline nccl_comm make_nccl_comm(const launcher_ranks& launcher, cudaStream_t stream,
                                std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
  if (launcher.size > 1 && (launcher.master_address.empty() || launcher.master_port == 0))
    detail::raise(error_code::invalid_argument,
                  "make_nccl_comm: " + std::to_string(launcher.size) + " ranks (launcher: " + launcher.launcher +
                      ") need a rendezvous: set MASTER_ADDR (rank 0's machine) and MASTER_PORT (a free TCP port)");
  ncclUniqueId id{};
  const std::span<std::byte> bytes(reinterpret_cast<std::byte*>(&id), sizeof id);
  if (launcher.rank == 0) {
    id = nccl_comm::make_unique_id();
    if (launcher.size > 1) serve_bootstrap_tcp(launcher.master_port, bytes, launcher.size, timeout);
  } else {
    const auto received = fetch_bootstrap_tcp(launcher.master_address, launcher.master_port, launcher.rank, sizeof id,
                                              timeout);
    std::memcpy(&id, received.data(), sizeof id);
  }
  return nccl_comm(id, launcher.rank, launcher.size, stream);
}

}  // namespace chunkwise

#endif  // CHUNKWISE_HAS_CUDA && CHUNKWISE_HAS_NCCL
