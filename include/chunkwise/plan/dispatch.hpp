#pragma once
// dispatch: run-time choice among compile-time plans, the one place it happens (like std::visit over a variant).
// f is called with std::type_identity<Plan>{} for the plan at `index`; every plan of the set is instantiated.
#include <chunkwise/core/error.hpp>
#include <chunkwise/plan/plan.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace chunkwise {

template <class PlanSet, class F>
decltype(auto) dispatch(std::size_t index, F&& f) {
  if (index >= PlanSet::size)
    detail::raise(error_code::invalid_argument, "dispatch: plan index " + std::to_string(index) +
                                                    " is out of range; the plan set has " +
                                                    std::to_string(PlanSet::size) + " plans");
  using result = decltype(f(std::type_identity<typename PlanSet::template at<0>>{}));
  return [&]<std::size_t... I>(std::index_sequence<I...>) -> result {
    using call = result (*)(F&);
    constexpr call table[] = {+[](F& g) -> result { return g(std::type_identity<typename PlanSet::template at<I>>{}); }...};
    return table[index](f);
  }(std::make_index_sequence<PlanSet::size>{});
}

/// The index of the plan whose name() is `name` (for --plan NAME); throws listing the names.
template <class PlanSet>
std::size_t find_plan(const std::string& name) {
  const auto names = PlanSet::names();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  std::string known;
  for (const auto& n : names) known += "\n  " + n;
  detail::raise(error_code::invalid_argument, "unknown plan '" + name + "'; the plans are:" + known);
}

}  // namespace chunkwise
