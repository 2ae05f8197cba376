#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every NVMe block and checkpoint piece. SSE4.2's crc32
// instruction (through a target attribute, chosen at run time) with a table-driven fallback; both give the standard
// check value crc32c("123456789") == 0xE3069283. Chainable: crc32c(b, crc32c(a)) == crc32c(a followed by b).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define CHUNKWISE_CRC32C_X86 1
#else
#define CHUNKWISE_CRC32C_X86 0
#endif

namespace chunkwise {

namespace detail {

inline constexpr std::uint32_t crc32c_polynomial = 0x82F63B78u;

constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t byte = 0; byte < 256; ++byte) {
    std::uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? crc32c_polynomial : 0u);
    table[byte] = crc;
  }
  return table;
}
inline constexpr std::array<std::uint32_t, 256> crc32c_table = make_crc32c_table();

/// Table-driven CRC-32C on the raw (not inverted) state. Portable; about 0.5 GB/s.
constexpr std::uint32_t crc32c_table_update(std::uint32_t state, const unsigned char* data, std::size_t size) noexcept {
  for (std::size_t i = 0; i < size; ++i) state = (state >> 8) ^ crc32c_table[(state ^ data[i]) & 0xFFu];
  return state;
}

#if CHUNKWISE_CRC32C_X86
/// SSE4.2 CRC-32C on the raw state: 8 bytes per instruction (about 8 GB/s on one core).
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_sse42_update(std::uint32_t state,
                                                                          const unsigned char* data,
                                                                          std::size_t size) noexcept {
  std::uint64_t wide = state;
  while (size >= 8) {
    std::uint64_t word;
    std::memcpy(&word, data, 8);
    wide = _mm_crc32_u64(wide, word);
    data += 8;
    size -= 8;
  }
  auto narrow = static_cast<std::uint32_t>(wide);
  while (size > 0) {
    narrow = _mm_crc32_u8(narrow, *data++);
    --size;
  }
  return narrow;
}

inline bool cpu_has_sse42() noexcept {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace detail

/// Which implementation `crc32c` uses on this CPU: "sse4.2" or "table".
inline const char* crc32c_implementation() noexcept {
#if CHUNKWISE_CRC32C_X86
  if (detail::cpu_has_sse42()) return "sse4.2";
#endif
  return "table";
}

/// CRC-32C of `size` bytes, continuing from `crc` (0 to start).
inline std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(data);
#if CHUNKWISE_CRC32C_X86
  if (detail::cpu_has_sse42()) return ~detail::crc32c_sse42_update(~crc, bytes, size);
#endif
  return ~detail::crc32c_table_update(~crc, bytes, size);
}

/// The table-driven path, always (tests compare both paths on the same data).
inline std::uint32_t crc32c_portable(const void* data, std::size_t size, std::uint32_t crc = 0) noexcept {
  return ~detail::crc32c_table_update(~crc, static_cast<const unsigned char*>(data), size);
}

}  // namespace chunkwise
