#pragma once
// CHUNKWISE_CUDA_TRY: a failing CUDA runtime call becomes chunkwise::error naming the call, the error's name and text,
// file:line and the context (which tier, which chunk), as RMM_CUDA_TRY does.
#include <chunkwise/core/error.hpp>

#include <cuda_runtime.h>

#include <string>

namespace chunkwise::inline CHUNKWISE_ABI::detail {

[[noreturn]] inline void raise_cuda(cudaError_t status, const char* call, const char* file, int line,
                                    const std::string& context) {
  const error_code code =
      status == cudaErrorMemoryAllocation ? error_code::out_of_memory : error_code::unsupported;
  raise(code, context + ": " + call + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                  ") at " + file + ":" + std::to_string(line));
}

}  // namespace chunkwise::detail

#ifndef CHUNKWISE_CUDA_TRY
/// Evaluates a CUDA runtime call; on failure throws chunkwise::error naming the call and `context` (a std::string).
#define CHUNKWISE_CUDA_TRY(call, context)                                                          \
  do {                                                                                             \
    const cudaError_t chunkwise_cuda_status_ = (call);                                             \
    if (chunkwise_cuda_status_ != cudaSuccess)                                                     \
      ::chunkwise::detail::raise_cuda(chunkwise_cuda_status_, #call, __FILE__, __LINE__, (context)); \
  } while (0)
#endif
