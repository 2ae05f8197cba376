#pragma once
// The `memory_tier` seam, modelled on CCCL's cuda::mr::resource: stream-ordered allocate/deallocate plus sync forms,
// with empty property tags queried through `get_property` (host_accessible, device_accessible, file_backed).
//
//   tier.allocate(stream, bytes, alignment) -> handle      stream-ordered; the memory is usable by work on `stream`
//   tier.deallocate(stream, handle, bytes, alignment)      freed once the work queued on `stream` before it has run
//   tier.allocate_sync(bytes, alignment) / deallocate_sync(handle, bytes, alignment)
//   tier.stats() -> tier_stats                              capacity, in use, peak, bytes read and written
//
// A memory tier hands out pointers (handle_type = void*); a file-backed tier (the NVMe store) hands out block handles
// that only its own read/write calls understand. Every tier has a byte budget: asking past it throws
// chunkwise::error(error_code::out_of_memory) with the bytes asked, in use and the budget.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/tier/spaces.hpp>

#include <concepts>
#include <cstddef>

namespace chunkwise {

// Property tags (empty). A tier T has property P when `get_property(const T&, P)` is declared for it, usually as a
// hidden friend: `friend constexpr void get_property(const my_tier&, host_accessible) noexcept {}`.
struct host_accessible {};
struct device_accessible {};
struct file_backed {};

template <class T, class Property>
concept has_property = requires(const T& tier) { get_property(tier, Property{}); };

/// What every tier reports (bytes). `bytes_read` counts bytes copied out of the tier, `bytes_written` into it.
struct tier_stats {
  byte_count capacity = 0;
  byte_count in_use = 0;
  byte_count peak = 0;
  byte_count bytes_read = 0;
  byte_count bytes_written = 0;
  /// File-backed tiers: seconds with at least one read or write in flight (0 elsewhere).
  double busy_seconds = 0;
};

/// The stream of a tier whose allocations need no ordering (the NVMe store: its blocks are bookkeeping only).
struct immediate_stream {};

template <class T>
concept memory_tier =
    memory_space<typename T::space> &&
    requires(T& tier, const T& const_tier, typename T::stream_ref stream, typename T::handle_type handle,
             byte_count bytes, std::size_t alignment) {
      { tier.allocate(stream, bytes, alignment) } -> std::same_as<typename T::handle_type>;
      tier.deallocate(stream, handle, bytes, alignment);
      { tier.allocate_sync(bytes, alignment) } -> std::same_as<typename T::handle_type>;
      tier.deallocate_sync(handle, bytes, alignment);
      { const_tier.stats() } -> std::same_as<tier_stats>;
      { const_tier.capacity() } -> std::same_as<byte_count>;
      tier.note_read(bytes);
      tier.note_written(bytes);
    };

/// A tier with all the named properties, as cuda::mr::resource_with.
template <class T, class... Properties>
concept memory_tier_with = memory_tier<T> && (has_property<T, Properties> && ...);

/// A tier whose handles are addressable pointers (every tier except a file-backed store).
template <class T>
concept addressable_tier = memory_tier<T> && std::same_as<typename T::handle_type, void*>;

/// A device tier whose memory the host cannot address (a GPU's): the runtime zeroes it and moves bytes between it and
/// host memory only through these synchronous calls (cudaMemset / cudaMemcpy on CUDA), or zeroes it in stream order
/// (fill_zero(stream, ...): cudaMemsetAsync).
template <class T>
concept host_staged_tier =
    addressable_tier<T> && !has_property<T, host_accessible> &&
    requires(T& tier, typename T::stream_ref stream, void* device, const void* device_src, void* host,
             const void* host_src, byte_count bytes) {
      tier.fill_zero(device, bytes);
      tier.fill_zero(stream, device, bytes);
      tier.copy_to_host(host, device_src, bytes);
      tier.copy_from_host(device, host_src, bytes);
    };

/// A file-backed tier: blocks read into and written from aligned host buffers.
template <class T>
concept block_store_tier =
    memory_tier_with<T, file_backed> &&
    requires(T& tier, typename T::handle_type block, void* dst, const void* src, byte_count bytes) {
      tier.read(block, dst, bytes);
      tier.write(block, src, bytes);
      { T::io_alignment } -> std::convertible_to<std::size_t>;
    };

}  // namespace chunkwise
