#pragma once
// Shard geometry: how a chunk is cut into one shard per rank, with padding when it does not divide.
//
// A chunk of c bytes over g ranks is cut into g shards of shard_bytes(c, g) = round_up(ceil(c / g), 128) bytes;
// the last shards may be partly or wholly padding. 128 bytes keeps every shard aligned for vector loads and for
// NCCL's 16-byte transfers, and divides by every element size (2, 4, 8). The padded chunk, g * shard_bytes, is
// what full-chunk working buffers hold. Padding elements reduce and update like any other (the runtime keeps them
// zero in parameters and gradients); they are never part of a tensor.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>

#include <cstddef>
#include <string>

namespace chunkwise {

inline constexpr byte_count shard_alignment = 128;

/// Bytes of each rank's shard of a chunk of `chunk_bytes` cut over `ranks` ranks.
constexpr byte_count shard_bytes(byte_count chunk_bytes, int ranks) {
  if (ranks < 1)
    detail::raise(error_code::invalid_argument,
                  "shard_bytes over " + std::to_string(ranks) + " ranks: a chunk is cut over at least 1 rank");
  return round_up(div_ceil(chunk_bytes, static_cast<byte_count>(ranks)), shard_alignment);
}

/// Bytes of the padded chunk: every shard side by side.
constexpr byte_count padded_chunk_bytes(byte_count chunk_bytes, int ranks) {
  return shard_bytes(chunk_bytes, ranks) * static_cast<byte_count>(ranks);
}

/// The elements of a chunk that one rank owns (holds, updates), in elements of the chunk's type.
struct shard_range {
  std::size_t offset = 0;    // first element, counted from the start of the chunk
  std::size_t elements = 0;  // shard length, padding included
  std::size_t valid = 0;     // elements of the shard that are part of the chunk (the rest is padding)
  constexpr bool operator==(const shard_range&) const = default;
};

/// Rank `rank`'s shard of a chunk of `chunk_elements` elements of `element_bytes` bytes each, over `ranks` ranks.
constexpr shard_range shard_of(std::size_t chunk_elements, std::size_t element_bytes, int rank, int ranks) {
  if (element_bytes == 0 || shard_alignment % element_bytes != 0)
    detail::raise(error_code::invalid_argument, "shard_of: elements of " + std::to_string(element_bytes) +
                                                    " bytes do not divide the 128-byte shard alignment");
  if (rank < 0 || rank >= ranks)
    detail::raise(error_code::invalid_argument, "shard_of: rank " + std::to_string(rank) + " of " +
                                                    std::to_string(ranks) + " ranks");
  const std::size_t elements = shard_bytes(chunk_elements * element_bytes, ranks) / element_bytes;
  const std::size_t offset = elements * static_cast<std::size_t>(rank);
  const std::size_t valid = offset >= chunk_elements ? 0 : (chunk_elements - offset < elements ? chunk_elements - offset
                                                                                              : elements);
  return {offset, elements, valid};
}

}  // namespace chunkwise
