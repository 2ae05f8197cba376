#pragma once
// `cached<Tier>`: every chunk's home is on Tier; a device cache of `blocks` chunk-sized blocks holds the chunks in
// use, fetched ahead along the profiled order and evicted by next use. `StagingBuffers` pinned buffers carry NVMe
// moves (ignored for host homes).
#include <chunkwise/placement/concepts.hpp>

#include <algorithm>

namespace chunkwise {

template <class Tier, std::size_t StagingBuffers = 2>
struct cached {
  static_assert(memory_space<Tier> && !std::same_as<Tier, space::device>,
                "cached<Tier>: Tier must be space::pinned_host, space::host or space::nvme (the device cache is the "
                "device; use `resident` to keep every chunk there)");
  using home_space = Tier;
  static constexpr std::size_t staging_buffers = StagingBuffers;
  static constexpr std::string_view name =
      detail::by_space<Tier>("cached<nvme>", "cached<pinned_host>", "cached<host>");
  static constexpr bool uses_device_cache = true;

  /// More blocks than chunks buys nothing: the cache holds at most every chunk.
  static constexpr byte_count device_bytes(byte_count chunk_bytes, std::size_t chunks, std::size_t blocks) noexcept {
    return byte_count{std::min(blocks, chunks)} * chunk_bytes;
  }
  static constexpr byte_count host_bytes(byte_count chunk_bytes, std::size_t chunks, std::size_t) noexcept {
    return detail::home_host_bytes<Tier>(chunk_bytes, chunks, StagingBuffers);
  }
  static constexpr byte_count nvme_bytes(byte_count chunk_bytes, std::size_t chunks, std::size_t) noexcept {
    return detail::home_nvme_bytes<Tier>(chunk_bytes, chunks);
  }
  static constexpr std::size_t resident_chunks(std::size_t chunks, std::size_t blocks) noexcept {
    return blocks >= chunks ? chunks : 0;
  }
};

static_assert(placement_policy<cached<space::nvme>>);
static_assert(cached<space::nvme>::device_bytes(64 * MiB, 10, 3) == 192 * MiB);
static_assert(cached<space::nvme>::host_bytes(64 * MiB, 10, 3) == 128 * MiB);  // two pinned staging buffers
static_assert(cached<space::nvme>::nvme_bytes(64 * MiB, 10, 3) == 640 * MiB);
static_assert(cached<space::pinned_host>::host_bytes(64 * MiB, 10, 3) == 640 * MiB);

}  // namespace chunkwise
