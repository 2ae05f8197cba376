#pragma once
// model_profile: the byte-level facts about one training iteration that the layout, placement and cost model need.
// Tensors are listed in first-use order; passes are one layer's forward or backward, in execution order.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/tensor_spec.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace chunkwise {

enum class pass_kind : std::uint8_t { forward, backward };

constexpr std::string_view to_string(pass_kind kind) noexcept {
  return kind == pass_kind::forward ? "forward" : "backward";
}

struct profile_pass {
  tensor_name label;                   // "h.3", "embed", "head": the layer this pass runs
  pass_kind kind = pass_kind::forward;
  std::vector<std::uint32_t> tensors;  // indices into model_profile::tensors that the pass reads or writes
  /// Activation bytes alive while the pass runs: everything saved for backward so far plus the pass's own working
  /// set (bytes per rank, one micro-batch).
  byte_count activation_bytes = 0;
  /// Floating-point operations the pass performs (multiply-adds count two), for the cost model's compute time.
  /// 0 when unknown.
  std::uint64_t flops = 0;
};

struct model_profile {
  tensor_name name;
  std::vector<tensor_spec> tensors;  // first-use order
  std::vector<profile_pass> passes;  // one training step: forward passes, then backward passes
  /// How the trainer runs its updates: each chunk's as soon as its gradient is reduced, beside the rest of backward
  /// (the runtime does when it has a learning-rate schedule and no global-norm clipping), or all after backward.
  bool updates_overlap_backward = false;

  [[nodiscard]] constexpr std::uint64_t parameter_count() const noexcept {
    std::uint64_t n = 0;
    for (const auto& t : tensors)
      if (t.role == tensor_role::parameter) n += t.elements;
    return n;
  }
  [[nodiscard]] constexpr byte_count tensor_bytes() const noexcept {
    byte_count n = 0;
    for (const auto& t : tensors) n += t.bytes();
    return n;
  }
  [[nodiscard]] constexpr byte_count largest_tensor_bytes() const noexcept {
    byte_count n = 0;
    for (const auto& t : tensors) n = t.bytes() > n ? t.bytes() : n;
    return n;
  }
  [[nodiscard]] constexpr std::uint64_t total_flops() const noexcept {
    std::uint64_t n = 0;
    for (const auto& s : passes) n += s.flops;
    return n;
  }
  [[nodiscard]] constexpr byte_count peak_activation_bytes() const noexcept {
    byte_count n = 0;
    for (const auto& s : passes) n = s.activation_bytes > n ? s.activation_bytes : n;
    return n;
  }
  /// Tensor access order of one iteration, one entry per (pass, tensor) touch: what prefetch and next-use eviction follow.
  [[nodiscard]] constexpr std::vector<std::uint32_t> access_order() const {
    std::vector<std::uint32_t> order;
    for (const auto& s : passes) order.insert(order.end(), s.tensors.begin(), s.tensors.end());
    return order;
  }
};

/// The most tensor bytes a profile may hold, in all (64 PiB): far beyond any machine, and low enough that the
/// layouts' arithmetic on it (rounding up to a granule, chunk count times capacity) cannot overflow 64 bits.
inline constexpr byte_count max_profile_bytes = byte_count{1} << 56;

namespace detail {
[[noreturn]] inline void invalid_profile(const model_profile& model, const std::string& what) {
  raise(error_code::invalid_profile, "model profile '" + model.name.str() + "': " + what);
}
}  // namespace detail

/// Checks what every consumer relies on; throws error_code::invalid_profile naming the offending tensor or pass.
/// - at least one tensor, every tensor with a name and at least one element;
/// - at most max_profile_bytes of tensors in all (so no tensor's byte count, elements * dtype size, overflows);
/// - every tensor index in a pass names an existing tensor;
/// - tensors appear in first-use order: the first touch of tensor i comes no later than the first touch of tensor i+1
///   (tensors no pass touches may only follow all touched ones).
constexpr void validate(const model_profile& model) {
  if (model.tensors.empty()) detail::invalid_profile(model, "has no tensors; register at least one tensor");
  byte_count total = 0;  // <= max_profile_bytes before each addition, so the sum cannot wrap
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    const auto& t = model.tensors[i];
    if (t.name.empty()) detail::invalid_profile(model, "tensor #" + std::to_string(i) + " has no name");
    if (t.elements == 0)
      detail::invalid_profile(model, "tensor #" + std::to_string(i) + " '" + t.name.str() +
                                         "' has zero elements; drop it or give its size");
    // Checked by division first: elements * size_of(type) itself may wrap (a profile loaded from a file can say
    // anything), and a wrapped byte count would pass every later check while layouts place garbage.
    if (t.elements > (max_profile_bytes - total) / size_of(t.type))
      detail::invalid_profile(model, "tensor #" + std::to_string(i) + " '" + t.name.str() + "' has " +
                                         std::to_string(t.elements) + " elements of " +
                                         std::to_string(size_of(t.type)) + " bytes; a profile holds at most " +
                                         format_bytes(max_profile_bytes) + " of tensors in all");
    total += t.bytes();
  }
  const auto count = static_cast<std::uint32_t>(model.tensors.size());
  std::uint32_t next_first_use = 0;  // tensors [0, next_first_use) have been touched by earlier passes
  for (std::size_t s = 0; s < model.passes.size(); ++s) {
    const auto& pass = model.passes[s];
    // The tensors this pass touches for the first time must be exactly the next ones in the list (in any order
    // within the pass).
    std::vector<std::uint32_t> first_touches;
    for (const std::uint32_t index : pass.tensors) {
      if (index >= count)
        detail::invalid_profile(model, "pass #" + std::to_string(s) + " (" + std::string(to_string(pass.kind)) + " " +
                                           pass.label.str() + ") touches tensor #" + std::to_string(index) +
                                           " but the profile has " + std::to_string(count) + " tensors");
      if (index >= next_first_use) first_touches.push_back(index);
    }
    std::sort(first_touches.begin(), first_touches.end());
    first_touches.erase(std::unique(first_touches.begin(), first_touches.end()), first_touches.end());
    for (std::size_t k = 0; k < first_touches.size(); ++k) {
      const std::uint32_t expected = next_first_use + static_cast<std::uint32_t>(k);
      if (first_touches[k] != expected)
        detail::invalid_profile(model, "tensor #" + std::to_string(first_touches[k]) + " '" +
                                           model.tensors[first_touches[k]].name.str() + "' is first used (pass #" +
                                           std::to_string(s) + ") before tensor #" + std::to_string(expected) + " '" +
                                           model.tensors[expected].name.str() +
                                           "'; list tensors in first-use order (see sort_by_first_use)");
    }
    next_first_use += static_cast<std::uint32_t>(first_touches.size());
  }
}

/// Reorders tensors into first-use order (untouched tensors last, in their given order) and renumbers the passes:
/// for profiles that come from elsewhere (a PyTorch export lists parameters in registration order).
inline model_profile sort_by_first_use(const model_profile& model) {
  const auto count = model.tensors.size();
  constexpr std::uint32_t unseen = ~std::uint32_t{0};
  std::vector<std::uint32_t> new_index(count, unseen);
  std::vector<std::uint32_t> old_index;
  old_index.reserve(count);
  for (const auto& pass : model.passes)
    for (const std::uint32_t i : pass.tensors)
      if (i < count && new_index[i] == unseen) {
        new_index[i] = static_cast<std::uint32_t>(old_index.size());
        old_index.push_back(i);
      }
  for (std::uint32_t i = 0; i < count; ++i)
    if (new_index[i] == unseen) {
      new_index[i] = static_cast<std::uint32_t>(old_index.size());
      old_index.push_back(i);
    }
  model_profile sorted{model.name, {}, model.passes};
  sorted.tensors.reserve(count);
  for (const std::uint32_t i : old_index) sorted.tensors.push_back(model.tensors[i]);
  for (auto& pass : sorted.passes)
    for (auto& i : pass.tensors)
      if (i < count) i = new_index[i];
  return sorted;
}

}  // namespace chunkwise
