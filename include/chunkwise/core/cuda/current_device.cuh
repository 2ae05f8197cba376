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

}  // namespace chunkwise::detail
