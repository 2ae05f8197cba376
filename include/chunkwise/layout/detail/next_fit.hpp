#pragma once
// Next-fit packing in first-use order, the primitive every layout shares. A chunk takes tensors while the next
// aligned tensor still fits; a tied tensor closes the open chunk and gets one of its own.
//
// Monotonicity the search relies on: with a larger capacity every chunk boundary moves to the same or a later
// tensor (a chunk starting later packs the same tensors at the same or smaller offsets), so the chunk count is
// non-increasing in the capacity.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <cstdint>
#include <limits>
#include <string>

namespace chunkwise::layout::detail {

inline constexpr std::uint64_t too_many = std::numeric_limits<std::uint64_t>::max();

/// Chunks next-fit uses at `capacity`; stops counting (returns a value > limit) once more than `limit` are needed.
/// Every tensor must fit: capacity >= the largest tensor.
constexpr std::uint64_t count_chunks(const model_profile& model, byte_count capacity, byte_count alignment,
                                     std::uint64_t limit = too_many) noexcept {
  std::uint64_t count = 0;
  bool open = false;
  byte_count end = 0;
  for (const auto& t : model.tensors) {
    const byte_count bytes = t.bytes();
    if (t.tied) {
      open = false;
      if (++count > limit) return count;
      continue;
    }
    if (open) {
      const byte_count offset = round_up(end, alignment);
      if (offset + bytes <= capacity) {
        end = offset + bytes;
        continue;
      }
    }
    if (++count > limit) return count;
    open = true;
    end = bytes;
  }
  return count;
}

/// The chunk map of next-fit at `capacity` (a multiple of options.granule(), >= the largest tensor).
constexpr chunk_map pack(const model_profile& model, byte_count capacity, const layout_options& options) {
  chunk_map map{options, {}, {}};
  map.locations.resize(model.tensors.size());
  bool open = false;
  for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
    const auto& t = model.tensors[i];
    const byte_count bytes = t.bytes();
    if (!t.tied && open) {
      auto& current = map.chunks.back();
      const auto& last = current.slots.back();
      const byte_count offset = round_up(last.offset + last.bytes, options.alignment);
      if (offset + bytes <= capacity) {
        current.slots.push_back(chunk_slot{i, offset, bytes});
        map.locations[i] = tensor_location{static_cast<std::uint32_t>(map.chunks.size() - 1), offset};
        continue;
      }
    }
    map.chunks.push_back(chunk{capacity, {chunk_slot{i, 0, bytes}}, t.tied});
    map.locations[i] = tensor_location{static_cast<std::uint32_t>(map.chunks.size() - 1), 0};
    open = !t.tied;
  }
  return map;
}

/// Throws layout_error when `capacity` cannot hold the largest tensor.
constexpr void require_fits(const model_profile& model, byte_count capacity, const std::string& layout_name) {
  for (const auto& t : model.tensors)
    if (t.bytes() > capacity)
      chunkwise::detail::raise(
          error_code::layout_error,
          layout_name + ": tensor '" + t.name.str() + "' needs " + format_bytes(t.bytes()) + " (" +
              std::to_string(t.bytes()) + " bytes) but chunks hold " + format_bytes(capacity) +
              "; use a chunk size of at least " + format_bytes(model.largest_tensor_bytes()) +
              ", or min_waste<> which searches from the largest tensor up");
}

}  // namespace chunkwise::layout::detail
