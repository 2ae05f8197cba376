#pragma once
// Budgeted aligned host allocations: the body of every host-backend tier (device stand-in, pinned, pageable).
#include <chunkwise/backend/host.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/tier/concepts.hpp>
#include <chunkwise/tier/detail/block_cache.hpp>
#include <chunkwise/tier/detail/budget.hpp>

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace chunkwise::detail {

inline constexpr std::size_t page_bytes = 4096;
inline constexpr std::size_t huge_page_bytes = 2 * 1024 * 1024;

/// Checks that an alignment is a power of two; 0 means "the tier's default".
inline std::size_t checked_alignment(std::size_t alignment, std::size_t minimum, const std::string& tier) {
  if (alignment == 0) return minimum;
  if ((alignment & (alignment - 1)) != 0)
    raise(error_code::invalid_argument,
          tier + " tier: alignment " + std::to_string(alignment) + " is not a power of two");
  return alignment < minimum ? minimum : alignment;
}

class aligned_host_memory {
 public:
  aligned_host_memory(std::string_view name, byte_count capacity, std::size_t min_alignment, bool lock_pages)
      : budget_(name, capacity), min_alignment_(min_alignment), lock_pages_(lock_pages) {}

  aligned_host_memory(const aligned_host_memory&) = delete;
  aligned_host_memory& operator=(const aligned_host_memory&) = delete;
  ~aligned_host_memory() {
    freed_.trim(0, [&](void* block, block_cache::key k) { release_block(block, k); });
  }

  void* allocate(byte_count bytes, std::size_t alignment) {
    const block_cache::key k = block_key(bytes, checked_alignment(alignment, min_alignment_, budget_.name()));
    budget_.reserve(bytes);
    if (void* cached = freed_.take(k)) return cached;
    // A new mapping: first hand back cached blocks until in-use plus cached bytes are within the peak.
    const byte_count in_use = budget_.in_use(), peak = budget_.stats().peak;
    freed_.trim(peak > in_use ? peak - in_use : 0,
                [&](void* block, block_cache::key old) { release_block(block, old); });
    const auto [rounded, aligned] = k;
    void* memory = nullptr;
    if (const int rc = ::posix_memalign(&memory, aligned, rounded); rc != 0) {
      budget_.release(bytes);
      raise(rc == ENOMEM ? error_code::out_of_memory : error_code::invalid_argument,
            budget_.name() + " tier: posix_memalign(" + std::to_string(aligned) + ", " + std::to_string(rounded) +
                ") failed: " + std::strerror(rc) + " (the budget allowed it: " + format_bytes(budget_.in_use()) +
                " in use of " + format_bytes(budget_.capacity()) + ")");
    }
    if (rounded >= huge_page_bytes) (void)::madvise(memory, rounded, MADV_HUGEPAGE);  // advice only: fine to fail
    if (lock_pages_ && ::mlock(memory, rounded) != 0) {
      const int e = errno;
      std::free(memory);
      budget_.release(bytes);
      raise(error_code::out_of_memory, budget_.name() + " tier: mlock(" + std::to_string(rounded) +
                                           " bytes) failed: " + std::strerror(e) +
                                           " (raise RLIMIT_MEMLOCK or turn page locking off)");
    }
    return memory;
  }

  /// The block goes back to the budget at once; its memory is kept for the next allocation of its size.
  void deallocate(void* memory, byte_count bytes, std::size_t alignment) noexcept {
    if (memory == nullptr) return;
    const block_cache::key k = block_key(bytes, alignment < min_alignment_ ? min_alignment_ : alignment);
    budget_.release(bytes);
    if (!freed_.keep(k, memory)) release_block(memory, k);
  }

  byte_budget& budget() noexcept { return budget_; }
  const byte_budget& budget() const noexcept { return budget_; }

 private:
  // Large blocks on 2 MiB boundaries, marked for transparent huge pages: fewer TLB misses for copies and fewer pages
  // for O_DIRECT to pin per request. The size is rounded to the alignment (posix_memalign wants a size > 0), so
  // O_DIRECT may use the tail of the buffer.
  static block_cache::key block_key(byte_count bytes, std::size_t alignment) noexcept {
    if (bytes >= huge_page_bytes && alignment < huge_page_bytes) alignment = huge_page_bytes;
    return {round_up(bytes == 0 ? 1 : bytes, alignment), alignment};
  }
  void release_block(void* memory, block_cache::key k) noexcept {
    if (lock_pages_) ::munlock(memory, k.first);
    std::free(memory);
  }

  byte_budget budget_;
  std::size_t min_alignment_;
  bool lock_pages_;
  block_cache freed_;
};

/// The shared surface of the host-backend tiers: `Space` names the space, `Derived` adds the property friends.
template <class Space>
class host_backend_tier {
 public:
  using space = Space;
  using handle_type = void*;
  using stream_ref = host_stream&;

  void* allocate(host_stream& /*stream*/, byte_count bytes, std::size_t alignment = 0) {
    return memory_.allocate(bytes, alignment);  // host memory is usable at once, by every stream
  }
  /// Freed once the work queued on `stream` so far has run (it may still be reading the block).
  void deallocate(host_stream& stream, void* block, byte_count bytes, std::size_t alignment = 0) {
    stream.enqueue([this, block, bytes, alignment] { memory_.deallocate(block, bytes, alignment); });
  }
  void* allocate_sync(byte_count bytes, std::size_t alignment = 0) { return memory_.allocate(bytes, alignment); }
  void deallocate_sync(void* block, byte_count bytes, std::size_t alignment = 0) noexcept {
    memory_.deallocate(block, bytes, alignment);
  }

  [[nodiscard]] tier_stats stats() const noexcept { return memory_.budget().stats(); }
  [[nodiscard]] byte_count capacity() const noexcept { return memory_.budget().capacity(); }
  void note_read(byte_count bytes) noexcept { memory_.budget().note_read(bytes); }
  void note_written(byte_count bytes) noexcept { memory_.budget().note_written(bytes); }

 protected:
  host_backend_tier(std::string_view name, byte_count capacity, std::size_t min_alignment, bool lock_pages)
      : memory_(name, capacity, min_alignment, lock_pages) {}

 private:
  aligned_host_memory memory_;
};

}  // namespace chunkwise::detail
