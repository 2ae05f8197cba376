#pragma once
// plan<Layout, Placement, Collective, OptimizerExecution>: one way to run training, composed at compile time; plan_set: the
// candidates one binary carries and the search chooses among.
#include <chunkwise/collective/concepts.hpp>
#include <chunkwise/layout/concepts.hpp>
#include <chunkwise/placement/concepts.hpp>
#include <chunkwise/plan/optimizer_execution.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>

namespace chunkwise {

template <chunk_layout Layout, placement_policy Placement, collective_strategy Collective, optimizer_execution OptimizerExecution>
struct plan {
  using layout = Layout;
  using placement = Placement;
  using collective = Collective;
  using optimizer_execution = OptimizerExecution;

  /// "min_waste/cached<pinned_host>/sharded/follows_home"
  static std::string name() {
    std::string text(Layout::name);
    text += '/';
    text += Placement::name;
    text += '/';
    text += Collective::name;
    text += '/';
    text += OptimizerExecution::name;
    return text;
  }
};

template <class T>
inline constexpr bool is_plan_v = false;
template <class L, class P, class C, class O>
inline constexpr bool is_plan_v<plan<L, P, C, O>> = true;

template <class... Plans>
struct plan_set {
  static_assert(sizeof...(Plans) > 0, "plan_set<>: give at least one plan");
  static_assert((is_plan_v<Plans> && ...), "plan_set<...>: every member must be a chunkwise::plan<...>");
  static constexpr std::size_t size = sizeof...(Plans);
  template <std::size_t I>
  using at = std::tuple_element_t<I, std::tuple<Plans...>>;

  static std::array<std::string, size> names() { return {Plans::name()...}; }
};

}  // namespace chunkwise
