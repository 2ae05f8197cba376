#pragma once
// tier_buffer: a zero-filled array allocated from a memory tier (so the tier's byte budget counts it and refuses what
// does not fit), returned to the tier when destroyed. Its elements are fp32 unless a 16-bit element type is given
// (mixed-precision parameters and gradients); data<T>() views them as T. Movable, not copyable.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/worker_threads.hpp>

#include <algorithm>

#include <cstddef>
#include <cstring>
#include <span>
#include <utility>

namespace chunkwise::detail {

class tier_buffer {
 public:
  tier_buffer() = default;
  /// Left as the tier gives it (not zeroed): the caller fills it, with zero(threads) for one.
  struct unfilled_t {};
  static constexpr unfilled_t unfilled{};
  template <class Tier>
  tier_buffer(Tier& tier, std::size_t elements, dtype type, unfilled_t)
      : tier_(&tier), bytes_(elements * size_of(type)) {
    release_ = [](void* owner, void* block, std::size_t bytes) noexcept {
      static_cast<Tier*>(owner)->deallocate_sync(block, bytes);
    };
    if (bytes_ != 0) data_ = static_cast<std::byte*>(tier.allocate_sync(bytes_));
  }
  template <class Tier>
  tier_buffer(Tier& tier, std::size_t elements, dtype type = dtype::fp32)
      : tier_buffer(tier, elements, type, unfilled) {
    zero();
  }
  tier_buffer(tier_buffer&& other) noexcept { swap(other); }
  tier_buffer& operator=(tier_buffer&& other) noexcept {
    tier_buffer moved(std::move(other));
    swap(moved);
    return *this;
  }
  tier_buffer(const tier_buffer&) = delete;
  tier_buffer& operator=(const tier_buffer&) = delete;
  ~tier_buffer() {
    if (data_ != nullptr) release_(tier_, data_, bytes_);
  }

  template <class T = float>
  [[nodiscard]] T* data() noexcept {
    return reinterpret_cast<T*>(data_);
  }
  template <class T = float>
  [[nodiscard]] const T* data() const noexcept {
    return reinterpret_cast<const T*>(data_);
  }
  template <class T = float>
  [[nodiscard]] std::span<T> span() noexcept {
    return {data<T>(), bytes_ / sizeof(T)};
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] bool empty() const noexcept { return bytes_ == 0; }
  /// Whether both came from the same tier (so swapping them moves no bytes between budgets).
  [[nodiscard]] bool same_tier(const tier_buffer& other) const noexcept { return tier_ == other.tier_; }
  void zero() noexcept {
    if (data_ != nullptr) std::memset(data_, 0, bytes_);
  }
  /// zero() in 1 MiB tiles on `threads` and the caller: a chunk's worth of memset on one core is most of a GPU
  /// step's host time (gradient accumulators, every step).
  void zero(worker_threads& threads) noexcept {
    constexpr std::size_t tile = std::size_t{1} << 20;
    threads.parallel_for((bytes_ + tile - 1) / tile, [&](std::size_t i) noexcept {
      std::memset(data_ + i * tile, 0, std::min(tile, bytes_ - i * tile));
    });
  }

 private:
  void swap(tier_buffer& other) noexcept {
    std::swap(tier_, other.tier_);
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(release_, other.release_);
  }

  void* tier_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  void (*release_)(void*, void*, std::size_t) noexcept = nullptr;
};

}  // namespace chunkwise::detail
