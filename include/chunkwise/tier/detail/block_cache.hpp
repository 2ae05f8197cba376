#pragma once
// block_cache: the blocks a host-backend tier freed, kept for the next allocation of the same size, as the CUDA
// device tier's memory pool keeps freed memory (tier/cuda/device.cuh). The runtime frees and reallocates the same
// sizes every step (gradient accumulators, gathered copies, cache blocks); without the cache each of those is a fresh
// mapping that the kernel zero-fills page by page on first touch: measured 13% of a GPT-2 step on the host backend
// (perf: clear_page_erms under the accumulators' memset).
//
// What it keeps is bounded: before the tier maps a new block it hands back cached ones until its in-use bytes plus
// the cached ones are within its peak in-use bytes (a freed block is kept whole, so up to its rounding above), so
// the process holds about what the run already needed at once. Under AddressSanitizer nothing is kept, so a use
// after free is still reported.
#include <cstddef>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace chunkwise::detail {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool keep_freed_blocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool keep_freed_blocks = false;
#else
inline constexpr bool keep_freed_blocks = true;
#endif
#else
inline constexpr bool keep_freed_blocks = true;
#endif

class block_cache {
 public:
  using key = std::pair<std::size_t, std::size_t>;  // (rounded bytes, alignment)

  /// A cached block of exactly this size and alignment, or nullptr.
  void* take(key k) {
    std::lock_guard lock(mutex_);
    auto found = blocks_.find(k);
    if (found == blocks_.end() || found->second.empty()) return nullptr;
    void* block = found->second.back();
    found->second.pop_back();
    cached_bytes_ -= k.first;
    return block;
  }
  /// Keeps a freed block for reuse (false: the caller frees it).
  bool keep(key k, void* block) {
    if (!keep_freed_blocks) return false;
    std::lock_guard lock(mutex_);
    blocks_[k].push_back(block);
    cached_bytes_ += k.first;
    return true;
  }
  /// Hands back cached blocks (to `free(block, key)`) until at most `limit` bytes stay cached.
  template <class Free>
  void trim(std::size_t limit, Free&& free) {
    std::vector<std::pair<key, void*>> dropped;
    {
      std::lock_guard lock(mutex_);
      for (auto it = blocks_.begin(); it != blocks_.end() && cached_bytes_ > limit; ++it)
        while (!it->second.empty() && cached_bytes_ > limit) {
          dropped.emplace_back(it->first, it->second.back());
          it->second.pop_back();
          cached_bytes_ -= it->first.first;
        }
    }
    for (const auto& [k, block] : dropped) free(block, k);
  }
 private:
  std::mutex mutex_;
  std::map<key, std::vector<void*>> blocks_;
  std::size_t cached_bytes_ = 0;
};

}  // namespace chunkwise::detail
