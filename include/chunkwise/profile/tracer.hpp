#pragma once
// tracer: builds a model_profile from a dry run of the trainer's own loop. The trainer registers its tensors (no
// memory is allocated), then for each layer's forward and backward opens a pass, touches the tensors the layer
// uses, and reports activation memory as it would allocate and free it. The tracer keeps byte counts only.
//
//   tracer trace("my-model");
//   const auto w = trace.register_tensor("fc.weight", 4096 * 4096);
//   trace.begin_pass("fc", pass_kind::forward);
//   trace.touch(w);
//   const auto out = trace.allocate_activation(batch * 4096 * 4);   // kept for backward
//   trace.end_pass();
//   ...
//   const model_profile profile = trace.profile();   // tensors in first-use order, validated
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/tensor_spec.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace chunkwise {

struct tensor_handle {
  std::uint32_t index = 0;
};
struct activation_handle {
  std::uint32_t index = 0;
};

struct tensor_options {
  dtype type = dtype::fp32;
  tensor_role role = tensor_role::parameter;
  bool tied = false;
};

class tracer {
 public:
  explicit tracer(tensor_name model_name) { model_.name = model_name; }

  tensor_handle register_tensor(tensor_name name, std::uint64_t elements, tensor_options options = {}) {
    if (in_pass_)
      detail::raise(error_code::invalid_argument,
                    "tracer: register tensor '" + name.str() + "' before the first pass, not inside pass '" +
                        current_.label.str() + "'");
    if (elements == 0)
      detail::raise(error_code::invalid_profile, "tracer: tensor '" + name.str() + "' has zero elements");
    for (const auto& t : model_.tensors)
      if (t.name == name) detail::raise(error_code::invalid_argument, "tracer: tensor '" + name.str() + "' registered twice");
    model_.tensors.push_back(tensor_spec{name, elements, options.type, options.role, options.tied});
    return tensor_handle{static_cast<std::uint32_t>(model_.tensors.size() - 1)};
  }

  void begin_pass(tensor_name label, pass_kind kind) {
    if (in_pass_)
      detail::raise(error_code::invalid_argument, "tracer: begin_pass '" + label.str() + "' while pass '" +
                                                      current_.label.str() + "' is still open; call end_pass first");
    in_pass_ = true;
    current_ = profile_pass{label, kind, {}, live_activation_bytes_};
  }

  /// The open pass reads or writes `tensor` (touching it twice in one pass counts once).
  void touch(tensor_handle tensor) {
    require_pass("touch");
    if (tensor.index >= model_.tensors.size())
      detail::raise(error_code::invalid_argument, "tracer: touch of tensor handle " + std::to_string(tensor.index) +
                                                      " but only " + std::to_string(model_.tensors.size()) +
                                                      " tensors are registered");
    for (const auto i : current_.tensors)
      if (i == tensor.index) return;
    current_.tensors.push_back(tensor.index);
  }

  /// Floating-point work the open pass does (a multiply-add counts two), for the cost model's compute time.
  void add_flops(std::uint64_t flops) {
    require_pass("add_flops");
    current_.flops += flops;
  }

  /// Activation memory the trainer would allocate now; alive until free_activation (possibly in a later pass).
  activation_handle allocate_activation(byte_count bytes) {
    require_pass("allocate_activation");
    activation_bytes_.push_back(bytes);
    live_activation_bytes_ += bytes;
    if (live_activation_bytes_ > current_.activation_bytes) current_.activation_bytes = live_activation_bytes_;
    return activation_handle{static_cast<std::uint32_t>(activation_bytes_.size() - 1)};
  }

  void free_activation(activation_handle activation) {
    if (activation.index >= activation_bytes_.size() || activation_bytes_[activation.index] == freed)
      detail::raise(error_code::invalid_argument,
                    "tracer: free of activation " + std::to_string(activation.index) + " that is not allocated");
    live_activation_bytes_ -= activation_bytes_[activation.index];
    activation_bytes_[activation.index] = freed;
  }

  void end_pass() {
    require_pass("end_pass");
    model_.passes.push_back(std::move(current_));
    current_ = {};
    in_pass_ = false;
  }

  [[nodiscard]] byte_count live_activation_bytes() const noexcept { return live_activation_bytes_; }

  /// The profile of what was traced: tensors reordered by first use, then validated.
  [[nodiscard]] model_profile profile() const {
    if (in_pass_)
      detail::raise(error_code::invalid_argument,
                    "tracer: profile() while pass '" + current_.label.str() + "' is open; call end_pass first");
    auto sorted = sort_by_first_use(model_);
    validate(sorted);
    return sorted;
  }

 private:
  static constexpr byte_count freed = ~byte_count{0};

  void require_pass(const char* call) const {
    if (!in_pass_) detail::raise(error_code::invalid_argument, std::string("tracer: ") + call + " outside a pass; call begin_pass first");
  }

  model_profile model_;
  profile_pass current_;
  bool in_pass_ = false;
  std::vector<byte_count> activation_bytes_;
  byte_count live_activation_bytes_ = 0;
};

}  // namespace chunkwise
