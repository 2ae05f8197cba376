#pragma once
// tier_buffer: a zero-filled array allocated from a memory tier (so the tier's byte budget counts it and refuses what
// does not fit), returned to the tier when destroyed. Its elements are fp32 unless a 16-bit element type is given
// (mixed-precision parameters and gradients); data<T>() views them as T. Movable, not copyable.
// A buffer of a tier the host cannot address (a GPU's, tier/concepts.hpp host_staged_tier) is zeroed and read or
// written from the host through its tier's calls; data<T>() is then a device address, for kernels and copies only.
// Such a buffer may also be stream-ordered: allocated, zeroed and given back on one stream (the trainer's compute
// stream), so neither its making nor its end waits on the host.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/worker_threads.hpp>
#include <chunkwise/tier/concepts.hpp>

#include <algorithm>

#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>
#include <utility>

namespace chunkwise::detail {

/// How a tier_buffer reaches its tier's memory, whatever the tier (one table per tier type).
struct tier_buffer_ops {
  void (*release)(void* tier, void* block, std::size_t bytes) noexcept;
  void (*fill_zero)(void* tier, void* block, std::size_t bytes);
  // Stream-ordered buffers (host_staged_tier only): `stream` is the tier's stream_ref, type-erased.
  void (*release_on)(void* tier, void* stream, void* block, std::size_t bytes) noexcept;
  void (*fill_zero_on)(void* tier, void* stream, void* block, std::size_t bytes);
  void (*to_host)(void* tier, void* host, const void* block, std::size_t bytes);
  void (*from_host)(void* tier, void* block, const void* host, std::size_t bytes);
  bool host_accessible;
};

// A tier's stream_ref (a cudaStream_t, or a host_stream&) as an untyped pointer, and back.
template <class Tier>
void* erase_stream(typename Tier::stream_ref stream) noexcept {
  if constexpr (std::is_reference_v<typename Tier::stream_ref>) return &stream;
  else return static_cast<void*>(stream);
}
template <class Tier>
typename Tier::stream_ref restore_stream(void* stream) noexcept {
  using stream_ref = typename Tier::stream_ref;
  if constexpr (std::is_reference_v<stream_ref>) return *static_cast<std::remove_reference_t<stream_ref>*>(stream);
  else return static_cast<stream_ref>(stream);
}

template <class Tier>
constexpr tier_buffer_ops tier_buffer_ops_of() {
  tier_buffer_ops ops{};
  ops.release = [](void* tier, void* block, std::size_t bytes) noexcept {
    static_cast<Tier*>(tier)->deallocate_sync(block, bytes);
  };
  if constexpr (host_staged_tier<Tier>) {
    ops.fill_zero = [](void* tier, void* block, std::size_t bytes) {
      static_cast<Tier*>(tier)->fill_zero(block, bytes);
    };
    ops.release_on = [](void* tier, void* stream, void* block, std::size_t bytes) noexcept {
      try {
        static_cast<Tier*>(tier)->deallocate(restore_stream<Tier>(stream), block, bytes);
      } catch (...) {  // a device that fails a queued free has failed the run; its own calls report that
      }
    };
    ops.fill_zero_on = [](void* tier, void* stream, void* block, std::size_t bytes) {
      static_cast<Tier*>(tier)->fill_zero(restore_stream<Tier>(stream), block, bytes);
    };
    ops.to_host = [](void* tier, void* host, const void* block, std::size_t bytes) {
      static_cast<Tier*>(tier)->copy_to_host(host, block, bytes);
    };
    ops.from_host = [](void* tier, void* block, const void* host, std::size_t bytes) {
      static_cast<Tier*>(tier)->copy_from_host(block, host, bytes);
    };
    ops.host_accessible = false;
  } else {
    ops.fill_zero = [](void*, void* block, std::size_t bytes) { std::memset(block, 0, bytes); };
    ops.to_host = [](void*, void* host, const void* block, std::size_t bytes) { std::memcpy(host, block, bytes); };
    ops.from_host = [](void*, void* block, const void* host, std::size_t bytes) { std::memcpy(block, host, bytes); };
    ops.host_accessible = true;
  }
  return ops;
}
template <class Tier>
inline constexpr tier_buffer_ops tier_buffer_ops_for = tier_buffer_ops_of<Tier>();

class tier_buffer {
 public:
  tier_buffer() = default;
  /// Left as the tier gives it (not zeroed): the caller fills it, with zero(threads) for one.
  struct unfilled_t {};
  static constexpr unfilled_t unfilled{};
  template <class Tier>
  tier_buffer(Tier& tier, std::size_t elements, dtype type, unfilled_t)
      : tier_(&tier), bytes_(elements * size_of(type)), ops_(&tier_buffer_ops_for<Tier>) {
    if (bytes_ != 0) data_ = static_cast<std::byte*>(tier.allocate_sync(bytes_));
  }
  template <class Tier>
  tier_buffer(Tier& tier, std::size_t elements, dtype type = dtype::fp32)
      : tier_buffer(tier, elements, type, unfilled) {
    zero();
  }
  /// Stream-ordered zeros: usable by work queued on `stream` from now on, zeroed there (zero() too), and given back
  /// there when destroyed, after that work; the host never waits for `stream`. Its other users must be done (waited
  /// for, or ordered before `stream`) by then.
  template <host_staged_tier Tier>
  tier_buffer(Tier& tier, typename Tier::stream_ref stream, std::size_t elements, dtype type)
      : tier_buffer(tier, stream, elements, type, unfilled) {
    zero();
  }
  /// The same, left as the tier gives it.
  template <host_staged_tier Tier>
  tier_buffer(Tier& tier, typename Tier::stream_ref stream, std::size_t elements, dtype type, unfilled_t)
      : tier_(&tier), bytes_(elements * size_of(type)), ops_(&tier_buffer_ops_for<Tier>),
        stream_(erase_stream<Tier>(stream)) {
    if (bytes_ != 0) data_ = static_cast<std::byte*>(tier.allocate(stream, bytes_));
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
    if (data_ == nullptr) return;
    if (stream_ != nullptr) ops_->release_on(tier_, stream_, data_, bytes_);
    else ops_->release(tier_, data_, bytes_);
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
  /// Whether the host may read and write data() directly (else: zero, copy_to_host, copy_from_host).
  [[nodiscard]] bool host_accessible() const noexcept { return ops_ == nullptr || ops_->host_accessible; }
  void zero() {
    if (data_ == nullptr) return;
    if (stream_ != nullptr) ops_->fill_zero_on(tier_, stream_, data_, bytes_);
    else ops_->fill_zero(tier_, data_, bytes_);
  }
  /// zero() in 1 MiB tiles on `threads` and the caller: a chunk's worth of memset on one core is most of a GPU
  /// step's host time (gradient accumulators, every step). A tier the host cannot address fills it itself.
  void zero(worker_threads& threads) {
    if (!host_accessible()) return zero();
    constexpr std::size_t tile = std::size_t{1} << 20;
    threads.parallel_for((bytes_ + tile - 1) / tile, [&](std::size_t i) noexcept {
      std::memset(data_ + i * tile, 0, std::min(tile, bytes_ - i * tile));
    });
  }
  /// Copies `bytes` from byte `offset` of the buffer to host memory, or from host memory into it, through the tier.
  void copy_to_host(void* host, std::size_t offset, std::size_t bytes) const {
    if (bytes != 0) ops_->to_host(tier_, host, data_ + offset, bytes);
  }
  void copy_from_host(std::size_t offset, const void* host, std::size_t bytes) {
    if (bytes != 0) ops_->from_host(tier_, data_ + offset, host, bytes);
  }

 private:
  void swap(tier_buffer& other) noexcept {
    std::swap(tier_, other.tier_);
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(ops_, other.ops_);
    std::swap(stream_, other.stream_);
  }

  void* tier_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  const tier_buffer_ops* ops_ = nullptr;
  void* stream_ = nullptr;  // set: stream-ordered (erase_stream)
};

/// A buffer of `elements` in the device tier for the trainer's kernels, not zeroed: stream-ordered on the trainer's
/// compute stream where the host cannot address the tier (so neither its start nor its end waits for the GPU), else a
/// plain one. Whatever else writes it (a gather) queues behind the compute stream, as the runtime's collectives do.
template <class Tier>
tier_buffer compute_buffer(Tier& device, typename Tier::stream_ref compute, std::size_t elements, dtype type) {
  if constexpr (host_staged_tier<Tier>) return tier_buffer(device, compute, elements, type, tier_buffer::unfilled);
  else return tier_buffer(device, elements, type, tier_buffer::unfilled);
}
/// compute_buffer, zeroed (a gradient accumulator).
template <class Tier>
tier_buffer gradient_buffer(Tier& device, typename Tier::stream_ref compute, std::size_t elements, dtype type) {
  tier_buffer buffer = compute_buffer(device, compute, elements, type);
  buffer.zero();
  return buffer;
}

/// A tier_buffer's bytes where the host can touch them: the buffer itself when its tier is host memory, else a host
/// copy made at construction; write_back() returns a changed copy to the buffer.
class host_window {
 public:
  explicit host_window(tier_buffer& buffer) : buffer_(&buffer) {
    if (buffer.host_accessible()) return;
    copy_.resize((buffer.bytes() + sizeof(float) - 1) / sizeof(float));
    buffer.copy_to_host(copy_.data(), 0, buffer.bytes());
  }
  template <class T = float>
  [[nodiscard]] T* data() noexcept {
    return buffer_->host_accessible() ? buffer_->data<T>() : reinterpret_cast<T*>(copy_.data());
  }
  void write_back() {
    if (!buffer_->host_accessible()) buffer_->copy_from_host(0, copy_.data(), buffer_->bytes());
  }

 private:
  tier_buffer* buffer_;
  std::vector<float> copy_;  // float-aligned for the views over it
};

}  // namespace chunkwise::detail
