#pragma once
// The CUDA backend: dedicated non-blocking host-to-device and device-to-host streams, copies with cudaMemcpyAsync,
// completions as cudaEvent_t (timing disabled; a host thread waiting for one sleeps: host_wait.cuh). Models the same
// `backend` concept as the host backend.
#include <chunkwise/backend/concepts.hpp>
#include <chunkwise/core/cuda/checked_call.cuh>
#include <chunkwise/core/cuda/current_device.cuh>
#include <chunkwise/core/cuda/host_wait.cuh>
#include <chunkwise/core/bytes.hpp>

#include <cuda_runtime.h>

#include <memory>
#include <string>

namespace chunkwise {

/// A shared handle to a recorded cudaEvent_t of detail::cuda_event_pool; a default-constructed event is complete.
class cuda_event {
 public:
  cuda_event() = default;
  /// `event` (of `device`) goes back to detail::cuda_event_pool with the last copy of this handle.
  cuda_event(cudaEvent_t event, int device)
      : event_(new cudaEvent_t(event), [device](cudaEvent_t* e) {
          detail::cuda_event_pool::instance().give_back(device, *e);
          delete e;
        }) {}
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_ ? *event_ : nullptr; }
  [[nodiscard]] explicit operator bool() const noexcept { return static_cast<bool>(event_); }

 private:
  std::shared_ptr<cudaEvent_t> event_;
};

/// An event recorded on `stream` now: it completes once the work queued there before it has run. `stream` must belong
/// to the calling thread's current device (or be a default stream). `context` names the caller in an error.
inline cuda_event record_cuda_event(cudaStream_t stream, const std::string& context) {
  int device = 0;
  CHUNKWISE_CUDA_TRY(cudaGetDevice(&device), context);
  cuda_event event(detail::cuda_event_pool::instance().take(device, context), device);
  CHUNKWISE_CUDA_TRY(cudaEventRecord(event.get(), stream), context);
  return event;
}

class cuda_backend {
 public:
  using stream_ref = cudaStream_t;
  using event_type = cuda_event;
  static constexpr const char* name = "cuda";

  /// On `device`, or the calling thread's current one (which a process sharing a machine's GPUs picked).
  explicit cuda_backend(int device = detail::use_current_device)
      : device_(detail::resolve_cuda_device(device, "cuda backend")) {
    const std::string context = "cuda backend on device " + std::to_string(device_);
    CHUNKWISE_CUDA_TRY(cudaSetDevice(device_), context);
    CHUNKWISE_CUDA_TRY(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking), context + " (host-to-device stream)");
    const cudaError_t status = cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking);
    if (status != cudaSuccess) {
      (void)cudaStreamDestroy(h2d_);
      throw_call_failure(cuda_code(status), "cudaStreamCreateWithFlags", context + " (device-to-host stream)", __FILE__, __LINE__);
    }
  }
  cuda_backend(const cuda_backend&) = delete;
  cuda_backend& operator=(const cuda_backend&) = delete;
  ~cuda_backend() {
    (void)cudaStreamSynchronize(h2d_);
    (void)cudaStreamSynchronize(d2h_);
    (void)cudaStreamDestroy(h2d_);
    (void)cudaStreamDestroy(d2h_);
  }

  [[nodiscard]] cudaStream_t h2d() const noexcept { return h2d_; }
  [[nodiscard]] cudaStream_t d2h() const noexcept { return d2h_; }
  /// The trainer's kernels' stream: the legacy default stream, which every blocking stream (the per-thread default
  /// stream of code built with --default-stream per-thread included) is ordered with; not a non-blocking stream.
  [[nodiscard]] cudaStream_t compute() const noexcept { return cudaStreamLegacy; }
  [[nodiscard]] int device() const noexcept { return device_; }

  void copy_async(cudaStream_t stream, void* dst, const void* src, byte_count bytes) {
    CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream),
                       "cuda backend: copy of " + format_bytes(bytes));
  }
  cuda_event record(cudaStream_t stream) { return record_cuda_event(stream, "cuda backend"); }
  void wait_on(cudaStream_t stream, const cuda_event& event) {
    if (event) CHUNKWISE_CUDA_TRY(cudaStreamWaitEvent(stream, event.get(), 0), std::string("cuda backend"));
  }
  bool ready(const cuda_event& event) const {
    if (!event) return true;
    const cudaError_t status = cudaEventQuery(event.get());
    if (status == cudaErrorNotReady) return cuda_not_ready();
    if (status != cudaSuccess) throw_call_failure(cuda_code(status), "cudaEventQuery", "cuda backend", __FILE__, __LINE__);
    return true;
  }
  void wait(const cuda_event& event) const {
    if (event) CHUNKWISE_CUDA_TRY(cudaEventSynchronize(event.get()), std::string("cuda backend"));
  }
  void bind_thread() { CHUNKWISE_CUDA_TRY(cudaSetDevice(device_), "cuda backend: worker thread on device " + std::to_string(device_)); }
  void synchronize(cudaStream_t stream) {
    CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(stream), std::string("cuda backend"));
  }

 private:
  int device_;
  cudaStream_t h2d_ = nullptr;
  cudaStream_t d2h_ = nullptr;
};

static_assert(backend<cuda_backend>);

}  // namespace chunkwise
