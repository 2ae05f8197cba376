#pragma once
// The calling thread's current CUDA device: what the CUDA backend and device tier use unless given one, so a process
// that picked its GPU (cudaSetDevice(local rank), one process per GPU) keeps it.
#include <chunkwise/core/cuda/checked_call.cuh>

#include <cuda_runtime.h>

#include <string>

namespace chunkwise::detail {

/// `device` itself, or the current device where it is `use_current_device` (-1).
inline constexpr int use_current_device = -1;
inline int resolve_cuda_device(int device, const char* context) {
  if (device != use_current_device) return device;
  int current = 0;
  CHUNKWISE_CUDA_TRY(cudaGetDevice(&current), std::string(context) + ": the current device");
  return current;
}

/// Restores the calling thread's current device on scope exit (code that visits every GPU leaves it as it found it).
class current_device_guard {
 public:
  explicit current_device_guard(const char* context) : device_(resolve_cuda_device(use_current_device, context)) {}
  current_device_guard(const current_device_guard&) = delete;
  current_device_guard& operator=(const current_device_guard&) = delete;
  ~current_device_guard() { (void)cudaSetDevice(device_); }
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  int device_;
};

}  // namespace chunkwise::detail
