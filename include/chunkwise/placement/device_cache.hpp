#pragma once
// The device chunk cache: a fixed number of chunk-sized device blocks holding the chunks in use. Chunks are fetched
// ahead along the profiled access order (prefetch depth k) and evicted by next use (Belady: the chunk whose next use in
// the order is furthest) or by LRU. Dirty chunks are written back to their home on eviction, and a later fetch of the
// same chunk or into the same block is ordered after that write-back.
//
// The profiled order is cyclic (one training step, repeated). An access that departs from it costs a miss (when the
// chunk is not cached) and a `departures` count, and the cursor re-synchronises at that chunk's next profiled use:
// never a hang, never stale data.
//
// One thread drives the cache (acquire/release/flush); moves run on the engine's streams and movers.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/placement/detail/next_use.hpp>
#include <chunkwise/tier/concepts.hpp>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chunkwise {

enum class eviction : std::uint8_t { next_use, lru };

constexpr std::string_view to_string(eviction policy) noexcept {
  return policy == eviction::next_use ? "next_use" : "lru";
}

struct cache_options {
  std::size_t blocks = 2;           // device blocks of chunk_bytes each
  byte_count chunk_bytes = 0;       // bytes of one chunk (every chunk moves whole)
  eviction policy = eviction::next_use;
  std::size_t prefetch_depth = 2;   // upcoming accesses of the profiled order fetched ahead
  std::vector<std::uint32_t> pinned_chunks{};  // chunks never evicted once fetched (`split`'s resident chunks)
};

struct cache_stats {
  std::uint64_t accesses = 0;
  std::uint64_t hits = 0;        // the chunk had a block (its fetch may still have been in flight: see stall_time)
  std::uint64_t misses = 0;      // the chunk had no block: a demand fetch
  std::uint64_t prefetches = 0;  // fetches issued ahead of their access
  std::uint64_t evictions = 0;
  std::uint64_t write_backs = 0;
  std::uint64_t departures = 0;  // accesses that were not the next one in the profiled order
  std::uint64_t invalidations = 0;  // cached copies dropped because their home changed
  byte_count bytes_home_to_device = 0;
  byte_count bytes_device_to_home = 0;
  std::uint64_t stream_ordered = 0;  // acquire_for: a fetch in flight left for the consumer's stream to wait on
  std::chrono::nanoseconds stall_time{0};  // time acquire waited for a fetch (acquire_for: to queue the wait)
  std::string_view home_space{};           // the tier the bytes moved from and to ("nvme", "pinned_host", ...)
  [[nodiscard]] std::uint64_t fetches() const noexcept { return misses + prefetches; }

  /// One line for logs and `explain`: "42 accesses: 30 hits, 12 misses, 10 prefetches, ... nvme->device 1.00 GiB".
  [[nodiscard]] std::string summary() const {
    char stalled[32];
    std::snprintf(stalled, sizeof stalled, "%.3f ms", static_cast<double>(stall_time.count()) / 1e6);
    const std::string home(home_space.empty() ? std::string_view("home") : home_space);
    return std::to_string(accesses) + " accesses: " + std::to_string(hits) + " hits, " + std::to_string(misses) +
           " misses, " + std::to_string(prefetches) + " prefetches, " + std::to_string(evictions) + " evictions, " +
           std::to_string(write_backs) + " write-backs, " + std::to_string(invalidations) + " invalidations, " +
           std::to_string(departures) + " departures; " + home +
           "->device " + format_bytes(bytes_home_to_device) + ", device->" + home + " " +
           format_bytes(bytes_device_to_home) + "; stalled " + stalled +
           (stream_ordered > 0 ? ", " + std::to_string(stream_ordered) + " fetches waited for in stream order" : "");
  }
};

/// `Engine` is a transfer_engine; `DeviceTier` the tier the blocks come from (its byte budget bounds `blocks`).
template <class Engine, class DeviceTier>
class device_cache {
 public:
  using home_handle = typename Engine::home_handle;
  using transfer_type = typename Engine::transfer_type;
  static constexpr std::int32_t no_block = -1;
  static constexpr std::int32_t no_chunk = -1;

  /// `homes[c]`: chunk c's block in the home tier (written before the first acquire). `order`: the profiled access
  /// order, a sequence of chunk ids (may be empty: then every fetch is on demand).
  device_cache(Engine& engine, DeviceTier& device, std::vector<home_handle> homes, std::vector<std::uint32_t> order,
               cache_options options)
      : engine_(engine), device_(device), homes_(std::move(homes)), options_(std::move(options)),
        order_(check_order(order, homes_.size()), homes_.size()) {
    if (options_.blocks == 0)
      detail::raise(error_code::invalid_argument, "device_cache: 0 blocks; a cache needs at least one device block");
    if (options_.chunk_bytes == 0)
      detail::raise(error_code::invalid_argument, "device_cache: chunk_bytes is 0; set it to the chunk size");
    pinned_.assign(homes_.size(), false);
    for (auto chunk : options_.pinned_chunks) {
      check_chunk(chunk, "pinned_chunks");
      pinned_[chunk] = true;
    }
    if (options_.pinned_chunks.size() >= options_.blocks && options_.pinned_chunks.size() < homes_.size())
      detail::raise(error_code::invalid_argument,
                    "device_cache: " + std::to_string(options_.pinned_chunks.size()) + " pinned chunks in " +
                        std::to_string(options_.blocks) + " blocks leave none for the other " +
                        std::to_string(homes_.size() - options_.pinned_chunks.size()) + " chunks");
    stats_.home_space = Engine::home_space_name;
    chunk_block_.assign(homes_.size(), no_block);
    last_write_back_.resize(homes_.size());
    blocks_.reserve(options_.blocks);
    try {
      for (std::size_t b = 0; b < options_.blocks; ++b)
        blocks_.push_back(block{device_.allocate_sync(options_.chunk_bytes, 256)});
    } catch (...) {
      release_blocks();
      throw;
    }
  }
  device_cache(const device_cache&) = delete;
  device_cache& operator=(const device_cache&) = delete;
  /// Waits for the moves in flight and frees the blocks. Dirty chunks are not written back: call flush() first.
  ~device_cache() {
    for (auto& b : blocks_) {
      wait_quietly(b.fetch);
      wait_quietly(b.used_until);
      wait_quietly(b.free_after);
    }
    release_blocks();
  }

  /// The device block holding chunk `chunk`, its bytes ready. The chunk stays put until the matching release.
  void* acquire(std::uint32_t chunk) {
    return acquire_block(chunk, "acquire", [](const transfer_type&) { return false; });
  }

  /// acquire() for device work queued on `stream`, a stream of the engine's backend (the trainer's kernels on its
  /// compute stream): a fetch still in flight that completes with an event is left for `stream` to wait on, so the
  /// calling thread goes on queuing work while the copy runs. A fetch that completes on a host thread (an NVMe
  /// read, a copy ordered after an update on the host) is waited for here, as by acquire(). Work on `stream` reads
  /// the block; the host may not until that work has run.
  template <class Stream>
  void* acquire_for(std::uint32_t chunk, Stream&& stream) {
    return acquire_block(chunk, "acquire_for", [&](const transfer_type& fetch) {
      if (!fetch.is_event()) return false;
      engine_.backend().wait_on(stream, fetch.event());
      ++stats_.stream_ordered;
      return true;
    });
  }

  /// Acquires `chunk` like acquire() but returns at once with its block and the fetch that fills it (complete when
  /// the block already held the chunk): for a consumer that orders itself after the fetch instead of waiting here
  /// (a collective gather prefetched from the block). The acquire counts as the chunk's access in the profiled order.
  struct lent_block {
    void* memory = nullptr;
    transfer_type filled{};
  };
  lent_block acquire_ahead(std::uint32_t chunk) {
    check_chunk(chunk, "acquire_ahead");
    const std::int32_t b = map_for_access(chunk);
    auto& slot = blocks_[static_cast<std::size_t>(b)];
    ++slot.acquired;
    slot.last_use = ++tick_;
    prefetch();
    return {slot.memory, slot.fetch};
  }

  /// Ends one acquire of `chunk`; `dirty` when its bytes changed (they are written back on eviction or flush).
  /// `used_until`: completes when the device work that used the block is done (on the CUDA backend, a transfer made
  /// with transfer::after_event from the compute stream); write-backs and refills of the block are ordered after it.
  /// On the host backend compute is done when release is called: leave it empty. One compute stream is assumed:
  /// the latest release's completion covers the earlier ones.
  void release(std::uint32_t chunk, bool dirty = false, transfer_type used_until = {}) {
    check_chunk(chunk, "release");
    const std::int32_t b = chunk_block_[chunk];
    if (b == no_block || blocks_[static_cast<std::size_t>(b)].acquired == 0)
      detail::raise(error_code::illegal_state,
                    "device_cache: release of chunk " + std::to_string(chunk) + ", which is not acquired");
    auto& slot = blocks_[static_cast<std::size_t>(b)];
    --slot.acquired;
    slot.dirty |= dirty;
    slot.used_until = std::move(used_until);
  }

  /// Writes every dirty chunk back to its home and waits; the cached copies stay valid and clean. A write-back that
  /// fails leaves its chunk dirty (the cached copy is then the only good one) and rethrows after the others finish.
  void flush() {
    std::vector<std::pair<std::size_t, transfer_type>> pending;
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      auto& slot = blocks_[b];
      if (slot.chunk != no_chunk && slot.dirty) pending.emplace_back(b, write_back(static_cast<std::uint32_t>(slot.chunk), slot));
    }
    std::exception_ptr failure;
    for (auto& [b, done] : pending) {
      try {
        done.wait();
      } catch (...) {
        blocks_[b].dirty = true;
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
  }

  /// Drops the cached copy of `chunk` because its home changes (the optimizer updates it there): the next acquire
  /// fetches the new bytes. Waits for a fetch of it still in flight, so the home may be rewritten on return. A copy
  /// that is acquired or dirty cannot be dropped (its user or its changes would be lost): illegal_state.
  /// `home_changed`: when the change is still running elsewhere (an update beside backward), its completion; every
  /// later fetch of the chunk, a prefetch too, is ordered after it.
  void invalidate(std::uint32_t chunk, transfer_type home_changed = {}) {
    check_chunk(chunk, "invalidate");
    if (!home_changed.ready()) last_write_back_[chunk] = std::move(home_changed);
    const std::int32_t b = chunk_block_[chunk];
    if (b == no_block) return;
    auto& slot = blocks_[static_cast<std::size_t>(b)];
    if (slot.acquired > 0 || slot.dirty)
      detail::raise(error_code::illegal_state, "device_cache: invalidate of chunk " + std::to_string(chunk) +
                                                   (slot.acquired > 0 ? ", which is acquired" : ", whose copy is dirty") +
                                                   "; release it (and flush) before changing its home");
    wait_quietly(slot.fetch);  // a failed fetch is dropped with the copy
    slot.fetch = transfer_type{};
    chunk_block_[chunk] = no_block;
    slot.chunk = no_chunk;
    ++stats_.invalidations;
  }

  /// Issues the fetches of the next accesses in the profiled order that have no block yet (after invalidations,
  /// say, so the next iteration's first chunks move while the trainer does other work).
  void prefetch_ahead() { prefetch(); }

  /// The block holding `chunk`'s copy as it is in its home: fetched, the fetch finished and succeeded, unchanged
  /// since (not dirty); null otherwise. A device address where the device tier is not host memory. Read it at once,
  /// on the thread that drives the cache: the next acquire, prefetch or invalidate may reuse the block. (An update of
  /// an NVMe home takes its working block from here instead of reading it from the drive a second time.)
  [[nodiscard]] const void* clean_block(std::uint32_t chunk) const {
    check_chunk(chunk, "clean_block");
    const std::int32_t b = chunk_block_[chunk];
    if (b == no_block) return nullptr;
    const auto& slot = blocks_[static_cast<std::size_t>(b)];
    if (slot.dirty || !slot.fetch.ready()) return nullptr;
    try {
      slot.fetch.wait();  // ready: rethrows at once where the fetch failed (the block then holds nothing good)
    } catch (...) {
      return nullptr;
    }
    return slot.memory;
  }

  [[nodiscard]] bool is_cached(std::uint32_t chunk) const {
    check_chunk(chunk, "is_cached");
    return chunk_block_[chunk] != no_block;
  }
  [[nodiscard]] const cache_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const cache_options& options() const noexcept { return options_; }
  [[nodiscard]] std::size_t chunk_count() const noexcept { return homes_.size(); }

 private:
  struct block {
    void* memory = nullptr;
    std::int32_t chunk = no_chunk;
    bool dirty = false;
    std::uint32_t acquired = 0;
    std::uint64_t last_use = 0;
    transfer_type fetch{};       // the fetch that filled this block
    transfer_type used_until{};  // the device work of the last release
    transfer_type free_after{};  // a write-back (or unfinished fetch) still touching this block after eviction
  };

  static const std::vector<std::uint32_t>& check_order(const std::vector<std::uint32_t>& order, std::size_t chunks) {
    for (std::size_t p = 0; p < order.size(); ++p)
      if (order[p] >= chunks)
        detail::raise(error_code::invalid_argument, "device_cache: profiled order names chunk " +
                                                        std::to_string(order[p]) + " at position " +
                                                        std::to_string(p) + "; there are " +
                                                        std::to_string(chunks) + " chunks");
    return order;
  }
  void check_chunk(std::uint32_t chunk, const char* what) const {
    if (chunk >= homes_.size())
      detail::raise(error_code::invalid_argument, std::string("device_cache: ") + what + " of chunk " +
                                                      std::to_string(chunk) + "; there are " +
                                                      std::to_string(homes_.size()) + " chunks");
  }

  static void wait_quietly(const transfer_type& t) noexcept {
    try {
      t.wait();
    } catch (...) {
    }
  }
  void release_blocks() noexcept {
    for (auto& b : blocks_) {
      try {
        device_.deallocate_sync(b.memory, options_.chunk_bytes, 256);
      } catch (...) {  // a failing free in teardown (a lost device) leaks the block rather than terminate
      }
    }
    blocks_.clear();
  }

  // One access of `chunk` in the profiled order: its block, mapped and its fetch issued on a miss.
  std::int32_t map_for_access(std::uint32_t chunk) {
    ++stats_.accesses;
    follow_order(chunk);
    std::int32_t b = chunk_block_[chunk];
    if (b != no_block) {
      ++stats_.hits;
      return b;
    }
    ++stats_.misses;
    b = take_block(chunk, /*for_prefetch=*/false);
    if (b == no_block) raise_no_block(chunk);
    load(chunk, b);
    return b;
  }
  [[noreturn]] void raise_no_block(std::uint32_t chunk) const {
    detail::raise(error_code::out_of_memory,
                  "device_cache: acquire of chunk " + std::to_string(chunk) + " needs a block, but all " +
                      std::to_string(blocks_.size()) + " device blocks (" +
                      format_bytes(blocks_.size() * options_.chunk_bytes) +
                      ") hold acquired or pinned chunks; release one or raise the block count");
  }

  // Advances the cursor past this access; a departure re-synchronises at the chunk's next profiled use.
  void follow_order(std::uint32_t chunk) {
    if (order_.period() == 0) return;
    if (order_.at(cursor_) == chunk) {
      ++cursor_;
      return;
    }
    ++stats_.departures;
    const std::size_t distance = order_.distance(chunk, cursor_);
    if (distance != detail::next_use_index::never) cursor_ += distance + 1;
  }

  std::size_t next_use(std::int32_t chunk) const {
    if (order_.period() == 0) return detail::next_use_index::never;
    return order_.distance(static_cast<std::uint32_t>(chunk), cursor_);
  }

  // A block for `chunk`: a free one, else a victim by the eviction policy (never an acquired or pinned chunk). For a
  // prefetch under next-use, only a victim used later than `chunk` (Belady would not swap them otherwise); under LRU,
  // never a chunk inside the prefetch window. no_block when none qualifies.
  std::int32_t take_block(std::uint32_t chunk, bool for_prefetch) {
    std::int32_t victim = no_block;
    std::size_t victim_next = 0;
    std::uint64_t victim_last = 0;
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      const auto& slot = blocks_[b];
      if (slot.chunk == no_chunk) return static_cast<std::int32_t>(b);
      if (slot.acquired > 0 || pinned_[static_cast<std::size_t>(slot.chunk)]) continue;
      if (options_.policy == eviction::next_use) {
        const std::size_t next = next_use(slot.chunk);
        if (victim == no_block || next > victim_next) {
          victim = static_cast<std::int32_t>(b);
          victim_next = next;
        }
      } else {
        if (for_prefetch && next_use(slot.chunk) < options_.prefetch_depth) continue;
        if (victim == no_block || slot.last_use < victim_last) {
          victim = static_cast<std::int32_t>(b);
          victim_last = slot.last_use;
        }
      }
    }
    if (victim == no_block) return no_block;
    if (for_prefetch && options_.policy == eviction::next_use && victim_next <= next_use(static_cast<std::int32_t>(chunk)))
      return no_block;
    evict(blocks_[static_cast<std::size_t>(victim)]);
    return victim;
  }

  transfer_type write_back(std::uint32_t chunk, block& slot) {
    // Ordered after the fetch that filled the block (the engine's streams are per direction) and the compute that
    // changed it.
    transfer_type after[] = {slot.fetch, slot.used_until};
    auto done = engine_.write_back(homes_[chunk], slot.memory, options_.chunk_bytes, after);
    ++stats_.write_backs;
    stats_.bytes_device_to_home += options_.chunk_bytes;
    last_write_back_[chunk] = done;
    slot.free_after = done;
    slot.dirty = false;
    return done;
  }

  void evict(block& slot) {
    const auto chunk = static_cast<std::uint32_t>(slot.chunk);
    if (slot.dirty) write_back(chunk, slot);
    else slot.free_after = slot.fetch;  // an unfinished fetch must land before the block is refilled
    chunk_block_[chunk] = no_block;
    slot.chunk = no_chunk;
    ++stats_.evictions;
  }

  void load(std::uint32_t chunk, std::int32_t b) {
    auto& slot = blocks_[static_cast<std::size_t>(b)];
    transfer_type after[] = {slot.free_after, slot.used_until, last_write_back_[chunk]};
    slot.fetch = engine_.fetch(slot.memory, homes_[chunk], options_.chunk_bytes, after);
    slot.free_after = transfer_type{};
    slot.used_until = transfer_type{};
    slot.chunk = static_cast<std::int32_t>(chunk);
    slot.dirty = false;
    slot.last_use = ++tick_;
    chunk_block_[chunk] = b;
    stats_.bytes_home_to_device += options_.chunk_bytes;
  }

  // One acquire of `chunk`: its block, mapped and counted; a fetch in flight is handed to `order_after` (true when it
  // ordered the consumer after it) or waited for. Counted as acquired before the wait: a prefetch must not take it.
  template <class OrderAfter>
  void* acquire_block(std::uint32_t chunk, const char* what, OrderAfter order_after) {
    check_chunk(chunk, what);
    const std::int32_t b = map_for_access(chunk);
    auto& slot = blocks_[static_cast<std::size_t>(b)];
    ++slot.acquired;
    slot.last_use = ++tick_;
    if (!slot.fetch.ready()) {
      const auto start = std::chrono::steady_clock::now();
      if (!order_after(slot.fetch)) await_fetch(slot, chunk);
      stats_.stall_time += std::chrono::steady_clock::now() - start;
    } else {
      await_fetch(slot, chunk);  // ready: rethrows a failed fetch
    }
    prefetch();
    return slot.memory;
  }

  // Waits for the block's fetch; a failed fetch unmaps the chunk (the block is free again) and rethrows.
  void await_fetch(block& slot, std::uint32_t chunk) {
    try {
      slot.fetch.wait();
    } catch (...) {
      --slot.acquired;
      chunk_block_[chunk] = no_block;
      slot.chunk = no_chunk;
      slot.fetch = transfer_type{};
      throw;
    }
  }

  void prefetch() {
    if (order_.period() == 0) return;
    const std::size_t depth = std::min(options_.prefetch_depth, order_.period());
    for (std::size_t i = 0; i < depth; ++i) {
      const std::uint32_t chunk = order_.at(cursor_ + i);
      if (chunk_block_[chunk] != no_block) continue;
      const std::int32_t b = take_block(chunk, /*for_prefetch=*/true);
      if (b == no_block) return;
      load(chunk, b);
      ++stats_.prefetches;
    }
  }

  Engine& engine_;
  DeviceTier& device_;
  std::vector<home_handle> homes_;
  cache_options options_;
  detail::next_use_index order_;
  std::vector<bool> pinned_;
  std::vector<std::int32_t> chunk_block_;
  std::vector<transfer_type> last_write_back_;
  std::vector<block> blocks_;
  std::size_t cursor_ = 0;
  std::uint64_t tick_ = 0;
  cache_stats stats_;
};

}  // namespace chunkwise
