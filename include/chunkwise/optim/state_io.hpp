#pragma once
// Optimizer state save and load for checkpoints: one chunk's fp32 master weights and moments in a small binary
// format. The 16-bit working copy is not saved: it is a rounding of the master weights.
//
// Layout (little-endian, as the host writes it; 64-byte header, then the arrays back to back):
//   offset  bytes  field
//        0      8  magic "CWOPTST\0"
//        8      4  version (1)
//       12      4  header bytes (64)
//       16      8  element count
//       24      8  step (optimizer updates taken)
//       32      1  dtype of the arrays (fp32)
//       33      1  array count: master + state arrays (Adam 3, SGD with momentum 2, plain SGD 1)
//       34      1  optimizer kind (optimizer_kind)
//       35      5  zero
//       40      8  checksum: FNV-1a 64 over 8-byte words of the header (this field zero) and then the arrays
//       48     16  zero
//       64      .  master[count], moment1[count] (if present), moment2[count] (if present), fp32 each
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/optim/concepts.hpp>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <ostream>
#include <string>
#include <string_view>

namespace chunkwise::inline CHUNKWISE_ABI::optim {

enum class optimizer_kind : std::uint8_t { adam = 1, sgd = 2, sgd_momentum = 3 };

constexpr std::string_view to_string(optimizer_kind kind) noexcept {
  switch (kind) {
    case optimizer_kind::adam: return "adam";
    case optimizer_kind::sgd: return "sgd";
    case optimizer_kind::sgd_momentum: return "sgd_momentum";
  }
  return "?";
}

/// fp32 arrays besides the master weights that each kind keeps.
constexpr std::size_t state_arrays_of(optimizer_kind kind) noexcept {
  return kind == optimizer_kind::adam ? 2 : kind == optimizer_kind::sgd_momentum ? 1 : 0;
}

namespace detail {

inline constexpr std::array<char, 8> state_magic = {'C', 'W', 'O', 'P', 'T', 'S', 'T', '\0'};
inline constexpr std::uint32_t state_version = 1;
inline constexpr std::uint32_t state_header_bytes = 64;

/// FNV-1a over 64-bit words (bytes of a partial last word are zero-padded): fast enough to stream at memory speed.
class state_checksum {
 public:
  void add(const void* data, std::size_t bytes) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    for (; bytes >= 8; bytes -= 8, p += 8) {
      std::uint64_t word;
      std::memcpy(&word, p, 8);
      mix(word);
    }
    if (bytes > 0) {
      std::uint64_t word = 0;
      std::memcpy(&word, p, bytes);
      mix(word);
    }
  }
  [[nodiscard]] std::uint64_t value() const noexcept { return hash_; }

 private:
  void mix(std::uint64_t word) noexcept { hash_ = (hash_ ^ word) * 0x100000001b3ull; }
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
};

struct state_header {
  std::uint64_t count = 0, step = 0, checksum = 0;
  std::uint8_t type = 0, arrays = 0, kind = 0;
};

inline std::array<unsigned char, state_header_bytes> encode(const state_header& h) noexcept {
  std::array<unsigned char, state_header_bytes> bytes{};
  std::memcpy(bytes.data(), state_magic.data(), 8);
  std::memcpy(bytes.data() + 8, &state_version, 4);
  std::memcpy(bytes.data() + 12, &state_header_bytes, 4);
  std::memcpy(bytes.data() + 16, &h.count, 8);
  std::memcpy(bytes.data() + 24, &h.step, 8);
  bytes[32] = h.type;
  bytes[33] = h.arrays;
  bytes[34] = h.kind;
  std::memcpy(bytes.data() + 40, &h.checksum, 8);
  return bytes;
}

inline std::array<const float*, 3> state_arrays_in(const chunk_arrays& chunk, optimizer_kind kind) noexcept {
  return {chunk.master, state_arrays_of(kind) >= 1 ? chunk.moment1 : nullptr,
          state_arrays_of(kind) >= 2 ? chunk.moment2 : nullptr};
}

inline void check_arrays(const chunk_arrays& chunk, optimizer_kind kind, const char* what) {
  const std::size_t states = state_arrays_of(kind);
  if (chunk.count > 0 && (chunk.master == nullptr || (states >= 1 && chunk.moment1 == nullptr) ||
                          (states >= 2 && chunk.moment2 == nullptr)))
    throw error(error_code::invalid_argument, std::string(what) + ": a " + std::string(to_string(kind)) +
                                                  " state needs master weights and " + std::to_string(states) +
                                                  " moment array(s), and the chunk lacks one");
}

}  // namespace detail

/// Writes one chunk's state. Throws io_error when the stream fails.
inline void save_state(std::ostream& out, const chunk_arrays& chunk, optimizer_kind kind, std::uint64_t step) {
  detail::check_arrays(chunk, kind, "save_state");
  const std::size_t arrays = 1 + state_arrays_of(kind);
  detail::state_header header{chunk.count, step, 0, static_cast<std::uint8_t>(dtype::fp32),
                              static_cast<std::uint8_t>(arrays), static_cast<std::uint8_t>(kind)};
  detail::state_checksum checksum;
  const auto unsummed = detail::encode(header);
  checksum.add(unsummed.data(), unsummed.size());
  const auto data = detail::state_arrays_in(chunk, kind);
  for (std::size_t a = 0; a < arrays; ++a) checksum.add(data[a], chunk.count * sizeof(float));
  header.checksum = checksum.value();
  const auto bytes = detail::encode(header);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  for (std::size_t a = 0; a < arrays; ++a)
    out.write(reinterpret_cast<const char*>(data[a]), static_cast<std::streamsize>(chunk.count * sizeof(float)));
  out.flush();
  if (!out)
    throw error(error_code::io_error, "save_state: writing " + std::to_string(64 + arrays * chunk.count * 4) +
                                          " bytes of optimizer state failed");
}

/// Reads a state written by save_state into `chunk` (same element count and optimizer kind) and returns its step.
/// Every header field and the checksum are validated; errors say which. On a checksum error the chunk's arrays
/// have already been overwritten with the (corrupt) file contents: reload from a good checkpoint.
inline std::uint64_t load_state(std::istream& in, const chunk_arrays& chunk, optimizer_kind kind) {
  detail::check_arrays(chunk, kind, "load_state");
  const auto fail = [](const std::string& what) { throw error(error_code::parse_error, "load_state: " + what); };
  std::array<unsigned char, detail::state_header_bytes> bytes{};
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (in.gcount() != static_cast<std::streamsize>(bytes.size()))
    fail("the input ends after " + std::to_string(in.gcount()) + " bytes, inside the 64-byte header");
  if (std::memcmp(bytes.data(), detail::state_magic.data(), 8) != 0)
    fail("not a chunkwise optimizer state (magic is not \"CWOPTST\")");
  std::uint32_t version = 0, header_bytes = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&header_bytes, bytes.data() + 12, 4);
  if (version != detail::state_version)
    fail("version " + std::to_string(version) + " is not supported; this build reads version " +
         std::to_string(detail::state_version));
  if (header_bytes != detail::state_header_bytes) fail("header size " + std::to_string(header_bytes) + " != 64");
  detail::state_header header;
  std::memcpy(&header.count, bytes.data() + 16, 8);
  std::memcpy(&header.step, bytes.data() + 24, 8);
  header.type = bytes[32];
  header.arrays = bytes[33];
  header.kind = bytes[34];
  std::memcpy(&header.checksum, bytes.data() + 40, 8);
  if (header.kind != static_cast<std::uint8_t>(kind))
    fail("the file holds optimizer kind " + std::to_string(header.kind) + ", the chunk expects " +
         std::string(to_string(kind)) + " (" + std::to_string(static_cast<int>(kind)) + ")");
  if (header.type != static_cast<std::uint8_t>(dtype::fp32)) fail("arrays are not fp32 (dtype " + std::to_string(header.type) + ")");
  const std::size_t arrays = 1 + state_arrays_of(kind);
  if (header.arrays != arrays)
    fail("the file holds " + std::to_string(header.arrays) + " arrays, " + std::string(to_string(kind)) + " has " +
         std::to_string(arrays));
  if (header.count != chunk.count)
    fail("the file holds " + std::to_string(header.count) + " elements per array, the chunk has " +
         std::to_string(chunk.count));
  for (std::size_t b = 35; b < 40; ++b)
    if (bytes[b] != 0) fail("reserved header bytes are not zero");
  for (std::size_t b = 48; b < 64; ++b)
    if (bytes[b] != 0) fail("reserved header bytes are not zero");

  detail::state_checksum checksum;
  const std::uint64_t stored = header.checksum;
  header.checksum = 0;
  const auto unsummed = detail::encode(header);
  checksum.add(unsummed.data(), unsummed.size());
  const auto data = detail::state_arrays_in(chunk, kind);
  const std::size_t array_bytes = chunk.count * sizeof(float);
  for (std::size_t a = 0; a < arrays; ++a) {
    auto* target = const_cast<float*>(data[a]);
    in.read(reinterpret_cast<char*>(target), static_cast<std::streamsize>(array_bytes));
    if (static_cast<std::size_t>(in.gcount()) != array_bytes)
      fail("the input is truncated: array " + std::to_string(a) + " has " + std::to_string(in.gcount()) + " of " +
           std::to_string(array_bytes) + " bytes");
    checksum.add(target, array_bytes);
  }
  if (checksum.value() != stored)
    fail("checksum mismatch (stored " + std::to_string(stored) + ", computed " + std::to_string(checksum.value()) +
         "): the file is corrupt and the chunk now holds its damaged contents");
  return header.step;
}

inline void save_state(const std::filesystem::path& file, const chunk_arrays& chunk, optimizer_kind kind,
                       std::uint64_t step) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out)
    throw error(error_code::io_error, "save_state: cannot open '" + file.string() + "' for writing: " +
                                          std::strerror(errno));
  try {
    save_state(out, chunk, kind, step);
  } catch (const error& e) {
    throw error(e.code(), std::string(e.what()) + " (file '" + file.string() + "')");
  }
}

inline std::uint64_t load_state(const std::filesystem::path& file, const chunk_arrays& chunk, optimizer_kind kind) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw error(error_code::io_error, "load_state: cannot open '" + file.string() + "': " + std::strerror(errno));
  try {
    return load_state(in, chunk, kind);
  } catch (const error& e) {
    throw error(e.code(), std::string(e.what()) + " (file '" + file.string() + "')");
  }
}

}  // namespace chunkwise::optim
