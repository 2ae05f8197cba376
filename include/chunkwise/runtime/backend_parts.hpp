#pragma once
// backend_parts<Backend>: what the runtime takes from a backend besides its copy streams: the tier that holds device
// chunks and the optimizer that updates states living in that tier.
//   device_tier             where device chunks live; when the host cannot address it (device_is_host_memory
//                           false), a host_staged_tier (tier/concepts.hpp): the runtime zeroes it and copies to and
//                           from it only through the tier's calls, and its collectives need a communicator that
//                           reaches device memory
//   device_optimizer        a chunk_optimizer over arrays in that tier; make_optimizer(backend, adam, threads) makes
//                           it when the device is not host memory (else the runtime's CPU Adam serves both)
//   pinned_tier             host memory the backend's copies move asynchronously (page-locked for a GPU's DMA:
//                           cudaHostAlloc), page-aligned for O_DIRECT: pinned homes, offloaded states, NVMe staging
// The host backend's device is host memory (the emulated device tier) and its device optimizer is the SIMD CPU Adam;
// the CUDA backend specialises this in runtime/cuda/backend_parts.cuh (the GPU's memory, the fused CUDA Adam), and
// tests in runtime/isolated_device.hpp (host memory the host may not touch).
#include <chunkwise/backend/host.hpp>
#include <chunkwise/optim/cpu_adam.hpp>
#include <chunkwise/tier/emulated_device.hpp>
#include <chunkwise/tier/pinned_host.hpp>

namespace chunkwise {

template <class Backend>
struct backend_parts;

template <>
struct backend_parts<host_backend> {
  using device_tier = emulated_device_tier;
  /// Updates states in the device tier; the same kernel as the host tiers' optimizer here, one instance serves both.
  using device_optimizer = optim::cpu_adam;
  using pinned_tier = pinned_host_tier;
  static constexpr bool device_is_host_memory = true;
};

}  // namespace chunkwise
