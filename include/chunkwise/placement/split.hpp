#pragma once
// `split<Tier>`: the first chunks in profiled order stay resident on the device; the rest live on Tier and stream
// through `StreamBlocks` device blocks. With b device blocks and n chunks: b >= n keeps everything resident;
// otherwise b - StreamBlocks chunks are resident and n - (b - StreamBlocks) live on Tier.
#include <chunkwise/placement/concepts.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace chunkwise {

template <class Tier, std::size_t StreamBlocks = 2, std::size_t StagingBuffers = 2>
struct split {
  static_assert(memory_space<Tier> && !std::same_as<Tier, space::device>,
                "split<Tier>: Tier must be space::pinned_host, space::host or space::nvme");
  static_assert(StreamBlocks >= 1, "split<Tier, StreamBlocks>: streaming needs at least one device block");
  using home_space = Tier;
  static constexpr std::size_t stream_blocks = StreamBlocks;
  static constexpr std::size_t staging_buffers = StagingBuffers;
  static constexpr std::string_view name =
      detail::by_space<Tier>("split<nvme>", "split<pinned_host>", "split<host>");
  static constexpr bool uses_device_cache = true;

  /// Resident chunks; fewer than StreamBlocks + 1 blocks leave none resident (all blocks stream).
  static constexpr std::size_t resident_chunks(std::size_t chunks, std::size_t blocks) noexcept {
    if (blocks >= chunks) return chunks;
    return blocks > StreamBlocks ? blocks - StreamBlocks : 0;
  }
  static constexpr std::size_t streamed_chunks(std::size_t chunks, std::size_t blocks) noexcept {
    return chunks - resident_chunks(chunks, blocks);
  }
  static constexpr byte_count device_bytes(byte_count chunk_bytes, std::size_t chunks, std::size_t blocks) noexcept {
    return byte_count{std::min(blocks, chunks)} * chunk_bytes;
  }
  /// Which chunks stay resident: the first resident_chunks(n, b) distinct chunks of the profiled `order` (then the
  /// lowest ids the order never names). What the device cache takes as cache_options::pinned_chunks.
  static constexpr std::vector<std::uint32_t> resident_chunk_ids(const std::vector<std::uint32_t>& order,
                                                                 std::size_t chunks, std::size_t blocks) {
    const std::size_t wanted = resident_chunks(chunks, blocks);
    std::vector<unsigned char> taken(chunks, 0);  // not vector<bool>: clang 14 cannot run it constexpr
    std::vector<std::uint32_t> ids;
    for (std::size_t p = 0; p < order.size() && ids.size() < wanted; ++p) {
      if (order[p] < chunks && !taken[order[p]]) {
        taken[order[p]] = 1;
        ids.push_back(order[p]);
      }
    }
    for (std::uint32_t c = 0; c < chunks && ids.size() < wanted; ++c) {
      if (!taken[c]) {
        taken[c] = 1;
        ids.push_back(c);
      }
    }
    return ids;
  }
  static constexpr byte_count host_bytes(byte_count chunk_bytes, std::size_t chunks, std::size_t blocks) noexcept {
    return detail::home_host_bytes<Tier>(chunk_bytes, streamed_chunks(chunks, blocks), StagingBuffers);
  }
  static constexpr byte_count nvme_bytes(byte_count chunk_bytes, std::size_t chunks, std::size_t blocks) noexcept {
    return detail::home_nvme_bytes<Tier>(chunk_bytes, streamed_chunks(chunks, blocks));
  }
};

static_assert(placement_policy<split<space::pinned_host>>);
static_assert(split<space::pinned_host>::resident_chunks(10, 6) == 4);
static_assert(split<space::pinned_host>::host_bytes(8 * MiB, 10, 6) == 48 * MiB);
static_assert(split<space::pinned_host>::device_bytes(8 * MiB, 10, 6) == 48 * MiB);
static_assert(split<space::nvme>::nvme_bytes(8 * MiB, 10, 12) == 0);
static_assert(split<space::host>::resident_chunk_ids({3, 3, 1, 0, 2}, 5, 5).size() == 5);
static_assert(split<space::host>::resident_chunk_ids({3, 3, 1, 0, 2}, 5, 4)[1] == 1);

}  // namespace chunkwise
