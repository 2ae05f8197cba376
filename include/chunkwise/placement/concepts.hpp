#pragma once
// The `placement_policy` seam: where each chunk's home is, and how many device blocks hold chunks. A policy is a small
// literal type with static constexpr members; everything the cost model needs is constexpr and depends only on
// (chunk bytes, chunk count, device block count):
//
//   P::name                         "resident", "cached<nvme>", "split<pinned_host>"
//   P::home_space                   the space where chunks not on the device live (space::device for resident)
//   P::uses_device_cache            true when chunks move through a device cache at run time
//   P::device_bytes(c, n, b)        device bytes per rank for n chunks of c bytes with b device blocks
//   P::host_bytes(c, n, b)          host bytes (pinned or pageable homes, pinned staging buffers)
//   P::nvme_bytes(c, n, b)          bytes of the NVMe store file
//   P::resident_chunks(n, b)        chunks that stay on the device for the whole run
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/tier/spaces.hpp>

#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace chunkwise {

template <class P>
concept placement_policy =
    std::is_empty_v<P> && memory_space<typename P::home_space> &&
    requires(byte_count chunk_bytes, std::size_t chunks, std::size_t blocks) {
      { P::name } -> std::convertible_to<std::string_view>;
      { P::uses_device_cache } -> std::convertible_to<bool>;
      { P::device_bytes(chunk_bytes, chunks, blocks) } -> std::same_as<byte_count>;
      { P::host_bytes(chunk_bytes, chunks, blocks) } -> std::same_as<byte_count>;
      { P::nvme_bytes(chunk_bytes, chunks, blocks) } -> std::same_as<byte_count>;
      { P::resident_chunks(chunks, blocks) } -> std::same_as<std::size_t>;
    } &&
    // constexpr: usable by the search at compile time
    std::bool_constant<(P::device_bytes(byte_count{1}, std::size_t{1}, std::size_t{1}), true)>::value;

namespace detail {
/// Bytes a chunk takes in a store of `Space` (the NVMe store rounds blocks up to its 4 KiB I/O alignment).
template <class Space>
constexpr byte_count home_chunk_bytes(byte_count chunk_bytes) noexcept {
  if constexpr (std::same_as<Space, space::nvme>) return round_up(chunk_bytes, 4096);
  else return chunk_bytes;
}
/// Host bytes of `chunks` homes in `Space` plus the pinned staging buffers an NVMe home needs.
template <class Space>
constexpr byte_count home_host_bytes(byte_count chunk_bytes, std::size_t chunks, std::size_t staging_buffers) noexcept {
  if constexpr (std::same_as<Space, space::nvme>)
    return chunks == 0 ? 0 : byte_count{staging_buffers} * round_up(chunk_bytes, 4096);
  else if constexpr (std::same_as<Space, space::device>) return 0;
  else return byte_count{chunks} * chunk_bytes;
}
template <class Space>
constexpr byte_count home_nvme_bytes(byte_count chunk_bytes, std::size_t chunks) noexcept {
  if constexpr (std::same_as<Space, space::nvme>) return byte_count{chunks} * home_chunk_bytes<Space>(chunk_bytes);
  else return 0;
}
}  // namespace detail

}  // namespace chunkwise
