#pragma once
// Shared by the libFuzzer targets: a check that reports and aborts (libFuzzer then saves the input as a crash),
// and the JSON front end every loader target goes through.
#include <chunkwise/core/error.hpp>
#include <chunkwise/profile/detail/json_fields.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

namespace chunkwise::fuzz {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::abort();
}

#define CHUNKWISE_FUZZ_CHECK(condition, what)                                                           \
  do {                                                                                                   \
    if (!(condition))                                                                                    \
      ::chunkwise::fuzz::fail(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #condition \
                              " failed: " + std::string(what));                                          \
  } while (0)

/// Runs `body`; a chunkwise::error is an accepted outcome (returns false), any other exception is a finding.
template <class Body>
bool accepted(Body&& body, const char* stage) {
  try {
    body();
    return true;
  } catch (const chunkwise::error& e) {
    CHUNKWISE_FUZZ_CHECK(std::string_view(e.what()).size() > 10, std::string(stage) + ": error without a message");
    return false;
  } catch (const nlohmann::json::exception& e) {
    fail(std::string(stage) + ": a nlohmann::json exception escaped the loader (it must become chunkwise::error): " +
         e.what());
  } catch (const std::exception& e) {
    fail(std::string(stage) + ": unexpected exception: " + e.what());
  }
}

/// Our JSON front end (what load_model_profile / load_machine_profile use on a file's text).
inline std::optional<nlohmann::json> parse(std::string_view text) {
  std::optional<nlohmann::json> document;
  if (!accepted([&] { document = chunkwise::detail::parse_json_text(text, "fuzz input"); }, "parse_json_text"))
    return std::nullopt;
  return document;
}

}  // namespace chunkwise::fuzz
