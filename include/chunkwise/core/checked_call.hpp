#pragma once
// Checked calls: one family for every foreign API chunkwise calls (POSIX, io_uring, MPI, CUDA, NCCL, cuBLAS). A failed
// call becomes a chunkwise::error whose message names the context (which tier, chunk, file, communicator), the call
// as written, the API's text and name for the code, and the place:
//     "<context>: <call> failed: <text> (<code name>) at <file>:<line>"
// An API's allocation failure (ENOMEM, cudaErrorMemoryAllocation, ...) is an out_of_memory, also a std::bad_alloc.
// Each API contributes only how to read its code (`posix_code`, and `cuda_code`, `nccl_code`, `cublas_code` in
// core/cuda/checked_call.cuh, `mpi_code` in core/mpi_checked_call.hpp); the message and the throw are here, once.
// Host code sees no CUDA or MPI header. Destructors and noexcept paths must not use these: they assert instead.
//
//   CHUNKWISE_POSIX_TRY(::fsync(fd), "checkpoint '" + path + "'");     // -1 and errno
//   CHUNKWISE_URING_TRY(io_uring_queue_init(8, &ring, 0), "NVMe tier");  // -errno
#include <chunkwise/core/error.hpp>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

namespace chunkwise {

/// A failed call's code as its API names it: what becomes of it (`kind`), its text and its symbolic name.
struct call_code {
  error_code kind = error_code::io_error;
  std::string text;  // "Input/output error", "out of memory"
  std::string name;  // "EIO, errno 5", "cudaErrorMemoryAllocation"
};

/// Throws the error of a failed call. `file` may be null (the call site is not a macro); `context` may be empty.
[[noreturn]] inline void throw_call_failure(const call_code& code, std::string_view call, std::string_view context,
                                            const char* file = nullptr, int line = 0) {
  std::string message;
  if (!context.empty()) {
    message += context;
    message += ": ";
  }
  message += call;
  message += " failed: ";
  message += code.text;
  message += " (";
  message += code.name;
  message += ')';
  if (file != nullptr) {
    message += " at ";
    message += file;
    message += ':';
    message += std::to_string(line);
  }
  throw_error(code.kind, message);
}

/// errno as a call_code: ENOMEM is out of memory, every other errno `kind` (an I/O error unless the caller knows
/// better).
inline call_code posix_code(int error_number, error_code kind = error_code::io_error) {
  call_code code{error_number == ENOMEM ? error_code::out_of_memory : kind, std::strerror(error_number), {}};
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* name = ::strerrorname_np(error_number)) {
    code.name = name;
    code.name += ", ";
  }
#endif
  code.name += "errno " + std::to_string(error_number);
  return code;
}

/// A POSIX call that failed with `error_number`, where the call site handles errno itself (retries, fault injection).
[[noreturn]] inline void throw_posix_failure(std::string_view call, int error_number, std::string_view context,
                                             error_code kind = error_code::io_error) {
  throw_call_failure(posix_code(error_number, kind), call, context);
}

}  // namespace chunkwise

/// A POSIX call that returns -1 and sets errno on failure. Evaluates to nothing; `context` is any string expression.
#define CHUNKWISE_POSIX_TRY(call, context)                                                                      \
  do {                                                                                                          \
    if ((call) == -1) {                                                                                         \
      const int chunkwise_errno_ = errno;                                                                       \
      ::chunkwise::throw_call_failure(::chunkwise::posix_code(chunkwise_errno_), #call, (context), __FILE__, __LINE__); \
    }                                                                                                           \
  } while (0)

/// A liburing call that returns -errno on failure (io_uring_queue_init, io_uring_submit, io_uring_wait_cqe, ...).
#define CHUNKWISE_URING_TRY(call, context)                                                                      \
  do {                                                                                                          \
    if (const int chunkwise_uring_rc_ = (call); chunkwise_uring_rc_ < 0)                                        \
      ::chunkwise::throw_call_failure(::chunkwise::posix_code(-chunkwise_uring_rc_), #call, (context), __FILE__, __LINE__); \
  } while (0)
