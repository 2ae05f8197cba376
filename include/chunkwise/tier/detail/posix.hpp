#pragma once
// Checked POSIX calls: a failure becomes chunkwise::error naming the call, errno's text and the context.
#include <chunkwise/core/error.hpp>

#include <cerrno>
#include <cstring>
#include <string>

namespace chunkwise::inline CHUNKWISE_ABI::detail {

[[noreturn]] inline void raise_posix(const char* call, int error_number, const std::string& context,
                                     error_code code = error_code::io_error) {
  raise(code, context + ": " + call + " failed: " + std::strerror(error_number) + " (errno " +
                  std::to_string(error_number) + ")");
}

}  // namespace chunkwise::detail
