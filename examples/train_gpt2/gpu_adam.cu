// gpu_adam (gpu_backend.hpp): chunkwise's fused CUDA Adam, compiled by nvcc for the trainer's g++ code.
#include "gpu_backend.hpp"

#include <chunkwise/optim/cuda/adam.cuh>

namespace gpt2 {

struct gpu_adam::impl {
  // As runtime/cuda/backend_parts.cuh: one chunk per update, the norm over every device-resident chunk at once.
  explicit impl(const config_type& config) : adam(config, nullptr, /*max_chunks=*/4096) {}
  chunkwise::optim::cuda_adam adam;
};

gpu_adam::gpu_adam(const config_type& config) : impl_(std::make_unique<impl>(config)) {}
gpu_adam::gpu_adam(gpu_adam&&) noexcept = default;
gpu_adam& gpu_adam::operator=(gpu_adam&&) noexcept = default;
gpu_adam::~gpu_adam() = default;

const gpu_adam::config_type& gpu_adam::config() const noexcept { return impl_->adam.config(); }
void gpu_adam::step(std::span<const chunkwise::optim::chunk_arrays> chunks,
                    const chunkwise::optim::step_args& args) {
  impl_->adam.step(chunks, args);
}
double gpu_adam::grad_sum_of_squares(std::span<const chunkwise::optim::chunk_arrays> chunks) {
  return impl_->adam.grad_sum_of_squares(chunks);
}

}  // namespace gpt2
