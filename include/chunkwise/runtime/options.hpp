#pragma once
// What a trainer tells the runtime besides the plan: optimizer settings, budgets, the planner's knobs, how gradients
// are handed over; and what the runtime reports about the bytes its collectives moved.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/optim/hyperparameters.hpp>
#include <chunkwise/optim/loss_scaler.hpp>
#include <chunkwise/runtime/gradient_pipeline.hpp>
#include <chunkwise/runtime/optimizer_stage.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>

namespace chunkwise {

/// Bytes this rank's collectives moved into its buffers: gathered parameters, reduced gradients, published updates.
struct runtime_traffic {
  byte_count gathered = 0;
  byte_count reduced = 0;
  byte_count published = 0;
  byte_count fetched = 0;  // streamed chunks: home -> device through the cache
  std::uint64_t gathers_ahead = 0;  // parameter gathers started passes ahead of their use (a count, not bytes)
  [[nodiscard]] constexpr byte_count total() const noexcept { return gathered + reduced + published + fetched; }
};

struct runtime_options {
  optim::adam_config adam{};
  unsigned optimizer_threads = 1;
  /// The learning rate of each step (from 1). Given, each chunk's update starts as soon as its gradient is reduced,
  /// beside the rest of backward, and the trainer calls step(); without it, step(lr) runs every update.
  learning_rate_schedule learning_rate{};
  /// > 0: gradients are scaled so that their global L2 norm (over every rank) is at most this, as
  /// torch.nn.utils.clip_grad_norm_. Exact: the updates then wait for step() (they need every gradient's norm).
  float clip_norm = 0.0f;
  /// Dynamic loss scaling for fp16 parameters (as torch.cuda.amp.GradScaler): the trainer multiplies its loss by
  /// loss_scale(); a step whose gradients overflowed on any rank is skipped on every rank and the scale backs off.
  /// Exact like clipping: the updates then wait for step().
  std::optional<optim::loss_scaler_config> loss_scaling{};
  byte_count alignment = 256;
  byte_count device_budget = ~byte_count{0};  // bytes of the device tier per rank
  byte_count host_budget = ~byte_count{0};    // bytes of the pinned host tier per rank
  /// Chunks whose optimizer states live off the device; unset: none for optimizer_follows_home, all for
  /// optimizer_offload, the policy's smallest fraction for optimizer_auto (give the planner's knob).
  std::optional<std::size_t> offloaded_chunks{};
  /// cached<> and split<>: device blocks of one chunk's home part each (the planner's knob; resident chunks take one
  /// each, the cache the rest). Unset: cached<> streams through max(2, widest pass) blocks, split<> keeps half the
  /// chunks resident.
  std::optional<std::size_t> device_blocks{};
  /// The chunk capacity the search chose among the layout's candidates (prediction::knobs.chunk_bytes); unset: the
  /// layout's own choice.
  std::optional<byte_count> chunk_bytes{};
  /// The layout candidate the search chose (prediction::knobs.layout_candidate): where candidates share their
  /// largest chunk (private_chunks: the private embedding's), the index tells them apart; chunk_bytes, when also
  /// given, must match it.
  std::optional<std::size_t> layout_candidate{};
  std::size_t prefetch_depth = 2;  // passes fetched ahead (gathers; home fetches: as many widest passes' accesses)
  gradient_handover handover = gradient_handover::profile;
  /// Profile hand-over: forward and backward runs of the profile accumulated into one step's gradients.
  std::uint32_t micro_batches = 1;
  std::filesystem::path nvme_directory = std::filesystem::temp_directory_path();  // NVMe homes: the store's directory
};

/// Fills a tensor's initial values: (tensor index, its elements).
using tensor_initializer = std::function<void(std::uint32_t, std::span<float>)>;

}  // namespace chunkwise
