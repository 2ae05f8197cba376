#pragma once
// Optimizer state save and load for checkpoints: one chunk's fp32 master weights and moments, as a file of
// chunkwise's checkpoint format (core/checkpoint_format.hpp) of kind "optstate". The 16-bit working copy is not
// saved: it is a rounding of the master weights.
//
// Identity (24 bytes, after the format's 64-byte prefix; little-endian):
//   offset  bytes  field
//        0      8  element count of each array
//        8      8  step (optimizer updates taken)
//       16      1  dtype of the arrays (fp32)
//       17      1  array count: master + state arrays (Adam 3, SGD with momentum 2, plain SGD 1)
//       18      1  optimizer kind (optimizer_kind)
//       19      5  zero
// Pieces: master[count], then moment1[count] and moment2[count] where the kind keeps them, fp32 each, each with its
// own CRC-32C. A file is 64 + 24 + 16 * arrays header bytes, then 4 * count * arrays bytes (state_file_bytes).
#include <chunkwise/core/checkpoint_format.hpp>
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

namespace chunkwise::optim {

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

/// The kind tag of an optimizer state file in chunkwise's checkpoint format.
inline constexpr checkpoint_kind state_file_kind{"optstate", "an optimizer state", "optimizer state"};

namespace detail {

inline constexpr std::size_t state_identity_bytes = 24;

}  // namespace detail

/// Bytes of the file save_state writes for a chunk of `count` elements.
constexpr std::uint64_t state_file_bytes(std::uint64_t count, optimizer_kind kind) noexcept {
  const std::uint64_t arrays = 1 + state_arrays_of(kind);
  return checkpoint_header_bytes(detail::state_identity_bytes, arrays) + arrays * count * sizeof(float);
}

namespace detail {

inline std::array<const float*, 3> state_arrays_in(const chunk_arrays& chunk, optimizer_kind kind) noexcept {
  return {chunk.master, state_arrays_of(kind) >= 1 ? chunk.moment1 : nullptr,
          state_arrays_of(kind) >= 2 ? chunk.moment2 : nullptr};
}

/// What piece `a` of a state holds, for messages.
inline std::string_view state_array_name(optimizer_kind kind, std::size_t a) noexcept {
  if (a == 0) return "master weights";
  if (kind == optimizer_kind::sgd_momentum) return "momentum";
  return a == 1 ? "first moment" : "second moment";
}

inline void check_arrays(const chunk_arrays& chunk, optimizer_kind kind, const char* what) {
  const std::size_t states = state_arrays_of(kind);
  if (chunk.count > 0 && (chunk.master == nullptr || (states >= 1 && chunk.moment1 == nullptr) ||
                          (states >= 2 && chunk.moment2 == nullptr)))
    throw error(error_code::invalid_argument, std::string(what) + ": a " + std::string(to_string(kind)) +
                                                  " state needs master weights and " + std::to_string(states) +
                                                  " moment array(s), and the chunk lacks one");
}

inline checkpoint_format_writer state_writer(const chunk_arrays& chunk, optimizer_kind kind, std::uint64_t step) {
  const std::size_t arrays = 1 + state_arrays_of(kind);
  checkpoint_fields identity;
  identity.put(static_cast<std::uint64_t>(chunk.count))
      .put(step)
      .put(static_cast<std::uint8_t>(dtype::fp32))
      .put(static_cast<std::uint8_t>(arrays))
      .put(static_cast<std::uint8_t>(kind));
  for (int zero = 0; zero < 5; ++zero) identity.put(std::uint8_t{0});
  checkpoint_format_writer writer(state_file_kind, std::move(identity).bytes());
  const auto data = state_arrays_in(chunk, kind);
  for (std::size_t a = 0; a < arrays; ++a) writer.add_piece(data[a], chunk.count * sizeof(float));
  return writer;
}

/// The message of `e` without the "chunkwise: " every error's what() starts with, to wrap it in more context.
inline std::string message_without_prefix(const error& e) {
  constexpr std::string_view prefix = "chunkwise: ";
  std::string_view text = e.what();
  if (text.substr(0, prefix.size()) == prefix) text.remove_prefix(prefix.size());
  return std::string(text);
}

}  // namespace detail

/// Writes one chunk's state. Throws io_error when the stream fails.
inline void save_state(std::ostream& out, const chunk_arrays& chunk, optimizer_kind kind, std::uint64_t step) {
  detail::check_arrays(chunk, kind, "save_state");
  detail::state_writer(chunk, kind, step).write(out, "save_state: ");
}

/// Reads a state written by save_state into `chunk` (same element count and optimizer kind) and returns its step.
/// The header, the identity's fields and each array's checksum are validated; errors say which. When an array
/// fails its checksum (or the input ends inside it) the chunk's arrays have already been overwritten with what was
/// read: reload from a good checkpoint.
inline std::uint64_t load_state(std::istream& in, const chunk_arrays& chunk, optimizer_kind kind) {
  detail::check_arrays(chunk, kind, "load_state");
  checkpoint_format_reader file(in, state_file_kind, "load_state: ");
  checkpoint_field_reader fields(file);
  const auto count = fields.take<std::uint64_t>();
  const auto step = fields.take<std::uint64_t>();
  const auto type = fields.take<std::uint8_t>();
  const auto arrays_held = fields.take<std::uint8_t>();
  const auto kind_held = fields.take<std::uint8_t>();
  bool reserved_zero = true;
  for (int b = 0; b < 5; ++b) reserved_zero = fields.take<std::uint8_t>() == 0 && reserved_zero;
  fields.finish();
  if (kind_held != static_cast<std::uint8_t>(kind))
    file.refuse("the file holds optimizer kind " + std::to_string(kind_held) + " (" +
                std::string(to_string(static_cast<optimizer_kind>(kind_held))) + "), the chunk expects " +
                std::string(to_string(kind)) + " (" + std::to_string(static_cast<int>(kind)) + ")");
  if (type != static_cast<std::uint8_t>(dtype::fp32))
    file.refuse("arrays are not fp32 (dtype " + std::to_string(type) + ")");
  const std::size_t arrays = 1 + state_arrays_of(kind);
  if (arrays_held != arrays)
    file.refuse("the file holds " + std::to_string(arrays_held) + " arrays, " + std::string(to_string(kind)) +
                " has " + std::to_string(arrays));
  if (count != chunk.count)
    file.refuse("the file holds " + std::to_string(count) + " elements per array, the chunk has " +
                std::to_string(chunk.count));
  if (!reserved_zero) file.refuse("reserved identity bytes are not zero");
  const std::uint64_t array_bytes = count * sizeof(float);
  if (file.pieces().size() != arrays)
    file.corrupted("its identity says " + std::to_string(arrays) + " arrays, its piece table holds " +
                   std::to_string(file.pieces().size()));
  for (std::size_t a = 0; a < arrays; ++a)
    if (file.pieces()[a].bytes != array_bytes)
      file.corrupted("piece " + std::to_string(a) + " has " + std::to_string(file.pieces()[a].bytes) +
                     " bytes, its identity says " + std::to_string(array_bytes));

  const auto data = detail::state_arrays_in(chunk, kind);
  try {
    for (std::size_t a = 0; a < arrays; ++a)
      file.read_piece(a, const_cast<float*>(data[a]), detail::state_array_name(kind, a));
  } catch (const error& e) {
    throw error(e.code(), detail::message_without_prefix(e) +
                              "; the file is corrupt or cut short, and the chunk now holds what was read of it: "
                              "reload it from a good checkpoint");
  }
  return step;
}

/// Writes one chunk's state to `file` atomically: the file holds its old contents or all of the new, whatever fails.
inline void save_state(const std::filesystem::path& file, const chunk_arrays& chunk, optimizer_kind kind,
                       std::uint64_t step, const testing::atomic_write_faults* faults = nullptr) {
  detail::check_arrays(chunk, kind, "save_state");
  try {
    detail::state_writer(chunk, kind, step).write_atomically(file, faults);
  } catch (const error& e) {
    throw error(e.code(), "save_state: " + detail::message_without_prefix(e));
  }
}

inline std::uint64_t load_state(const std::filesystem::path& file, const chunk_arrays& chunk, optimizer_kind kind) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw error(error_code::io_error, "load_state: cannot open '" + file.string() + "': " + std::strerror(errno));
  try {
    return load_state(in, chunk, kind);
  } catch (const error& e) {
    throw error(e.code(), detail::message_without_prefix(e) + " (file '" + file.string() + "')");
  }
}

}  // namespace chunkwise::optim
