#pragma once
// Helpers shared by tests/tier_test.cpp and tests/placement_test.cpp: a temporary directory that removes itself, and
// deterministic random chunk contents.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>

namespace chunkwise::test {

/// "code: message" of the chunkwise::error `call` throws, or "no error".
inline std::string message_of(const auto& call) {
  try {
    call();
  } catch (const chunkwise::error& e) {
    return std::string(to_string(e.code())) + ": " + e.what();
  }
  return "no error";
}

class temp_dir {
 public:
  temp_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/chunkwise-tier-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

/// Fills `bytes` at `data` with the pseudo-random stream of `seed`.
inline void fill_random(void* data, byte_count bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* out = static_cast<unsigned char*>(data);
  byte_count i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const std::uint64_t word = rng();
    std::memcpy(out + i, &word, 8);
  }
  for (; i < bytes; ++i) out[i] = static_cast<unsigned char>(rng());
}

/// True when `bytes` at `data` are exactly the stream of `seed`.
inline bool matches_random(const void* data, byte_count bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto* in = static_cast<const unsigned char*>(data);
  byte_count i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const std::uint64_t word = rng();
    if (std::memcmp(in + i, &word, 8) != 0) return false;
  }
  for (; i < bytes; ++i)
    if (in[i] != static_cast<unsigned char>(rng())) return false;
  return true;
}

}  // namespace chunkwise::test
