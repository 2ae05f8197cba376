#pragma once
// The CUDA device tier: stream-ordered cudaMallocFromPoolAsync from this tier's own memory pool, under a byte budget
// (the pool keeps up to the budget cached: its release threshold), so "does it fit" is answered by the budget with
// the same message as on the host backend, before the GPU itself runs out.
#include <chunkwise/core/cuda/checked_call.cuh>
#include <chunkwise/core/cuda/current_device.cuh>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/tier/concepts.hpp>
#include <chunkwise/tier/detail/budget.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace chunkwise {

class cuda_device_tier {
 public:
  using space = space::device;
  using handle_type = void*;
  using stream_ref = cudaStream_t;
  static constexpr std::size_t max_alignment = 256;  // what cudaMallocAsync guarantees

  /// Memory of `device`, or of the calling thread's current one.
  explicit cuda_device_tier(byte_count budget, int device = detail::use_current_device)
      : device_(detail::resolve_cuda_device(device, "CUDA device tier")), budget_("device (CUDA)", budget) {
    const std::string context = "CUDA device tier on device " + std::to_string(device_);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    CHUNKWISE_CUDA_TRY(cudaMemPoolCreate(&pool_, &props), context);
    std::uint64_t threshold = budget;
    const cudaError_t status = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (status != cudaSuccess) {
      (void)cudaMemPoolDestroy(pool_);
      throw_call_failure(cuda_code(status), "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)", context, __FILE__, __LINE__);
    }
  }
  cuda_device_tier(const cuda_device_tier&) = delete;
  cuda_device_tier& operator=(const cuda_device_tier&) = delete;
  ~cuda_device_tier() {
    int current = 0;  // the calling thread's device may be another GPU: synchronise this tier's, then restore it
    const bool restore = cudaGetDevice(&current) == cudaSuccess && current != device_;
    if (restore) (void)cudaSetDevice(device_);
    (void)cudaDeviceSynchronize();  // frees queued on streams have run
    (void)cudaMemPoolDestroy(pool_);
    if (restore) (void)cudaSetDevice(current);
  }

  void* allocate(cudaStream_t stream, byte_count bytes, std::size_t alignment = 0) {
    check_alignment(alignment);
    budget_.reserve(bytes);
    void* memory = nullptr;
    const cudaError_t status = cudaMallocFromPoolAsync(&memory, bytes, pool_, stream);
    if (status != cudaSuccess) {
      budget_.release(bytes);
      (void)cudaGetLastError();  // a caller that makes room and retries must not see it again at its next launch
      throw_call_failure(cuda_code(status), "cudaMallocFromPoolAsync", "CUDA device tier: " + format_bytes(bytes) + " with " + format_bytes(budget_.in_use()) +
                             " of a " + format_bytes(budget_.capacity()) + " budget in use", __FILE__, __LINE__);
    }
    return memory;
  }
  /// Stream-ordered: the memory returns to the pool once the work queued on `stream` before it has run.
  void deallocate(cudaStream_t stream, void* memory, byte_count bytes, std::size_t /*alignment*/ = 0) {
    if (memory == nullptr) return;
    CHUNKWISE_CUDA_TRY(cudaFreeAsync(memory, stream), std::string("CUDA device tier: free"));
    budget_.release(bytes);
  }
  /// Stream-ordered zeros: later work on `stream` sees them, the host does not wait.
  void fill_zero(cudaStream_t stream, void* memory, byte_count bytes) {
    CHUNKWISE_CUDA_TRY(cudaMemsetAsync(memory, 0, bytes, stream), std::string("CUDA device tier: fill_zero"));
  }
  void* allocate_sync(byte_count bytes, std::size_t alignment = 0) {
    void* memory = allocate(cudaStreamPerThread, bytes, alignment);
    CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread), std::string("CUDA device tier: allocate_sync"));
    return memory;
  }
  void deallocate_sync(void* memory, byte_count bytes, std::size_t alignment = 0) {
    deallocate(cudaStreamPerThread, memory, bytes, alignment);
    CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread), std::string("CUDA device tier: deallocate_sync"));
  }

  // The host's way to device memory (tier/concepts.hpp host_staged_tier): synchronous, after the work queued on
  // this thread's default stream, and complete on return: cudaMemcpy from pageable memory may return before its
  // DMA lands, and a collective on another stream (nccl_comm's) would then read the old bytes.
  void fill_zero(void* memory, byte_count bytes) {
    const std::string context = "CUDA device tier: fill_zero";
    CHUNKWISE_CUDA_TRY(cudaMemsetAsync(memory, 0, bytes, cudaStreamPerThread), context);
    CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread), context);
  }
  void copy_to_host(void* host, const void* memory, byte_count bytes) {
    copy(host, memory, bytes, cudaMemcpyDeviceToHost, "CUDA device tier: copy_to_host");
  }
  void copy_from_host(void* memory, const void* host, byte_count bytes) {
    copy(memory, host, bytes, cudaMemcpyHostToDevice, "CUDA device tier: copy_from_host");
  }

  [[nodiscard]] tier_stats stats() const noexcept { return budget_.stats(); }
  [[nodiscard]] byte_count capacity() const noexcept { return budget_.capacity(); }
  void note_read(byte_count bytes) noexcept { budget_.note_read(bytes); }
  void note_written(byte_count bytes) noexcept { budget_.note_written(bytes); }
  [[nodiscard]] cudaMemPool_t pool() const noexcept { return pool_; }
  [[nodiscard]] int device() const noexcept { return device_; }

  friend constexpr void get_property(const cuda_device_tier&, device_accessible) noexcept {}

 private:
  static void copy(void* to, const void* from, byte_count bytes, cudaMemcpyKind kind, const char* context) {
    CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(to, from, bytes, kind, cudaStreamPerThread), std::string(context));
    CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread), std::string(context));
  }
  static void check_alignment(std::size_t alignment) {
    if (alignment > max_alignment || (alignment & (alignment - 1)) != 0)
      detail::raise(error_code::invalid_argument,
                    "CUDA device tier: alignment " + std::to_string(alignment) +
                        " asked; cudaMallocAsync guarantees a power of two up to " + std::to_string(max_alignment));
  }

  int device_;
  detail::byte_budget budget_;
  cudaMemPool_t pool_ = nullptr;
};

static_assert(memory_tier_with<cuda_device_tier, device_accessible>);
static_assert(!has_property<cuda_device_tier, host_accessible>);
static_assert(host_staged_tier<cuda_device_tier>);

}  // namespace chunkwise
