#pragma once
// train_gpt2 --backend cuda's runtime backend: chunkwise's cuda_backend with its chunks in the GPU's memory
// (cuda_device_tier), as runtime/cuda/backend_parts.cuh gives it, for a trainer whose host code g++ compiles: the
// fused CUDA Adam (chunkwise's cuda_adam, whose kernels need nvcc) sits behind gpu_adam, compiled in gpu_adam.cu.
#if CHUNKWISE_GPT2_CUDA
#include <chunkwise/backend/cuda/backend.cuh>
#include <chunkwise/measure/measure.hpp>
#include <chunkwise/optim/concepts.hpp>
#include <chunkwise/profile/machine_profile.hpp>
#include <chunkwise/runtime/backend_parts.hpp>
#include <chunkwise/tier/cuda/device.cuh>
#include <chunkwise/tier/cuda/pinned_host.cuh>

#include <filesystem>
#include <memory>
#include <span>
#include <string>

namespace gpt2 {

struct gpu_backend : chunkwise::cuda_backend {};

/// --comm nccl: the process's GPU is its place on its machine (local rank modulo the GPUs it sees), as torchrun's
/// LOCAL_RANK convention; the backend, the device tier and NCCL then use the current device.
inline int use_local_gpu(int local_rank) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices < 1)
    chunkwise::throw_error(chunkwise::error_code::unsupported,
                           std::string("train_gpt2 --comm nccl: no usable GPU (") +
                               (status != cudaSuccess ? cudaGetErrorName(status) : "cudaErrorNoDevice") +
                               "); use --backend host, or run where a GPU is visible");
  const int device = local_rank % devices;
  CHUNKWISE_CUDA_TRY(cudaSetDevice(device), std::string("train_gpt2 --comm nccl"));
  return device;
}

/// device_chunk_executor's view of the GPU: the runtime's device addresses are the kernels' own, and a pass's kernels
/// are done when an event recorded after them on the default stream completes. Everything that touches the chunks
/// after a release queues on that stream or waits for the event: Thrust's kernels (thrust::cuda::par_nosync), cuBLAS
/// (no stream set), cuda_adam (gpu_adam's), NCCL (train_gpt2 makes it on the default stream), and the runtime's copy
/// streams (runtime::release(pass, computed)).
struct default_stream_passes {
  template <class T>
  T* address(T* device) const noexcept {
    return device;
  }
  [[nodiscard]] chunkwise::cuda_event computed() const {
    return chunkwise::record_cuda_event(nullptr, "GPT-2 device passes: a pass's end");
  }
};

/// The GPU machine's profile, measured once (its free memory, pinned copies, cuBLAS, the fused Adam, NCCL across its
/// GPUs, the host's drive and CPU Adam) and cached in `cache` beside the host's: what a run whose chunks live on the
/// GPU plans with (gpu_measure.cu).
chunkwise::machine_profile measure_gpu_machine(const std::filesystem::path& cache,
                                               const chunkwise::measure_options& options);

/// chunkwise::optim::cuda_adam on the current device, for chunks whose arrays are all in device memory.
class gpu_adam {
 public:
  using config_type = chunkwise::optim::adam_config;
  static constexpr std::size_t state_arrays = 2;

  explicit gpu_adam(const config_type& config);
  gpu_adam(gpu_adam&&) noexcept;
  gpu_adam& operator=(gpu_adam&&) noexcept;
  ~gpu_adam();

  [[nodiscard]] const config_type& config() const noexcept;
  void step(std::span<const chunkwise::optim::chunk_arrays> chunks, const chunkwise::optim::step_args& args);
  double grad_sum_of_squares(std::span<const chunkwise::optim::chunk_arrays> chunks);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};
static_assert(chunkwise::optim::chunk_optimizer<gpu_adam>);

}  // namespace gpt2

template <>
struct chunkwise::backend_parts<gpt2::gpu_backend> {
  using device_tier = chunkwise::cuda_device_tier;
  using device_optimizer = gpt2::gpu_adam;
  using pinned_tier = chunkwise::cuda_pinned_host_tier;
  static constexpr bool device_is_host_memory = false;
  static device_optimizer make_optimizer(gpt2::gpu_backend& /*backend*/, const optim::adam_config& config,
                                         unsigned /*threads*/) {
    return device_optimizer(config);
  }
};

#endif  // CHUNKWISE_GPT2_CUDA
