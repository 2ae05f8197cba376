#pragma once
// tier_lease<Tier>: one block of an addressable tier, held for the lease's lifetime and counted in the tier's budget
// and stats like the chunks' own memory (a trainer's activations in the device tier: runtime::device_workspace).
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/tier/concepts.hpp>

#include <cstddef>
#include <span>
#include <utility>

namespace chunkwise {

template <addressable_tier Tier>
class tier_lease {
 public:
  static constexpr std::size_t alignment = 256;  // a GPU's allocation granule; enough for any SIMD load

  tier_lease() = default;
  /// Takes `bytes` of `tier`; throws out_of_memory (with the tier's numbers) when its budget cannot hold them.
  tier_lease(Tier& tier, byte_count bytes) : tier_(&tier), bytes_(bytes), data_(tier.allocate_sync(bytes, alignment)) {}
  tier_lease(tier_lease&& other) noexcept
      : tier_(std::exchange(other.tier_, nullptr)), bytes_(std::exchange(other.bytes_, 0)),
        data_(std::exchange(other.data_, nullptr)) {}
  tier_lease& operator=(tier_lease&& other) noexcept {
    if (this != &other) {
      release();
      tier_ = std::exchange(other.tier_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      data_ = std::exchange(other.data_, nullptr);
    }
    return *this;
  }
  tier_lease(const tier_lease&) = delete;
  tier_lease& operator=(const tier_lease&) = delete;
  ~tier_lease() { release(); }

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] byte_count size() const noexcept { return bytes_; }
  /// The block as elements of T (memory of the tier's space: host code reads it only where the tier is host memory).
  template <class T>
  [[nodiscard]] std::span<T> as() const noexcept {
    return {static_cast<T*>(data_), static_cast<std::size_t>(bytes_ / sizeof(T))};
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) tier_->deallocate_sync(data_, bytes_, alignment);
    data_ = nullptr;
  }
  Tier* tier_ = nullptr;
  byte_count bytes_ = 0;
  void* data_ = nullptr;
};

}  // namespace chunkwise
