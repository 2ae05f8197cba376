// measure_gpu_machine (gpu_backend.hpp): chunkwise's measure<cuda_backend>, whose fused-Adam timing needs nvcc,
// cached like the host's profile, for the trainer's g++ code.
#include "gpu_backend.hpp"

#include <chunkwise/measure/cache.hpp>
#include <chunkwise/measure/cuda/measure.cuh>

namespace gpt2 {

chunkwise::machine_profile measure_gpu_machine(const std::filesystem::path& cache,
                                               const chunkwise::measure_options& options) {
  return chunkwise::measure_or_load<chunkwise::cuda_backend>(cache, options);
}

}  // namespace gpt2
