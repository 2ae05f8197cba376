#pragma once
// chunkwise::error: the one exception type. A code for programs, a message for people that says what was asked,
// what exists and what would fit.
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

namespace chunkwise {

enum class error_code : std::uint8_t {
  invalid_argument,  // a parameter out of range (ranks = 0, a negative budget, an unknown name)
  invalid_profile,   // a model or machine profile that is inconsistent (empty, zero-sized tensor, bad index)
  parse_error,       // a file that is not valid JSON or misses a field
  layout_error,      // tensors that cannot be packed under the asked chunk size
  out_of_memory,     // a byte budget that cannot hold what was asked
  io_error,          // a failed file or device call
  comm_error,        // a collective that failed or timed out
  illegal_state,     // a chunk transition that the life cycle forbids
  unsupported,       // a combination the build or machine does not provide
};

constexpr std::string_view to_string(error_code code) noexcept {
  switch (code) {
    case error_code::invalid_argument: return "invalid_argument";
    case error_code::invalid_profile: return "invalid_profile";
    case error_code::parse_error: return "parse_error";
    case error_code::layout_error: return "layout_error";
    case error_code::out_of_memory: return "out_of_memory";
    case error_code::io_error: return "io_error";
    case error_code::comm_error: return "comm_error";
    case error_code::illegal_state: return "illegal_state";
    case error_code::unsupported: return "unsupported";
  }
  return "unknown";
}

class error : public std::runtime_error {
 public:
  error(error_code code, const std::string& message) : std::runtime_error(prefixed(message)), code_(code) {}
  [[nodiscard]] error_code code() const noexcept { return code_; }

 private:
  static std::string prefixed(const std::string& message) {
    std::string text = "chunkwise: ";
    text += message;
    return text;
  }
  error_code code_;
};

/// Out of memory: a byte budget (of a tier, the device, the planner) that cannot hold what was asked. Also a
/// std::bad_alloc, so code written for allocators (RMM's `out_of_memory : bad_alloc`) sees it as one.
/// Its two std::exception bases make a `catch (const std::exception&)` ambiguous, so such a handler does not take it:
/// catch `chunkwise::error` (every chunkwise failure) or `std::bad_alloc` before a generic std::exception handler.
class out_of_memory final : public error, public std::bad_alloc {
 public:
  explicit out_of_memory(const std::string& message) : error(error_code::out_of_memory, message) {}
  [[nodiscard]] const char* what() const noexcept override { return error::what(); }
};

/// Throws the error of `code`: an `out_of_memory` for error_code::out_of_memory, a plain `error` otherwise. What
/// chunkwise itself throws through; user code may call it too, or throw `error` directly.
[[noreturn]] inline void throw_error(error_code code, const std::string& message) {
  if (code == error_code::out_of_memory) throw out_of_memory(message);
  throw error(code, message);
}

namespace detail {
// Called from constexpr functions on their error path: a throw during constant evaluation stops compilation at
// this call, and at run time it raises the error. Keeping the string work here keeps constexpr bodies clang-friendly.
[[noreturn]] inline void raise(error_code code, const std::string& message) { throw_error(code, message); }
}  // namespace detail

}  // namespace chunkwise
