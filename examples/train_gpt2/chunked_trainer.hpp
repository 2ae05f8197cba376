#pragma once
// What the chunkwise trainer adds to the model maths: its dry run against chunkwise's tracer (the model profile),
// one profiled pass on chunk memory (the same pass functions the reference trainer calls), and the plans it can run.
#include <chunkwise/collective.hpp>
#include <chunkwise/layout.hpp>
#include <chunkwise/placement.hpp>
#include <chunkwise/plan/optimizer_execution.hpp>
#include <chunkwise/plan/plan.hpp>
#include <chunkwise/profile/tracer.hpp>
#include <chunkwise/runtime/fp32_compute.hpp>

#include "gpt2_model.hpp"
#include "reference_trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace gpt2 {

/// The plans the example trains under: resident chunks (data parallel, ZeRO-2, ZeRO-3; optimizer states on the device,
/// partly or wholly offloaded to pinned host memory) and chunks streamed through a device cache from pinned host
/// memory (Gemini-style, and with a resident prefix) or from NVMe files (ZeRO-Infinity-style).
namespace plans {
using chunks = chunkwise::layout::min_waste<1 * chunkwise::MiB, 0>;
using chunkwise::cached, chunkwise::split, chunkwise::resident;
using chunkwise::replicated, chunkwise::shard_grads, chunkwise::sharded;
using chunkwise::optimizer_follows_home, chunkwise::optimizer_auto, chunkwise::optimizer_offload;
using pinned = chunkwise::space::pinned_host;
using nvme = chunkwise::space::nvme;
}  // namespace plans

using trainable_plans = chunkwise::plan_set<
    chunkwise::plan<plans::chunks, plans::resident, plans::replicated, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::resident, plans::shard_grads, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::resident, plans::sharded, plans::optimizer_follows_home>,
    chunkwise::plan<chunkwise::layout::per_tensor, plans::resident, plans::sharded, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::resident, plans::sharded, plans::optimizer_auto<plans::pinned>>,
    chunkwise::plan<plans::chunks, plans::resident, plans::shard_grads, plans::optimizer_offload<plans::pinned>>,
    chunkwise::plan<plans::chunks, plans::cached<plans::pinned>, plans::sharded, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::split<plans::pinned>, plans::sharded, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::cached<plans::nvme>, plans::sharded, plans::optimizer_follows_home>>;

/// The model profile from a dry run of the training loop against the tracer: the same registrations and pass order
/// as the trainer, the activation buffers allocated and freed where llm.c's loop needs them, no tensor memory.
/// `type`: the chunks' parameters and gradients (bf16/fp16: mixed precision, fp32 master weights and Adam states).
inline chunkwise::model_profile trace_profile(const model_config& config, chunkwise::dtype type = chunkwise::dtype::fp32) {
  using namespace chunkwise;
  tracer trace("gpt2-example");
  std::vector<tensor_handle> handles;
  for (const auto& tensor : parameter_tensors(config))
    handles.push_back(trace.register_tensor(tensor.name, tensor.elements, {type, tensor_role::parameter,
                                                                           tensor.name == "wte"}));
  const std::uint64_t B = config.batch, T = config.context, C = config.channels, V = config.vocab_rows(), H = config.heads;
  const byte_count f = sizeof(float);
  const byte_count layer_bytes = (B * T * (18 * C + 4) + 2 * B * H * T * T) * f;
  const std::uint64_t layer_flops = 2 * B * T * 12 * C * C + 4 * B * T * T * C, head_flops = 2 * B * T * C * V;
  const auto touch_layer = [&](std::size_t l) {
    for (std::size_t t = 0; t < layer_tensor_count; ++t)
      trace.touch(handles[layer_tensor_index(l, static_cast<layer_tensor>(t))]);
  };
  const auto lnf_w = handles[ln_f_weight_index(config)], lnf_b = handles[ln_f_bias_index(config)];
  trace.begin_pass("embed", pass_kind::forward);
  trace.touch(handles[wte_index]);
  trace.touch(handles[wpe_index]);
  const auto encoded = trace.allocate_activation(B * T * C * f);
  trace.end_pass();
  std::vector<activation_handle> saved;
  for (std::size_t l = 0; l < config.layers; ++l) {
    trace.begin_pass(("h." + std::to_string(l)).c_str(), pass_kind::forward);
    touch_layer(l);
    saved.push_back(trace.allocate_activation(layer_bytes));
    trace.add_flops(layer_flops);
    trace.end_pass();
  }
  trace.begin_pass("head", pass_kind::forward);
  for (const auto t : {lnf_w, lnf_b, handles[wte_index]}) trace.touch(t);
  const auto head = trace.allocate_activation((B * T * (C + 2) + 2 * B * T * V + B * T) * f);
  trace.add_flops(head_flops);
  trace.end_pass();
  trace.begin_pass("head", pass_kind::backward);
  for (const auto t : {lnf_w, lnf_b, handles[wte_index]}) trace.touch(t);
  trace.free_activation(trace.allocate_activation(B * T * V * f));
  trace.free_activation(head);
  trace.add_flops(2 * head_flops);
  trace.end_pass();
  for (std::size_t l = config.layers; l-- > 0;) {
    trace.begin_pass(("h." + std::to_string(l)).c_str(), pass_kind::backward);
    touch_layer(l);
    trace.free_activation(trace.allocate_activation(layer_bytes));
    trace.free_activation(saved[l]);
    trace.add_flops(2 * layer_flops);
    trace.end_pass();
  }
  trace.begin_pass("embed", pass_kind::backward);
  trace.touch(handles[wte_index]);
  trace.touch(handles[wpe_index]);
  trace.free_activation(trace.allocate_activation(B * T * C * f));
  trace.free_activation(encoded);
  trace.end_pass();
  return trace.profile();
}

/// The FLOP/s the model's pass functions reach on this machine with `ranks` thread ranks computing at once: each rank
/// runs the plain trainer's forward and backward (one warm-up, then `iterations` timed) on its own batch of the model,
/// cut to as many layers as fit 1 GiB of training state (so a 48-layer model is timed on a few of its layers, not in
/// a whole unchunked copy of itself), and that profile's FLOPs per iteration are divided by the slowest rank's median
/// iteration (a median, so a burst of other work on the machine does not set the rate). The cost model's compute
/// rate for this trainer (a generic GEMM benchmark overstates naive loops several times). With 16-bit chunks
/// (`type` bf16 or fp16) each iteration also pays fp32_compute's conversions, timed on as many elements as the cut
/// model has parameters: its parameters widened for forward and again for backward, its gradients added into 16-bit
/// accumulators.
inline double measure_pass_flops(model_config config, int ranks, chunkwise::dtype type = chunkwise::dtype::fp32,
                                 int iterations = 7) {
  const std::size_t layer_state_bytes = 16 * 12 * config.channels * config.channels;  // fp32 p, g, m, v per layer
  config.layers = std::clamp<std::size_t>((std::size_t{1} << 30) / layer_state_bytes, 1, config.layers);
  const chunkwise::model_profile model = trace_profile(config);
  std::vector<double> seconds(static_cast<std::size_t>(ranks), 0.0);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      reference_trainer trainer(config, 1);
      std::vector<int> tokens(config.batch * config.context), targets(tokens.size());
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<int>((i * 7 + static_cast<std::size_t>(r)) % config.vocab);
        targets[i] = static_cast<int>((i * 11 + 3) % config.vocab);
      }
      std::size_t elements = 0;
      for (const auto& tensor : model.tensors) elements += tensor.elements;
      std::function<void()> convert = [] {};
      chunkwise::visit_element(type, "measure_pass_flops", [&]<class T>(T) {
        if constexpr (!std::is_same_v<T, float>) {
          auto working = std::make_shared<std::vector<T>>(elements, chunkwise::from_float<T>(1.0f));
          auto accumulator = std::make_shared<std::vector<T>>(elements, chunkwise::from_float<T>(0.0f));
          auto widened = std::make_shared<std::vector<float>>(elements);
          auto gradient = std::make_shared<std::vector<float>>(elements, 1e-3f);
          convert = [=] {
            for (int pass = 0; pass < 2; ++pass) chunkwise::optim::widen<T>(*working, *widened);
            chunkwise::optim::accumulate_scaled<T>(*accumulator, *gradient, 1.0f);
          };
        }
      });
      const auto forward_backward = [&] {
        trainer.zero_gradients();
        trainer.forward(tokens.data(), targets.data());
        trainer.backward(tokens.data(), targets.data());
        convert();
      };
      forward_backward();
      std::vector<double> times;
      for (int i = 0; i < iterations; ++i) {
        const auto start = std::chrono::steady_clock::now();
        forward_backward();
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
      seconds[static_cast<std::size_t>(r)] = times[times.size() / 2];
    });
  for (auto& t : threads) t.join();
  return static_cast<double>(model.total_flops()) / *std::max_element(seconds.begin(), seconds.end());
}

/// The runtime's tensor initializer: tensor t (in profile order) gets the reference trainer's initial values.
inline std::function<void(std::uint32_t, std::span<float>)> initializer(const model_config& config,
                                                                         std::uint64_t seed) {
  return [config, seed, tensors = parameter_tensors(config)](std::uint32_t t, std::span<float> values) {
    init_parameter(config, tensors[t].name, values, seed);
  };
}

/// One profiled pass (embed, h.<l> or head; forward or backward) on the runtime's chunk memory, computed in fp32
/// (through fp32 copies when the chunks hold bf16 or fp16; the gradients go into the chunks before it returns).
template <class Runtime>
float run_profile_pass(chunkwise::fp32_compute<Runtime>& compute, const chunkwise::profile_pass& pass,
                       const model_config& config, activations<float>& acts, const int* tokens, const int* targets) {
  const auto p = [&](std::size_t t) { return compute.parameter(static_cast<std::uint32_t>(t)); };
  const auto g = [&](std::size_t t) { return compute.gradient(static_cast<std::uint32_t>(t)); };
  const auto flushing = compute.flush_at_exit();  // this pass's gradients go into the chunks at every return
  const std::string label(pass.label.view());
  const bool forward = pass.kind == chunkwise::pass_kind::forward;
  const std::size_t lnf_w = ln_f_weight_index(config), lnf_b = ln_f_bias_index(config);
  if (label == "embed") {
    if (forward) embed_forward<float>(p(wte_index), p(wpe_index), tokens, acts);
    else embed_backward<float>(g(wte_index), g(wpe_index), tokens, acts);
    return 0;
  }
  if (label == "head") {
    if (forward) return head_forward<float>(p(lnf_w), p(lnf_b), p(wte_index), targets, acts);
    head_backward<float>(p(lnf_w), p(wte_index), g(lnf_w), g(lnf_b), g(wte_index), targets, acts);
    return 0;
  }
  const std::size_t layer = std::stoul(label.substr(2));
  layer_params<float> params;
  layer_grads<float> grads;
  for (std::size_t t = 0; t < layer_tensor_count; ++t) {
    const auto index = layer_tensor_index(layer, static_cast<layer_tensor>(t));
    params.tensor[t] = p(index);
    if (!forward) grads.tensor[t] = g(index);  // gradients exist in backward passes only
  }
  if (forward) layer_forward<float>(layer, params, acts);
  else layer_backward<float>(layer, params, grads, acts);
  return 0;
}

}  // namespace gpt2
