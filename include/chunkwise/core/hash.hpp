#pragma once
// fnv1a: the one non-cryptographic hash of chunkwise (64-bit FNV-1a), for identities compared across ranks, runs and
// files: the tensor list a checkpoint was saved for, the plan the ranks agree on, the machine a cached profile
// belongs to. Stable across platforms and builds (unlike std::hash), constexpr, and continued by feeding more.
// Not a checksum for data: bytes on disk carry CRC-32C (core/checksum.hpp).
#include <cstdint>
#include <string_view>

namespace chunkwise {

class fnv1a {
 public:
  // Not the published basis (14695981039346656037): the first version lost its last digit, and checkpoints and
  // machine caches already carry hashes made with this one, so it stays. Any odd basis hashes as well.
  static constexpr std::uint64_t offset_basis = 1469598103934665603ull;
  static constexpr std::uint64_t prime = 1099511628211ull;

  constexpr fnv1a() noexcept = default;
  constexpr explicit fnv1a(std::uint64_t state) noexcept : state_(state) {}

  /// One value, taken as a single unit (not byte by byte): a count, a size, a knob.
  constexpr fnv1a& add(std::uint64_t value) noexcept {
    state_ = (state_ ^ value) * prime;
    return *this;
  }
  /// Every character of `text`, one by one.
  constexpr fnv1a& add(std::string_view text) noexcept {
    for (const char c : text) add(static_cast<unsigned char>(c));
    return *this;
  }
  [[nodiscard]] constexpr std::uint64_t value() const noexcept { return state_; }

 private:
  std::uint64_t state_ = offset_basis;
};

static_assert(fnv1a().add("a").value() == 0x44bd8ad473cd9906ull, "the hash of \"a\" that saved files carry");

}  // namespace chunkwise
