#pragma once
// backend_parts<cuda_backend>: chunks in the GPU's own memory (cuda_device_tier: cudaMallocFromPoolAsync under the
// device budget, zeroed and copied from the host through the tier's synchronous calls), the states that live
// there updated by the fused CUDA Adam (cuda_adam: the CPU kernel's bits), on the backend's device; pinned homes,
// offloaded states and NVMe staging in cudaHostAlloc memory.
#if CHUNKWISE_HAS_CUDA

#include <chunkwise/backend/cuda/backend.cuh>
#include <chunkwise/optim/cuda/adam.cuh>
#include <chunkwise/runtime/backend_parts.hpp>
#include <chunkwise/tier/cuda/device.cuh>
#include <chunkwise/tier/cuda/pinned_host.cuh>

namespace chunkwise {

template <>
struct backend_parts<cuda_backend> {
  using device_tier = cuda_device_tier;
  using device_optimizer = optim::cuda_adam;
  using pinned_tier = cuda_pinned_host_tier;  // page-locked: the copy engines' DMA reads and writes it directly
  static constexpr bool device_is_host_memory = false;
  /// The runtime updates one chunk per call and sums the norm over every device-resident chunk in one.
  static device_optimizer make_optimizer(cuda_backend& /*backend*/, const optim::adam_config& config,
                                         unsigned /*threads*/) {
    return device_optimizer(config, nullptr, /*max_chunks=*/4096);
  }
};

}  // namespace chunkwise

#endif  // CHUNKWISE_HAS_CUDA
