#pragma once
// The pageable host tier: plain host memory under a byte budget (host memory runs out silently otherwise).
#include <chunkwise/tier/detail/aligned_host_memory.hpp>

namespace chunkwise {

class host_tier : public detail::host_backend_tier<space::host> {
 public:
  explicit host_tier(byte_count budget) : host_backend_tier("host", budget, 64, false) {}

  friend constexpr void get_property(const host_tier&, host_accessible) noexcept {}
};

static_assert(memory_tier_with<host_tier, host_accessible>);
static_assert(!has_property<host_tier, device_accessible>);

}  // namespace chunkwise
