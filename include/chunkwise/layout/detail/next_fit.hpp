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
#include <vector>

namespace chunkwise::layout::detail {

inline constexpr std::uint64_t too_many = std::numeric_limits<std::uint64_t>::max();

/// What next-fit needs of a tensor, packed densely: the search walks this list thousands of times.
/// A chunk starts aligned, so the aligned offset of the next tensor is the running sum of aligned sizes: no division
/// in the inner loop.
struct tensor_extent {
  byte_count bytes = 0;
  byte_count aligned_bytes = 0;  // bytes rounded up to the alignment
  bool tied = false;
  bool closes = false;  // not a tensor: closes the open chunk (where a tensor packed elsewhere sits in the order)
};

constexpr std::vector<tensor_extent> extents_of(const model_profile& model, byte_count alignment) {
  std::vector<tensor_extent> extents;
  extents.reserve(model.tensors.size());
  for (const auto& t : model.tensors) extents.push_back({t.bytes(), round_up(t.bytes(), alignment), t.tied});
  return extents;
}

/// Chunks next-fit uses at `capacity`; stops counting (returns a value > limit) once more than `limit` are needed.
/// Every tensor must fit: capacity >= the largest tensor.
constexpr std::uint64_t count_chunks(const std::vector<tensor_extent>& extents, byte_count capacity,
                                     std::uint64_t limit = too_many) noexcept {
  std::uint64_t count = 0;
  bool open = false;
  byte_count next_offset = 0;  // aligned offset where the open chunk's next tensor would go
  for (const auto& t : extents) {
    if (t.closes) {
      open = false;
      continue;
    }
    if (t.tied) {
      open = false;
      if (++count > limit) return count;
      continue;
    }
    if (open && next_offset + t.bytes <= capacity) {
      next_offset += t.aligned_bytes;
      continue;
    }
    if (++count > limit) return count;
    open = true;
    next_offset = t.aligned_bytes;
  }
  return count;
}

/// A chunk that no later tensor joins holds no free tail: its capacity shrinks to what it uses, in whole shards.
constexpr void shrink_to_fit(chunk& c, const layout_options& options) {
  const auto& last = c.slots.back();
  c.capacity = round_up(last.offset + last.bytes, options.granule());
}

/// Next-fit at `capacity` (a multiple of options.granule(), >= the largest tensor that is not alone). A tensor for
/// which alone(i) holds closes the open chunk and gets one of its own: of `capacity`, or with `own_sizes` of its
/// own size rounded up to whole shards, and every other chunk shrunk to what it holds once it is closed
/// (private_chunks: chunks of their own sizes, at most `capacity`).
template <class Alone>
constexpr chunk_map pack(const model_profile& model, byte_count capacity, const layout_options& options,
                         Alone&& alone, bool own_sizes) {
  chunk_map map{options, {}, {}};
  map.locations.resize(model.tensors.size());
  bool open = false;
  for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
    const auto& t = model.tensors[i];
    const byte_count bytes = t.bytes();
    const bool by_itself = alone(i);
    if (!by_itself && open) {
      auto& current = map.chunks.back();
      const auto& last = current.slots.back();
      const byte_count offset = round_up(last.offset + last.bytes, options.alignment);
      if (offset + bytes <= capacity) {
        current.slots.push_back(chunk_slot{i, offset, bytes});
        map.locations[i] = tensor_location{static_cast<std::uint32_t>(map.chunks.size() - 1), offset};
        continue;
      }
    }
    if (own_sizes && open) shrink_to_fit(map.chunks.back(), options);
    const byte_count size = own_sizes && by_itself ? round_up(bytes, options.granule()) : capacity;
    map.chunks.push_back(chunk{size, {chunk_slot{i, 0, bytes}}, t.tied});
    map.locations[i] = tensor_location{static_cast<std::uint32_t>(map.chunks.size() - 1), 0};
    open = !by_itself;
  }
  if (own_sizes && open) shrink_to_fit(map.chunks.back(), options);
  return map;
}

/// The chunk map of next-fit at `capacity` (a multiple of options.granule(), >= the largest tensor).
constexpr chunk_map pack(const model_profile& model, byte_count capacity, const layout_options& options) {
  return pack(model, capacity, options, [&](std::uint32_t i) { return model.tensors[i].tied; }, false);
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
