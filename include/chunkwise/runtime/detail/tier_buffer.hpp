#pragma once
// tier_buffer: a zero-filled float array allocated from a memory tier (so the tier's byte budget counts it and
// refuses what does not fit), returned to the tier when destroyed. Movable, not copyable.
#include <chunkwise/core/bytes.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>

namespace chunkwise::detail {

class tier_buffer {
 public:
  tier_buffer() = default;
  template <class Tier>
  tier_buffer(Tier& tier, std::size_t elements) : tier_(&tier), size_(elements) {
    release_ = [](void* owner, void* block, std::size_t count) noexcept {
      static_cast<Tier*>(owner)->deallocate_sync(block, count * sizeof(float));
    };
    if (size_ != 0) {
      data_ = static_cast<float*>(tier.allocate_sync(size_ * sizeof(float)));
      std::fill(data_, data_ + size_, 0.0f);
    }
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
    if (data_ != nullptr) release_(tier_, data_, size_);
  }

  [[nodiscard]] float* data() noexcept { return data_; }
  [[nodiscard]] const float* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::span<float> span() noexcept { return {data_, size_}; }
  [[nodiscard]] std::span<const float> span() const noexcept { return {data_, size_}; }
  float* begin() noexcept { return data_; }
  float* end() noexcept { return data_ + size_; }

 private:
  void swap(tier_buffer& other) noexcept {
    std::swap(tier_, other.tier_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(release_, other.release_);
  }

  void* tier_ = nullptr;
  float* data_ = nullptr;
  std::size_t size_ = 0;
  void (*release_)(void*, void*, std::size_t) noexcept = nullptr;
};

}  // namespace chunkwise::detail
