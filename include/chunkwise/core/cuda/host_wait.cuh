#pragma once
// How host threads wait for the GPU: asleep, not spinning. CUDA's default (cudaDeviceScheduleAuto, one context on a
// machine of many cores) spins a core for every waiting thread. The runtime's waiters (the transfer engine's movers,
// the gradient pipeline, the optimizer stage's worker in cuda_adam, ranks waiting for NCCL) wait while the SIMD CPU
// Adam of offloaded states runs on every core in equal shares: a spinning waiter on one of those cores holds back
// that share, and the whole update with it. A blocking wait costs a wake-up (microseconds) instead, small beside the
// copies and kernels of a chunk it waits for.
#include <chunkwise/core/cuda/checked_call.cuh>

#include <cuda_runtime.h>

#include <string>

namespace chunkwise {

/// The flags of an event a host thread may wait for: no timing, and cudaEventSynchronize sleeps until it completes.
inline constexpr unsigned host_waited_event_flags = cudaEventDisableTiming | cudaEventBlockingSync;

/// An event for host_wait_for_stream, made once and reused (record overwrites it).
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

}  // namespace chunkwise
