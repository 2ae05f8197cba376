#pragma once
// chunk_map: the result of a layout. Tensors packed into chunks in first-use order; every tensor offset is aligned and
// every chunk's capacity divides into `ranks` equal, aligned shards.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace chunkwise {

struct layout_options {
  std::uint32_t ranks = 1;     // chunk capacity is divisible by ranks * alignment, so shards are equal and aligned
  byte_count alignment = 256;  // bytes; every tensor offset in a chunk is a multiple (256 suits CUDA and AVX-512)

  /// The unit every chunk capacity is a multiple of.
  [[nodiscard]] constexpr byte_count granule() const noexcept { return byte_count{ranks} * alignment; }
};

constexpr void validate(const layout_options& options) {
  if (options.ranks == 0)
    detail::raise(error_code::invalid_argument, "layout options: ranks is 0; a layout needs at least one rank");
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0)
    detail::raise(error_code::invalid_argument, "layout options: alignment " + std::to_string(options.alignment) +
                                                    " is not a power of two; use 256 (the default) or another power of two");
  // ranks * alignment must not wrap (shards would silently differ in size), and every chunk capacity is at least
  // this granule, so keep it far below 64 bits: 1 TiB is more than any rank count times any sensible alignment.
  constexpr byte_count max_granule = byte_count{1} << 40;
  if (options.alignment > max_granule / options.ranks)
    detail::raise(error_code::invalid_argument,
                  "layout options: " + std::to_string(options.ranks) + " ranks times alignment " +
                      std::to_string(options.alignment) + " exceeds the 1 TiB limit on the chunk granule; " +
                      "use a smaller alignment");
}

struct chunk_slot {
  std::uint32_t tensor = 0;  // index into model_profile::tensors
  byte_count offset = 0;     // from the chunk's start, a multiple of layout_options::alignment
  byte_count bytes = 0;
};

struct chunk {
  byte_count capacity = 0;
  std::vector<chunk_slot> slots;  // in first-use order
  bool tied = false;              // holds one tied tensor alone

  [[nodiscard]] constexpr byte_count used_bytes() const noexcept {
    byte_count n = 0;
    for (const auto& s : slots) n += s.bytes;
    return n;
  }
};

struct tensor_location {
  std::uint32_t chunk = 0;
  byte_count offset = 0;
};

/// What the planner needs of a layout, as a literal type: usable as the value of a constant expression.
struct layout_summary {
  byte_count chunk_bytes = 0;   // capacity of the largest chunk (of every chunk, except under per_tensor)
  std::uint64_t chunk_count = 0;
  byte_count total_bytes = 0;   // sum of chunk capacities
  byte_count tensor_bytes = 0;  // sum of tensor sizes
  byte_count waste = 0;         // total_bytes - tensor_bytes: free space and alignment padding
  // For layouts whose chunks differ in size (private_chunks: the embedding's chunk first): the first chunk's
  // capacity and the largest of the others. A device cache that keeps chunk 0 resident sizes its blocks to the latter.
  byte_count first_chunk_bytes = 0;
  byte_count rest_chunk_bytes = 0;

  [[nodiscard]] constexpr double waste_fraction() const noexcept {
    return total_bytes == 0 ? 0.0 : static_cast<double>(waste) / static_cast<double>(total_bytes);
  }
  constexpr bool operator==(const layout_summary&) const = default;
};

struct chunk_map {
  layout_options options;
  std::vector<chunk> chunks;
  std::vector<tensor_location> locations;  // per tensor

  [[nodiscard]] constexpr layout_summary summary() const noexcept {
    layout_summary s;
    s.chunk_count = chunks.size();
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const auto& c = chunks[i];
      s.chunk_bytes = c.capacity > s.chunk_bytes ? c.capacity : s.chunk_bytes;
      if (i == 0) s.first_chunk_bytes = c.capacity;
      else s.rest_chunk_bytes = c.capacity > s.rest_chunk_bytes ? c.capacity : s.rest_chunk_bytes;
      s.total_bytes += c.capacity;
      s.tensor_bytes += c.used_bytes();
    }
    s.waste = s.total_bytes - s.tensor_bytes;
    return s;
  }
  /// Bytes of one rank's shard of chunk `index`.
  [[nodiscard]] constexpr byte_count shard_bytes(std::size_t index) const noexcept {
    return chunks[index].capacity / options.ranks;
  }
};

}  // namespace chunkwise
