#pragma once
// The CUDA members of the checked-call family (core/checked_call.hpp): CUDA runtime, cuBLAS and, where the build has
// NCCL, NCCL calls. A failure throws chunkwise::error naming the context, the call, the API's text and code name and
// file:line, as RMM_CUDA_TRY does; cudaErrorMemoryAllocation and CUBLAS_STATUS_ALLOC_FAILED are out_of_memory.
#include <chunkwise/core/checked_call.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#if CHUNKWISE_HAS_NCCL
#include <nccl.h>
#endif

#include <string>

namespace chunkwise {

inline call_code cuda_code(cudaError_t status) {
  return {status == cudaErrorMemoryAllocation ? error_code::out_of_memory : error_code::unsupported,
          cudaGetErrorString(status), cudaGetErrorName(status)};
}

inline const char* cublas_status_name(cublasStatus_t status) noexcept {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

inline call_code cublas_code(cublasStatus_t status) {
  return {status == CUBLAS_STATUS_ALLOC_FAILED ? error_code::out_of_memory : error_code::unsupported,
          "cuBLAS status " + std::to_string(static_cast<int>(status)), cublas_status_name(status)};
}

#if CHUNKWISE_HAS_NCCL
/// NCCL's text for the code, followed by its last error message (which names the peer or the transport).
inline call_code nccl_code(ncclResult_t result) {
  std::string text = ncclGetErrorString(result);
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0') {
    text += ": ";
    text += last;
  }
  return {error_code::comm_error, text, "ncclResult_t " + std::to_string(static_cast<int>(result))};
}
#endif

}  // namespace chunkwise

/// An event or stream query's "not yet" (false): cudaErrorNotReady is also left as the thread's last error, which the
/// next kernel launch's check (cudaGetLastError) would report as its own failure; cleared here, as PyTorch does (and
/// only that: another error left there is the next check's to report).
inline bool cuda_not_ready() noexcept {
  if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
  return false;
}

/// A CUDA runtime call; `context` names what it was for (a tier, a chunk).
#define CHUNKWISE_CUDA_TRY(call, context)                                                                        \
  do {                                                                                                           \
    if (const cudaError_t chunkwise_cuda_status_ = (call); chunkwise_cuda_status_ != cudaSuccess)                \
      ::chunkwise::throw_call_failure(::chunkwise::cuda_code(chunkwise_cuda_status_), #call, (context), __FILE__, \
                                      __LINE__);                                                                 \
  } while (0)

/// A cuBLAS call.
#define CHUNKWISE_CUBLAS_TRY(call, context)                                                                         \
  do {                                                                                                              \
    if (const cublasStatus_t chunkwise_cublas_status_ = (call); chunkwise_cublas_status_ != CUBLAS_STATUS_SUCCESS)  \
      ::chunkwise::throw_call_failure(::chunkwise::cublas_code(chunkwise_cublas_status_), #call, (context), __FILE__, \
                                      __LINE__);                                                                    \
  } while (0)

#if CHUNKWISE_HAS_NCCL
/// An NCCL call; errors are comm_error.
#define CHUNKWISE_NCCL_TRY(call, context)                                                                       \
  do {                                                                                                          \
    if (const ncclResult_t chunkwise_nccl_result_ = (call); chunkwise_nccl_result_ != ncclSuccess)              \
      ::chunkwise::throw_call_failure(::chunkwise::nccl_code(chunkwise_nccl_result_), #call, (context), __FILE__, \
                                      __LINE__);                                                                \
  } while (0)
#endif
