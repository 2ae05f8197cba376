#pragma once
// How host threads wait for the GPU: asleep, not spinning. CUDA's default (cudaDeviceScheduleAuto, one context on a
// machine of many cores) spins a core for every waiting thread. The runtime's waiters (the transfer engine's movers,
// the gradient pipeline, the optimizer stage's worker in cuda_adam, ranks waiting for NCCL) wait while the SIMD CPU
// Adam of offloaded states runs on every core in equal shares: a spinning waiter on one of those cores holds back
// that share, and the whole update with it. A blocking wait costs a wake-up (microseconds) instead, small beside the
// copies and kernels of a chunk it waits for.
#include <chunkwise/core/cuda/checked_call.cuh>

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace chunkwise {

/// The flags of an event a host thread may wait for: no timing, and cudaEventSynchronize sleeps until it completes.
inline constexpr unsigned host_waited_event_flags = cudaEventDisableTiming | cudaEventBlockingSync;

/// An event of one's own to wait for a stream with, made once and reused (record overwrites it).
class host_wait_event {
 public:
  explicit host_wait_event(const std::string& context) {
    CHUNKWISE_CUDA_TRY(cudaEventCreateWithFlags(&event_, host_waited_event_flags), context);
  }
  host_wait_event(const host_wait_event&) = delete;
  host_wait_event& operator=(const host_wait_event&) = delete;
  ~host_wait_event() { (void)cudaEventDestroy(event_); }

  /// Returns once the work queued on `stream` before this call has run, the calling thread asleep meanwhile (as
  /// cudaStreamSynchronize, which spins).
  void wait_for_stream(cudaStream_t stream, const std::string& context) {
    CHUNKWISE_CUDA_TRY(cudaEventRecord(event_, stream), context);
    CHUNKWISE_CUDA_TRY(cudaEventSynchronize(event_), context);
  }

 private:
  cudaEvent_t event_ = nullptr;
};

namespace detail {

/// Events a host thread may wait for (host_waited_event_flags), kept for reuse, per device (an event belongs to the
/// device current when it was made): the CUDA backend's records and nccl_comm's requests take them. Making one per
/// record costs a driver call, and a blocking-sync event an OS wait object too. An event comes back when its user is
/// done with it; a stream already told to wait for it keeps waiting for that record, whatever is recorded into it
/// later (cudaStreamWaitEvent takes the event's state at the call).
class cuda_event_pool {
 public:
  /// Never destroyed: handles may outlive static destruction, and the driver frees the events with the context.
  static cuda_event_pool& instance() {
    static auto* pool = new cuda_event_pool;
    return *pool;
  }
  cudaEvent_t take(int device, const std::string& context) {
    {
      const std::lock_guard lock(mutex_);
      if (auto& free = free_[device]; !free.empty()) {
        const cudaEvent_t event = free.back();
        free.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    CHUNKWISE_CUDA_TRY(cudaEventCreateWithFlags(&event, host_waited_event_flags), context);
    return event;
  }
  void give_back(int device, cudaEvent_t event) noexcept {
    try {
      const std::lock_guard lock(mutex_);
      free_[device].push_back(event);
    } catch (...) {
      (void)cudaEventDestroy(event);  // no room to keep it
    }
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<cudaEvent_t>> free_;
};

}  // namespace detail

}  // namespace chunkwise
