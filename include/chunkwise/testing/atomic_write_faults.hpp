#pragma once
// Fault injection for write_file_atomically (tests only). Std only.
#include <cerrno>
#include <cstddef>

namespace chunkwise::testing {

/// Faults for write_file_atomically (tests): each replaces a system call's outcome with a failure. 0: no fault.
struct atomic_write_faults {
  std::size_t write_fails_after = static_cast<std::size_t>(-1);  // bytes written before write() fails
  int write_error = ENOSPC;                                     // errno of that failure
  int fsync_error = 0;                                          // fsync of the temporary file fails with it
  int rename_error = 0;                                         // rename over the target fails with it
};

}  // namespace chunkwise::testing
