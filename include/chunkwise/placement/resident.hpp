#pragma once
// `resident`: every chunk lives on the device for the whole run; nothing moves. The block count is ignored.
#include <chunkwise/placement/concepts.hpp>

namespace chunkwise {

struct resident {
  using home_space = space::device;
  static constexpr std::string_view name = "resident";
  static constexpr bool uses_device_cache = false;

  static constexpr byte_count device_bytes(byte_count chunk_bytes, std::size_t chunks, std::size_t /*blocks*/) noexcept {
    return byte_count{chunks} * chunk_bytes;
  }
  static constexpr byte_count host_bytes(byte_count, std::size_t, std::size_t) noexcept { return 0; }
  static constexpr byte_count nvme_bytes(byte_count, std::size_t, std::size_t) noexcept { return 0; }
  static constexpr std::size_t resident_chunks(std::size_t chunks, std::size_t /*blocks*/) noexcept { return chunks; }
};

static_assert(placement_policy<resident>);
static_assert(resident::device_bytes(64 * MiB, 10, 2) == 640 * MiB);

}  // namespace chunkwise
