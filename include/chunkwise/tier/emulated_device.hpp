#pragma once
// The device tier of the host backend: host memory under the device's byte budget, so a run that would not fit a
// GPU of that size fails the same way on a CPU-only machine.
#include <chunkwise/tier/detail/aligned_host_memory.hpp>

namespace chunkwise {

class emulated_device_tier : public detail::host_backend_tier<space::device> {
 public:
  /// `budget`: the device bytes this tier may hand out (the GPU's capacity it stands in for).
  explicit emulated_device_tier(byte_count budget) : host_backend_tier("device (host backend)", budget, 256, false) {}

  friend constexpr void get_property(const emulated_device_tier&, device_accessible) noexcept {}
  friend constexpr void get_property(const emulated_device_tier&, host_accessible) noexcept {}
};

static_assert(memory_tier_with<emulated_device_tier, device_accessible, host_accessible>);
static_assert(addressable_tier<emulated_device_tier>);

}  // namespace chunkwise
