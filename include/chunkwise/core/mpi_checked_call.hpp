#pragma once
// The MPI member of the checked-call family (core/checked_call.hpp), where the build has MPI (the `chunkwise::mpi`
// component): communicators are set to MPI_ERRORS_RETURN, and a failed call throws comm_error with MPI's text.
#include <chunkwise/core/checked_call.hpp>

#if CHUNKWISE_HAS_MPI
// Only the C API: skip the deprecated C++ bindings (warnings, compile time).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

namespace chunkwise {

inline call_code mpi_code(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  int error_class = code;
  (void)MPI_Error_class(code, &error_class);
  return {error_code::comm_error, std::string(text, static_cast<std::size_t>(length)),
          "MPI error class " + std::to_string(error_class)};
}

}  // namespace chunkwise

/// An MPI call; `context` names the communicator or the operation.
#define CHUNKWISE_MPI_TRY(call, context)                                                                            \
  do {                                                                                                              \
    if (const int chunkwise_mpi_code_ = (call); chunkwise_mpi_code_ != MPI_SUCCESS)                                 \
      ::chunkwise::throw_call_failure(::chunkwise::mpi_code(chunkwise_mpi_code_), #call, (context), __FILE__, __LINE__); \
  } while (0)
#endif
