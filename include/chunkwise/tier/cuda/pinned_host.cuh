#pragma once
// The CUDA pinned host tier: cudaHostAlloc (page-locked, portable across devices, page-aligned so it doubles as an
// O_DIRECT buffer) under a byte budget.
#include <chunkwise/core/cuda/checked_call.cuh>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/tier/concepts.hpp>
#include <chunkwise/tier/detail/budget.hpp>

#include <cuda_runtime.h>

#include <string>

namespace chunkwise {

class cuda_pinned_host_tier {
 public:
  using space = space::pinned_host;
  using handle_type = void*;
  using stream_ref = cudaStream_t;
  static constexpr std::size_t max_alignment = 4096;  // cudaHostAlloc returns page-aligned memory

  explicit cuda_pinned_host_tier(byte_count budget) : budget_("pinned host (CUDA)", budget) {}

  void* allocate(cudaStream_t, byte_count bytes, std::size_t alignment = 0) { return allocate_sync(bytes, alignment); }
  /// Waits for the work queued on `stream` (it may still read the block), then frees.
  void deallocate(cudaStream_t stream, void* memory, byte_count bytes, std::size_t alignment = 0) {
    CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(stream), std::string("pinned host tier (CUDA): free"));
    deallocate_sync(memory, bytes, alignment);
  }
  void* allocate_sync(byte_count bytes, std::size_t alignment = 0) {
    if (alignment > max_alignment || (alignment & (alignment - 1)) != 0)
      detail::raise(error_code::invalid_argument, "pinned host tier (CUDA): alignment " + std::to_string(alignment) +
                                                      " asked; cudaHostAlloc gives a power of two up to 4096");
    budget_.reserve(bytes);
    void* memory = nullptr;
    const cudaError_t status = cudaHostAlloc(&memory, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (status != cudaSuccess) {
      budget_.release(bytes);
      throw_call_failure(cuda_code(status), "cudaHostAlloc", "pinned host tier (CUDA): " + format_bytes(bytes) + " with " +
                             format_bytes(budget_.in_use()) + " of a " + format_bytes(budget_.capacity()) +
                             " budget in use", __FILE__, __LINE__);
    }
    return memory;
  }
  void deallocate_sync(void* memory, byte_count bytes, std::size_t /*alignment*/ = 0) {
    if (memory == nullptr) return;
    CHUNKWISE_CUDA_TRY(cudaFreeHost(memory), std::string("pinned host tier (CUDA): cudaFreeHost"));
    budget_.release(bytes);
  }

  [[nodiscard]] tier_stats stats() const noexcept { return budget_.stats(); }
  [[nodiscard]] byte_count capacity() const noexcept { return budget_.capacity(); }
  void note_read(byte_count bytes) noexcept { budget_.note_read(bytes); }
  void note_written(byte_count bytes) noexcept { budget_.note_written(bytes); }

  friend constexpr void get_property(const cuda_pinned_host_tier&, host_accessible) noexcept {}
  friend constexpr void get_property(const cuda_pinned_host_tier&, device_accessible) noexcept {}

 private:
  detail::byte_budget budget_;
};

static_assert(memory_tier_with<cuda_pinned_host_tier, host_accessible, device_accessible>);

}  // namespace chunkwise
