#pragma once
// What the contract suites check of a failure: that a call throws chunkwise::error with a given code and a message
// that names what it should (a count, a name). Thread-safe (doctest assertions are), so ranks may use it.
#include <chunkwise/core/error.hpp>

#include <doctest/doctest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

namespace chunkwise::test {

/// Calls f(); CHECKs that it throws chunkwise::error of `code` whose message contains every one of `parts`.
/// Returns the message ("" when nothing was thrown; anything else thrown propagates). Not a template: its
/// assertions are compiled once, whatever the callers.
inline std::string expect_error(const std::function<void()>& f, error_code code,
                                std::initializer_list<std::string_view> parts = {}) {
  try {
    f();
  } catch (const error& e) {
    const std::string message = e.what();
    CAPTURE(message);
    CHECK(e.code() == code);
    for (const std::string_view part : parts) {
      CAPTURE(part);
      CHECK(message.find(part) != std::string::npos);
    }
    return message;
  }
  FAIL_CHECK("expected chunkwise::error (" << std::string(to_string(code)) << "), nothing was thrown");
  return {};
}

}  // namespace chunkwise::test
