#pragma once
// Optimizer execution: where each chunk's optimizer states (Adam's m and v, fp32 master weights for 16-bit
// parameters) and gradient shards live, and so which processor runs its update: the device's fused kernel or the
// host's SIMD kernel. The plan's fourth policy.
//
// States of chunks whose parameters stream from a host or NVMe home always live in that home (the update runs where
// the parameters are). For chunks resident on the device, the policy decides:
//   optimizer_follows_home          states on the device with them (fastest update, most device memory)
//   optimizer_offload<Space>        every chunk's states in Space (ZeRO-Offload: the CPU updates everything)
//   optimizer_auto<Space>           a searched fraction of the resident chunks' states in Space, the rest on device:
//                                   as much on the device as the budget allows
#include <chunkwise/tier/spaces.hpp>

#include <concepts>
#include <string_view>
#include <type_traits>

namespace chunkwise {

/// An optimizer execution policy O provides:
///   O::name, O::offload_space (where offloaded states go),
///   O::min_offload_fraction / O::max_offload_fraction: the fraction of resident chunks whose states are off the
///   device; equal bounds fix it, different bounds make the search pick it.
template <class O>
concept optimizer_execution = std::is_empty_v<O> && memory_space<typename O::offload_space> &&
                              !std::same_as<typename O::offload_space, space::device> && requires {
                                { O::name } -> std::convertible_to<std::string_view>;
                                { O::min_offload_fraction } -> std::convertible_to<double>;
                                { O::max_offload_fraction } -> std::convertible_to<double>;
                              } && (O::min_offload_fraction >= 0.0) && (O::max_offload_fraction <= 1.0) &&
                              (O::min_offload_fraction <= O::max_offload_fraction);

struct optimizer_follows_home {
  using offload_space = space::pinned_host;
  static constexpr std::string_view name = "follows_home";
  static constexpr double min_offload_fraction = 0.0;
  static constexpr double max_offload_fraction = 0.0;
};

template <class Space = space::pinned_host>
struct optimizer_offload {
  using offload_space = Space;
  static constexpr std::string_view name =
      detail::by_space<Space>("offload<nvme>", "offload<pinned_host>", "offload<host>");
  static constexpr double min_offload_fraction = 1.0;
  static constexpr double max_offload_fraction = 1.0;
};

template <class Space = space::pinned_host>
struct optimizer_auto {
  using offload_space = Space;
  static constexpr std::string_view name = detail::by_space<Space>("auto<nvme>", "auto<pinned_host>", "auto<host>");
  static constexpr double min_offload_fraction = 0.0;
  static constexpr double max_offload_fraction = 1.0;
};

static_assert(optimizer_execution<optimizer_follows_home>);
static_assert(optimizer_execution<optimizer_offload<>>);
static_assert(optimizer_execution<optimizer_auto<space::nvme>>);

}  // namespace chunkwise
