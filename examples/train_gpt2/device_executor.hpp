#pragma once
// Runs the schedule (schedule.hpp) with the maths on a device (device_model.hpp) and the tensors in host memory:
// each pass enters its host scope (for chunk memory: the runtime acquires the pass's chunks), refreshes the device
// mirror of its parameters where they changed since (once per step), runs the device passes, and adds the gradients
// they computed into the host ones before the scope ends (the runtime then reduces them and updates them where the
// plan keeps the optimizer states). ZeRO-Offload's split: weights, gradients and Adam in host memory, the forward and
// backward maths on the GPU.
#include <chunkwise/runtime/fp32_compute.hpp>

#include "device_model.hpp"
#include "reference_trainer.hpp"
#include "schedule.hpp"
#include "timing.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gpt2 {

/// The runtime's chunk memory as a device_executor's host tensors: a pass acquires its chunks (rt.use, passes
/// numbered in the profile's order) and reads and writes them in fp32 through fp32_compute.
template <class Runtime>
class chunk_tensors {
 public:
  chunk_tensors(Runtime& rt, chunkwise::fp32_compute<Runtime>& compute) : rt_(&rt), compute_(&compute) {}
  void restart() noexcept { next_ = 0; }
  /// As rt.use(pass) around the body: a pass that throws is not released (pass_guard.hpp says why).
  template <class Body>
  void around_pass(Body&& body) {
    const std::size_t pass = next_++;
    time_host("runtime acquire", [&] { rt_->acquire(pass); });
    {
      const auto flushing = compute_->flush_at_exit();  // the gradients go in before the release
      body();
    }
    time_host("runtime release", [&] { rt_->release(pass); });
  }
  float* parameter(std::size_t t) { return compute_->parameter(static_cast<std::uint32_t>(t)); }
  float* gradient(std::size_t t) { return compute_->gradient(static_cast<std::uint32_t>(t)); }
  /// Changes whenever the parameters do: the optimizer's applied steps and the checkpoints loaded.
  [[nodiscard]] std::uint64_t version() const { return rt_->parameters_version(); }

 private:
  Runtime* rt_;
  chunkwise::fp32_compute<Runtime>* compute_;
  std::size_t next_ = 0;
};

/// A reference trainer's arrays as a device_executor's host tensors (the device passes' tests and calibration).
struct trainer_tensors {
  reference_trainer* trainer;
  template <class Body>
  void around_pass(Body&& body) {
    body();
  }
  float* parameter(std::size_t t) { return trainer->param(t); }
  float* gradient(std::size_t t) { return trainer->grad(t); }
  [[nodiscard]] std::uint64_t version() const { return trainer->steps(); }
};

/// Where a device_executor's backward passes leave their gradients: added into the host tensors' (the mirror's way),
/// or in the workspace's staging on the device, as passes on device chunks leave theirs in the chunks (what the rate
/// of such passes is measured with).
enum class gradient_sink { host, device };

/// HostTensors: around_pass(body), parameter(t), gradient(t) (float*, tensor t in parameter_tensors order) and
/// version() (changes whenever the parameters do).
template <class HostTensors>
class device_executor {
 public:
  device_executor(HostTensors& host, device_workspace& workspace, const model_config& config,
                  gradient_sink sink = gradient_sink::host)
      : host_(&host), workspace_(&workspace), sink_(sink) {
    for (const auto& tensor : parameter_tensors(config)) elements_.push_back(tensor.elements);
    parameters_.assign(elements_.size(), nullptr);
    gradients_.assign(elements_.size(), nullptr);
  }

  template <class Body>
  void pass(const pass_info& info, Body&& body) {
    host_->around_pass([&] {
      const bool backward = info.kind == chunkwise::pass_kind::backward;
      std::size_t offset = 0;
      for (const auto t : info.tensors) {
        parameters_[t] = workspace_->parameter(t, host_->parameter(t), host_->version());
        gradients_[t] = backward ? workspace_->zeroed_gradient(offset, elements_[t]) : nullptr;
        offset += elements_[t];
      }
      body(*this);
      if (!backward || sink_ == gradient_sink::device) return;
      offset = 0;
      for (const auto t : info.tensors) {
        workspace_->add_gradient_to(host_->gradient(t), offset, elements_[t]);
        offset += elements_[t];
      }
    });
  }
  /// Device pointers of the running pass's tensors.
  float* param(std::size_t t) { return parameters_[t]; }
  float* grad(std::size_t t) { return gradients_[t]; }
  device_workspace& acts() noexcept { return *workspace_; }

 private:
  HostTensors* host_;
  device_workspace* workspace_;
  gradient_sink sink_;
  std::vector<std::size_t> elements_;
  std::vector<float*> parameters_, gradients_;
};

/// --backend cuda with the chunks in device memory (runtime<Plan, gpu_backend, ...>): each pass acquires its chunks,
/// and the device passes read the runtime's fp32 parameters and add into its gradient accumulators where they are:
/// no mirror, no copy. bf16 and fp16 chunks are widened into the workspace's staging on the device, and the pass's
/// fp32 gradients added into the 16-bit accumulators there, times fp16's loss scale (as fp32_compute does on the
/// host, to the same bits).
/// `Device` says how the passes reach the runtime's device: `address(p)`, the passes' address of the runtime's device
/// address p, and `computed()`, an event of the runtime's backend that completes once the passes queued so far have
/// run. A pass's release hands its chunks on (to a reduction, an update, an eviction) ordered after that event, so
/// the trainer's thread queues the next pass while the GPU still runs this one. On a GPU: gpu_backend.hpp's
/// default_stream_passes; tests: the isolated device's host aliases, for the passes on Thrust's OpenMP system.
template <class Runtime, class Device>
class device_chunk_executor {
 public:
  device_chunk_executor(Runtime& rt, device_workspace& workspace, const model_config& config, Device device = {})
      : rt_(&rt), workspace_(&workspace), device_(device) {
    for (const auto& tensor : parameter_tensors(config)) elements_.push_back(tensor.elements);
    parameters_.assign(elements_.size(), nullptr);
    gradients_.assign(elements_.size(), nullptr);
    const auto type = rt.element_type();
    if (type != chunkwise::dtype::fp32 && type != chunkwise::dtype::bf16 && type != chunkwise::dtype::fp16)
      chunkwise::throw_error(chunkwise::error_code::unsupported,
                             "the device passes compute on fp32, bf16 or fp16 chunks, not " +
                                 std::string(chunkwise::to_string(type)));
  }
  /// The next forward() starts at the profile's first pass.
  void restart() noexcept { next_ = 0; }

  template <class Body>
  void pass(const pass_info& info, Body&& body) {
    const std::size_t pass = next_++;
    time_host("runtime acquire", [&] { rt_->acquire(pass); });
    const bool backward = info.kind == chunkwise::pass_kind::backward;
    const chunkwise::dtype type = rt_->element_type();
    const bool widened = type != chunkwise::dtype::fp32;
    std::size_t offset = 0;
    for (const auto t : info.tensors) {
      const auto tensor = static_cast<std::uint32_t>(t);
      if (widened) {
        parameters_[t] = workspace_->widened_parameter(offset, chunk_bits(tensor, type, false), elements_[t], type);
        gradients_[t] = backward ? workspace_->zeroed_gradient(offset, elements_[t]) : nullptr;
      } else {
        parameters_[t] = device_.address(rt_->parameter(tensor).data());
        gradients_[t] = backward ? device_.address(rt_->gradient(tensor).data()) : nullptr;
      }
      offset += elements_[t];
    }
    body(*this);
    if (widened && backward) {
      offset = 0;
      for (const auto t : info.tensors) {
        workspace_->add_gradient_to_16bit(chunk_bits(static_cast<std::uint32_t>(t), type, true), offset, elements_[t],
                                          rt_->loss_scale(), type);
        offset += elements_[t];
      }
    }
    time_host("runtime release", [&] { rt_->release(pass, device_.computed()); });
  }
  float* param(std::size_t t) { return parameters_[t]; }
  float* grad(std::size_t t) { return gradients_[t]; }
  device_workspace& acts() noexcept { return *workspace_; }

 private:
  // A tensor's 16-bit parameters (or gradient accumulator) as the raw bits the workspace converts, at the passes'
  // address.
  std::uint16_t* chunk_bits(std::uint32_t tensor, chunkwise::dtype type, bool gradient) const {
    return chunkwise::visit_element(type, "the device passes", [&]<class T>(T) {
      auto values = gradient ? rt_->template gradient<T>(tensor) : rt_->template parameter<T>(tensor);
      return device_.address(reinterpret_cast<std::uint16_t*>(values.data()));
    });
  }

  Runtime* rt_;
  device_workspace* workspace_;
  Device device_;
  std::size_t next_ = 0;
  std::vector<std::size_t> elements_;
  std::vector<float*> parameters_, gradients_;
};

/// The FLOP/s the device passes reach: the compute rate the planner charges for train_gpt2 --backend cuda. `sink`:
/// gradient_sink::host for passes on host chunks (each backward pass's gradients copied down and added there, as the
/// mirror does), gradient_sink::device for passes on device chunks (none copied). As measure_pass_flops
/// (chunked_trainer.hpp) on the CPU: the model cut to as many layers as fit 1 GiB of training state, one warm-up,
/// then the median of `iterations` forward and backward passes.
inline double measure_device_pass_flops(model_config config, bool bf16_products, gradient_sink sink,
                                        int iterations = 5) {
  const std::size_t layer_state_bytes = 16 * 12 * config.channels * config.channels;  // fp32 p, g, m, v per layer
  config.layers = std::clamp<std::size_t>((std::size_t{1} << 30) / layer_state_bytes, 1, config.layers);
  reference_trainer trainer(config, 1);
  device_workspace workspace(config, bf16_products);
  trainer_tensors host{&trainer};
  device_executor run(host, workspace, config, sink);
  std::vector<int> tokens(config.batch * config.context), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int>((i * 7) % config.vocab);
    targets[i] = static_cast<int>((i * 11 + 3) % config.vocab);
  }
  const double seconds = median_seconds(iterations, [&] {
    trainer.zero_gradients();
    forward(run, config, tokens.data(), targets.data());
    backward(run, config, tokens.data(), targets.data());
    workspace.synchronize();
  });
  return static_cast<double>(trace_profile(config).total_flops()) / seconds;
}

}  // namespace gpt2
