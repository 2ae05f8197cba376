#pragma once
// GPT-2's training step, written once: the passes in order, the parameter tensors each touches, the activations it
// keeps for backward and the scratch it needs, its FLOPs, and the maths it runs. Who executes the schedule decides
// what a pass means (llm.c's train_gpt2.c has one loop; here that one loop serves three purposes):
//
//   tracing_executor (below)   records each pass into chunkwise's tracer and runs no maths: the model profile is a
//                              dry run of this very schedule;
//   reference_trainer          runs the maths on its own arrays (reference_trainer.hpp);
//   chunk_executor             acquires each pass's chunks from the runtime and runs the maths on chunk memory
//                              (chunked_trainer.hpp).
//
// An executor provides `template <class Body> void pass(const pass_info&, Body&& body)`, which calls (or not)
// body(x) with an accessor x: x.param(t) and x.grad(t) (Real*, tensor t in parameter_tensors order; grad only in
// backward passes) and x.acts() (activations<Real>&).
//
// Activation checkpointing (model_config::recompute): each block's forward keeps only its output; its backward pass
// runs the block's forward again before its backward, so the activations of one block are live at a time instead of
// all L (a third more block FLOPs; the passes' saved and scratch bytes say so, and the planner sees them).
#include "gpt2_model.hpp"

#include <chunkwise/core/bytes.hpp>
#include <chunkwise/profile/model_profile.hpp>
#include <chunkwise/profile/tracer.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace gpt2 {

/// One pass of the schedule, as the profile counts it.
struct pass_info {
  std::string label;                 // "embed", "h.<l>" or "head": a backward pass repeats its forward's label
  chunkwise::pass_kind kind;
  std::vector<std::size_t> tensors;  // the parameter tensors it touches (and, in backward, their gradients)
  chunkwise::byte_count saved = 0;   // forward: activations kept until the backward pass of the same label
  chunkwise::byte_count scratch = 0; // working buffers live during the pass besides what is saved
  std::uint64_t flops = 0;
};

namespace schedule_detail {

inline std::vector<std::size_t> layer_tensors(std::size_t layer) {
  std::vector<std::size_t> tensors;
  for (std::size_t t = 0; t < layer_tensor_count; ++t)
    tensors.push_back(layer_tensor_index(layer, static_cast<layer_tensor>(t)));
  return tensors;
}

// The bytes (fp32 activations) and FLOPs of the passes: what chunkwise/profile/gpt2.hpp counts analytically, and
// what activations<float> holds (activations::total_elements * 4 is the peak: the head's backward pass).
struct pass_costs {
  explicit pass_costs(const model_config& config)
      : B(config.batch), T(config.context), C(config.channels), Vp(config.vocab_rows()), H(config.heads),
        recompute(config.recompute), workspace(activations<float>::backward_workspace_elements(config)) {}
  std::uint64_t B, T, C, Vp, H;
  bool recompute;
  std::uint64_t workspace;  // backward's workspace in elements, as activations<float> carves it
  static constexpr chunkwise::byte_count f = sizeof(float);
  chunkwise::byte_count embed() const { return B * T * C * f; }
  chunkwise::byte_count layer() const { return (B * T * (18 * C + 4) + B * H * T * T) * f; }
  // Under recompute a block keeps only its output (B*T*C) and works in the one shared slot of the rest.
  chunkwise::byte_count layer_saved() const { return recompute ? B * T * C * f : layer(); }
  chunkwise::byte_count head() const { return (B * T * (C + 2) + B * T * Vp + B * T) * f; }  // probs over logits
  // Buffers the trainer holds through the step, counted as every pass's scratch (so each pass's bytes are what is
  // live while it runs): the recompute slot in every pass, backward's workspace in every backward pass.
  chunkwise::byte_count slot() const { return recompute ? layer() - B * T * C * f : 0; }
  chunkwise::byte_count backward_workspace() const { return workspace * f; }
  chunkwise::byte_count forward_scratch() const { return slot(); }
  chunkwise::byte_count backward_scratch() const { return slot() + backward_workspace(); }
  std::uint64_t layer_backward_flops() const { return (recompute ? 3 : 2) * layer_flops(); }
  std::uint64_t layer_flops() const { return 2 * B * T * 12 * C * C + 4 * B * T * T * C; }
  std::uint64_t head_flops() const { return 2 * B * T * C * Vp; }
};

// The 12 pointers of one block's tensors, each from get(tensor index): its parameters or its gradients.
template <class Pointers, class Get>
Pointers layer_pointers(std::size_t layer, Get&& get) {
  Pointers pointers;
  for (std::size_t t = 0; t < layer_tensor_count; ++t)
    pointers.tensor[t] = get(layer_tensor_index(layer, static_cast<layer_tensor>(t)));
  return pointers;
}
template <class Accessor>
auto layer_params_of(Accessor& x, std::size_t layer) {
  using real = std::remove_pointer_t<decltype(x.param(0))>;
  return layer_pointers<layer_params<real>>(layer, [&](std::size_t t) { return x.param(t); });
}
template <class Accessor>
auto layer_grads_of(Accessor& x, std::size_t layer) {
  using real = std::remove_pointer_t<decltype(x.grad(0))>;
  return layer_pointers<layer_grads<real>>(layer, [&](std::size_t t) { return x.grad(t); });
}

}  // namespace schedule_detail

/// The forward passes: embedding, every block, the head. Returns the mean loss against `targets` (0 when the executor
/// runs no maths), in double so that a double-precision trainer keeps all of it. tokens and targets are (B, T).
template <class Executor>
double forward(Executor& run, const model_config& config, const int* tokens, const int* targets) {
  using chunkwise::pass_kind;
  const schedule_detail::pass_costs cost(config);
  const std::size_t lnf_w = ln_f_weight_index(config), lnf_b = ln_f_bias_index(config);
  double loss = 0;
  run.pass({"embed", pass_kind::forward, {wte_index, wpe_index}, cost.embed(), cost.forward_scratch(), 0},
           [&](auto& x) { embed_forward(x.param(wte_index), x.param(wpe_index), tokens, x.acts()); });
  for (std::size_t l = 0; l < config.layers; ++l)
    run.pass({"h." + std::to_string(l), pass_kind::forward, schedule_detail::layer_tensors(l), cost.layer_saved(),
              cost.forward_scratch(), cost.layer_flops()},
             [&](auto& x) { layer_forward(l, schedule_detail::layer_params_of(x, l), x.acts()); });
  run.pass({"head", pass_kind::forward, {lnf_w, lnf_b, wte_index}, cost.head(), cost.forward_scratch(),
            cost.head_flops()},
           [&](auto& x) {
    loss = static_cast<double>(head_forward(x.param(lnf_w), x.param(lnf_b), x.param(wte_index), targets, x.acts()));
  });
  return loss;
}

/// The backward passes, after forward on the same batch: head, every block from the last, the embedding. Parameter
/// gradients accumulate.
template <class Executor>
void backward(Executor& run, const model_config& config, const int* tokens, const int* targets) {
  using chunkwise::pass_kind;
  const schedule_detail::pass_costs cost(config);
  const std::size_t lnf_w = ln_f_weight_index(config), lnf_b = ln_f_bias_index(config);
  run.pass({"head", pass_kind::backward, {lnf_w, lnf_b, wte_index}, 0, cost.backward_scratch(),
            2 * cost.head_flops()},
           [&](auto& x) {
             head_backward(x.param(lnf_w), x.param(wte_index), x.grad(lnf_w), x.grad(lnf_b), x.grad(wte_index),
                           targets, x.acts());
           });
  for (std::size_t l = config.layers; l-- > 0;)
    run.pass({"h." + std::to_string(l), pass_kind::backward, schedule_detail::layer_tensors(l), 0,
              cost.backward_scratch(), cost.layer_backward_flops()},
             [&](auto& x) {
               // Activation checkpointing: the block's forward again, from its input (the checkpoint kept), into the
               // shared slice; the same maths, so the same bits.
               if (config.recompute) layer_forward(l, schedule_detail::layer_params_of(x, l), x.acts());
               layer_backward(l, schedule_detail::layer_params_of(x, l), schedule_detail::layer_grads_of(x, l),
                              x.acts());
             });
  run.pass({"embed", pass_kind::backward, {wte_index, wpe_index}, 0, cost.backward_scratch(), 0},
           [&](auto& x) { embed_backward(x.grad(wte_index), x.grad(wpe_index), tokens, x.acts()); });
}

/// Records the schedule into chunkwise's tracer: each pass's tensors, FLOPs, the activations it keeps (freed by the
/// backward pass of the same label) and its scratch. Runs no maths.
class tracing_executor {
 public:
  tracing_executor(const model_config& config, chunkwise::dtype type) : trace_("gpt2-example") {
    for (const auto& tensor : parameter_tensors(config))
      handles_.push_back(trace_.register_tensor(
          tensor.name, tensor.elements, {type, chunkwise::tensor_role::parameter, tensor.name == "wte"}));
  }
  template <class Body>
  void pass(const pass_info& info, Body&&) {
    trace_.begin_pass(info.label.c_str(), info.kind);
    for (const auto t : info.tensors) trace_.touch(handles_[t]);
    // What a forward pass keeps is written while its scratch is live, and a backward pass reads its saved
    // activations while its scratch is live: both count together.
    if (info.kind == chunkwise::pass_kind::forward && info.saved > 0)
      saved_.emplace(info.label, trace_.allocate_activation(info.saved));
    if (info.scratch > 0) trace_.free_activation(trace_.allocate_activation(info.scratch));
    if (info.kind == chunkwise::pass_kind::backward) {
      const auto saved = saved_.find(info.label);
      if (saved != saved_.end()) trace_.free_activation(saved->second), saved_.erase(saved);
    }
    trace_.add_flops(info.flops);
    trace_.end_pass();
  }
  chunkwise::model_profile profile() { return trace_.profile(); }

 private:
  chunkwise::tracer trace_;
  std::vector<chunkwise::tensor_handle> handles_;
  std::map<std::string, chunkwise::activation_handle> saved_;
};

/// The model profile: a dry run of the training step's schedule (schedule.hpp) against the tracer, no tensor memory.
/// `type`: the chunks' parameters and gradients (bf16/fp16: mixed precision, fp32 master weights and Adam states).
inline chunkwise::model_profile trace_profile(const model_config& config,
                                              chunkwise::dtype type = chunkwise::dtype::fp32) {
  tracing_executor trace(config, type);
  forward(trace, config, nullptr, nullptr);
  backward(trace, config, nullptr, nullptr);
  return trace.profile();
}

}  // namespace gpt2
