#pragma once
// backend_parts<Backend>: what the runtime takes from a backend besides its copy streams: the tier that holds device
// chunks and the optimizer that updates states living in that tier. The host backend's device is host memory (the
// emulated device tier) and its device optimizer is the SIMD CPU Adam; the CUDA backend specialises this in a .cuh
// (cudaMalloc memory, the fused CUDA Adam).
#include <chunkwise/backend/host.hpp>
#include <chunkwise/optim/cpu_adam.hpp>
#include <chunkwise/tier/emulated_device.hpp>

namespace chunkwise {

template <class Backend>
struct backend_parts;

template <>
struct backend_parts<host_backend> {
  using device_tier = emulated_device_tier;
  /// Updates states in the device tier; the same kernel as the host tiers' optimizer here, one instance serves both.
  using device_optimizer = optim::cpu_adam;
  static constexpr bool device_is_host_memory = true;
};

}  // namespace chunkwise
