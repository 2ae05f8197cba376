#pragma once
// The pinned host tier of the host backend: page-aligned host memory (usable as an O_DIRECT buffer), optionally
// mlock'ed, under a byte budget. Under CUDA the same role is played by tier/cuda/pinned_host.cuh (cudaHostAlloc).
#include <chunkwise/tier/detail/aligned_host_memory.hpp>

namespace chunkwise {

class pinned_host_tier : public detail::host_backend_tier<space::pinned_host> {
 public:
  /// `budget`: the bytes this tier may hand out. `lock_pages`: mlock every block (needs RLIMIT_MEMLOCK room).
  explicit pinned_host_tier(byte_count budget, bool lock_pages = false)
      : host_backend_tier("pinned host", budget, detail::page_bytes, lock_pages) {}

  friend constexpr void get_property(const pinned_host_tier&, host_accessible) noexcept {}
  friend constexpr void get_property(const pinned_host_tier&, device_accessible) noexcept {}
};

static_assert(memory_tier_with<pinned_host_tier, host_accessible, device_accessible>);

}  // namespace chunkwise
