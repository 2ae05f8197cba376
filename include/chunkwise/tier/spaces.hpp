#pragma once
// Memory spaces: where chunk bytes can live. Empty tags (like Kokkos::HostSpace / Kokkos::CudaHostPinnedSpace) that
// placement policies name without pulling in any tier implementation or backend: `cached<space::nvme>`.
#include <string_view>
#include <type_traits>

namespace chunkwise::space {

struct device {
  static constexpr std::string_view name = "device";
};
struct pinned_host {
  static constexpr std::string_view name = "pinned_host";
};
struct host {
  static constexpr std::string_view name = "host";
};
struct nvme {
  static constexpr std::string_view name = "nvme";
};

}  // namespace chunkwise::space

namespace chunkwise {

namespace detail {
/// One of three spellings chosen by a home space: policy names stay compile-time strings ("cached<nvme>").
template <class Space>
constexpr std::string_view by_space(std::string_view nvme, std::string_view pinned_host, std::string_view host) {
  if constexpr (std::is_same_v<Space, space::nvme>) return nvme;
  else if constexpr (std::is_same_v<Space, space::pinned_host>) return pinned_host;
  else return host;
}
}  // namespace detail

/// True for the four spaces above; a placement policy's home tier must be one of them.
template <class Space>
inline constexpr bool is_memory_space_v = false;
template <>
inline constexpr bool is_memory_space_v<space::device> = true;
template <>
inline constexpr bool is_memory_space_v<space::pinned_host> = true;
template <>
inline constexpr bool is_memory_space_v<space::host> = true;
template <>
inline constexpr bool is_memory_space_v<space::nvme> = true;

template <class Space>
concept memory_space = is_memory_space_v<Space>;

/// Legal moves between spaces, as Kokkos's MemorySpaceAccess: `copyable` when a copy engine (cudaMemcpyAsync, or a
/// worker's memcpy on the host backend) moves bytes directly from Src to Dst; `staged` when the move must go through a
/// pinned host staging buffer (NVMe <-> device: O_DIRECT reads land in pinned memory, then a copy engine moves them).
/// The primary template says "no move"; every legal pair is listed below.
template <class Dst, class Src>
struct tier_access {
  static constexpr bool copyable = false;
  static constexpr bool staged = false;
};

namespace detail {
struct direct_move {
  static constexpr bool copyable = true;
  static constexpr bool staged = false;
};
struct staged_move {
  static constexpr bool copyable = false;
  static constexpr bool staged = true;
};
}  // namespace detail

// Every pair of memory spaces (device, pinned_host, host) is directly copyable.
template <> struct tier_access<space::device, space::device> : detail::direct_move {};
template <> struct tier_access<space::device, space::pinned_host> : detail::direct_move {};
template <> struct tier_access<space::device, space::host> : detail::direct_move {};
template <> struct tier_access<space::pinned_host, space::device> : detail::direct_move {};
template <> struct tier_access<space::pinned_host, space::pinned_host> : detail::direct_move {};
template <> struct tier_access<space::pinned_host, space::host> : detail::direct_move {};
template <> struct tier_access<space::host, space::device> : detail::direct_move {};
template <> struct tier_access<space::host, space::pinned_host> : detail::direct_move {};
template <> struct tier_access<space::host, space::host> : detail::direct_move {};
// NVMe: host-side spaces read and write it directly (O_DIRECT into aligned host buffers); the device goes through
// pinned staging.
template <> struct tier_access<space::pinned_host, space::nvme> : detail::direct_move {};
template <> struct tier_access<space::host, space::nvme> : detail::direct_move {};
template <> struct tier_access<space::nvme, space::pinned_host> : detail::direct_move {};
template <> struct tier_access<space::nvme, space::host> : detail::direct_move {};
template <> struct tier_access<space::device, space::nvme> : detail::staged_move {};
template <> struct tier_access<space::nvme, space::device> : detail::staged_move {};

/// A move from Src to Dst exists (directly or through staging).
template <class Dst, class Src>
inline constexpr bool tier_movable_v = tier_access<Dst, Src>::copyable || tier_access<Dst, Src>::staged;

}  // namespace chunkwise
