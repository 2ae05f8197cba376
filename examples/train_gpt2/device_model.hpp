#pragma once
// GPT-2's passes on a Thrust device: the same six passes as gpt2_model.hpp (embed, layer, head; forward and
// backward), with the same signatures, overloaded on the activations' type. The schedule (schedule.hpp) calls
// `embed_forward(x.param(...), ..., x.acts())`: an executor whose acts() is a device_workspace runs these, one whose
// acts() is activations<float> runs the CPU loops. Pointers handed to these passes are device pointers (the
// workspace's staging, below); tokens and targets are host arrays, copied in by the pass that reads them.
//
// The definitions (device_model_impl.hpp) are Thrust functors: compiled by nvcc they run on the GPU (device_model.cu,
// matrix products through cuBLAS); compiled by g++ with Thrust's OpenMP device system they run on the CPU, which is
// how CI tests this very source against the CPU loops without a GPU (tests/gpt2_device_test.cpp).
#include "gpt2_model.hpp"

#include <cstddef>
#include <cstdint>
#include <chrono>
#include <memory>

namespace gpt2 {

/// Device memory a caller lends device_workspace and keeps alive (the runtime's device tier, which the plan charged
/// it to: runtime::device_workspace); nullptr: the workspace allocates its own.
struct device_lent_memory {
  float* activations = nullptr;  // activations<float>::total_elements(config) floats
  float* staging = nullptr;      // device_workspace::staging_bytes(config): bf16 chunks' widened parameters and
                                 // staged gradients
  void* scratch = nullptr;       // device_workspace::scratch_bytes(config): the token and target arrays, the row
                                 // reductions' scratch and cuBLAS's workspace
};

/// Device memory of one model shape: activations as activations<float> holds them (recompute included), a scratch
/// block (the token and target arrays, the row reductions' partial sums, cuBLAS's workspace), a mirror of the
/// parameters (each tensor copied in when the trainer's copy has changed since; allocated at its first use: passes on
/// the runtime's device chunks need none), and a staging area for the gradients of one pass: zeroed, computed into,
/// and added out to the trainer's through pinned host memory (or into bf16 accumulators on the device, beside a
/// staging area of the pass's widened parameters); both allocated at their first use, as passes on fp32 device chunks
/// compute in place. The activations, the scratch and the staging areas may be lent instead. Throws
/// chunkwise::error(unsupported) when the device system has no device to run on (CUDA without a visible GPU).
class device_workspace {
 public:
  using lent_memory = device_lent_memory;
  /// `bf16_products`: the matrix products on bf16 tensor cores (operands rounded to bf16, fp32 sums: --dtype bf16);
  /// the host system's loops stay fp32.
  explicit device_workspace(const model_config& config, bool bf16_products = false, lent_memory lent = {});
  ~device_workspace();
  device_workspace(const device_workspace&) = delete;
  device_workspace& operator=(const device_workspace&) = delete;

  /// The two staging areas' bytes (each the largest pass's parameters in fp32: at 124M the head's, 155 MB), which
  /// the passes use on bf16 device chunks and on host chunks; passes on fp32 device chunks need none.
  [[nodiscard]] static std::size_t staging_bytes(const model_config& config);
  /// The scratch block's bytes, which every run of the passes uses: the token and target arrays, two sums per row
  /// and row segment (the softmax's over the vocabulary are the most), and on a GPU cuBLAS's workspace (32 MiB, the
  /// size cuBLAS's documentation recommends for Hopper), which cuBLAS would otherwise allocate outside the budget.
  [[nodiscard]] static std::size_t scratch_bytes(const model_config& config);

  /// "CUDA (<GPU name>)" or "OpenMP (host)": where these passes run.
  [[nodiscard]] const char* device_name() const noexcept;
  /// The device copy of parameter tensor `tensor` (parameter_tensors order), copied from `host` unless the mirror
  /// already holds that tensor at `version`: any number that changes whenever the host parameters do (the
  /// optimizer's step count).
  float* parameter(std::size_t tensor, const float* host, std::uint64_t version);
  /// The staging area's parameter slot at `offset`, holding the 16-bit values at `device` (raw bits of `type`, bf16
  /// or fp16; device memory: the runtime's chunks under --dtype bf16 or fp16) widened to fp32.
  float* widened_parameter(std::size_t offset, const std::uint16_t* device, std::size_t elements,
                           chunkwise::dtype type);
  /// device[i] = type(device[i] + scale * gradient slot at `offset`[i]), rounded once: a pass's gradients added into
  /// bf16 or fp16 accumulators in device memory (scale: the runtime's loss scale).
  void add_gradient_to_16bit(std::uint16_t* device, std::size_t offset, std::size_t elements, float scale,
                             chunkwise::dtype type);
  /// The staging area's gradient slot at `offset`, zeroed: a pass accumulates into it.
  float* zeroed_gradient(std::size_t offset, std::size_t elements);
  /// host[i] += gradient slot at `offset`[i]: a pass's gradients added to the trainer's (which accumulate, as the
  /// CPU passes' do).
  void add_gradient_to(float* host, std::size_t offset, std::size_t elements);
  /// Blocks until the device has run everything queued (timing; the passes synchronise where they return values).
  void synchronize();
  /// Device memory these passes hold themselves, outside the runtime's device tier and the plan's charge: each of
  /// the activations, the scratch block and the staging areas that was not lent (the staging areas where used), and
  /// the mirror where used. Zero on the runtime's device chunks, where train_gpt2 lends them all.
  [[nodiscard]] std::size_t own_device_bytes() const noexcept;

  struct state;
  [[nodiscard]] state& buffers() noexcept { return *state_; }

 private:
  std::unique_ptr<state> state_;
};

/// Where CHUNKWISE_GPT2_KERNEL_TIMES is set: forget the times so far; print each operation's total (else nothing).
void reset_kernel_times();
void print_kernel_times();
/// Where CHUNKWISE_GPT2_KERNEL_TIMES is set: runs `work` and adds its wall time to the table under `name` (host work
/// between the device's, such as the runtime's acquire and release); else only runs it.
bool kernel_times_enabled();
void add_host_time(const char* name, double seconds);
template <class Work>
void time_host(const char* name, Work&& work) {
  if (!kernel_times_enabled()) return work();
  const auto start = std::chrono::steady_clock::now();
  work();
  add_host_time(name, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void embed_forward(const float* wte, const float* wpe, const int* tokens, device_workspace& acts);
void layer_forward(std::size_t layer, const layer_params<float>& p, device_workspace& acts);
float head_forward(const float* ln_f_weight, const float* ln_f_bias, const float* wte, const int* targets,
                   device_workspace& acts);
void head_backward(const float* ln_f_weight, const float* wte, float* d_ln_f_weight, float* d_ln_f_bias, float* d_wte,
                   const int* targets, device_workspace& acts);
void layer_backward(std::size_t layer, const layer_params<float>& p, const layer_grads<float>& g,
                    device_workspace& acts);
void embed_backward(float* d_wte, float* d_wpe, const int* tokens, device_workspace& acts);

}  // namespace gpt2
