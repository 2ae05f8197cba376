#pragma once
// Byte counts: one unsigned 64-bit type, binary-unit literals (64_MiB) and human formatting ("1.50 GiB").
#include <cstdint>
#include <cstdio>
#include <string>

namespace chunkwise {

using byte_count = std::uint64_t;

inline constexpr byte_count KiB = 1024;
inline constexpr byte_count MiB = 1024 * KiB;
inline constexpr byte_count GiB = 1024 * MiB;
inline constexpr byte_count TiB = 1024 * GiB;

inline namespace literals {
consteval byte_count operator""_B(unsigned long long n) { return n; }
consteval byte_count operator""_KiB(unsigned long long n) { return n * KiB; }
consteval byte_count operator""_MiB(unsigned long long n) { return n * MiB; }
consteval byte_count operator""_GiB(unsigned long long n) { return n * GiB; }
consteval byte_count operator""_TiB(unsigned long long n) { return n * TiB; }
}  // namespace literals

/// Smallest multiple of `granule` that is >= `n` (granule > 0).
constexpr byte_count round_up(byte_count n, byte_count granule) noexcept {
  return (n + granule - 1) / granule * granule;
}
constexpr byte_count div_ceil(byte_count n, byte_count d) noexcept { return (n + d - 1) / d; }

/// "0 B", "512 B", "1.50 KiB", "64.00 MiB", "3.20 GiB": two decimals in the largest unit that keeps the value >= 1.
inline std::string format_bytes(byte_count n) {
  constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (n < 1024) return std::to_string(n) + " B";
  double value = static_cast<double>(n);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.2f %s", value, units[unit]);
  return text;
}

/// Parses "64MiB", "24 GiB", "1.5GB", "4096", "16KB": binary units (KiB...) are powers of 1024, decimal ones (KB, GB)
/// powers of 1000, as storage vendors use them. Throws chunkwise::error naming the text when it is not a size.
byte_count parse_bytes(const std::string& text);

/// Parses a whole non-negative decimal integer ("42"); throws chunkwise::error naming `what` (a flag, a field) and the
/// text otherwise.
std::uint64_t parse_count(const std::string& text, const std::string& what);

}  // namespace chunkwise

#include <chunkwise/core/detail/parse_bytes.hpp>
