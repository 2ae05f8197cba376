#pragma once
// The layout seam: a policy that turns a model's tensor list into a chunk map. Same code at compile and run time.
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <concepts>
#include <string_view>

namespace chunkwise {

/// A layout policy L provides, as static members:
/// - `name`: the family ("fixed", "min_waste", "per_tensor");
/// - `build(model, options)`: the chunk map (throws error_code::layout_error when the tensors cannot be packed);
/// - `summarize(model, options)`: its layout_summary, constexpr, for the planner.
template <class L>
concept chunk_layout = requires(const model_profile& model, const layout_options& options) {
  { L::name } -> std::convertible_to<std::string_view>;
  { L::build(model, options) } -> std::same_as<chunk_map>;
  { L::summarize(model, options) } -> std::same_as<layout_summary>;
};

}  // namespace chunkwise
