#pragma once
// What the cost model predicts for one plan with its inner knobs: memory per tier, step time with its breakdown,
// and, when it does not fit, which limit it breaks and by how much. Literal types: usable in constant expressions.
#include <chunkwise/core/bytes.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace chunkwise {

/// The plan's inner knobs, chosen by the search.
struct plan_knobs {
  byte_count chunk_bytes = 0;       // chunk capacity (all ranks' shards together)
  std::uint64_t chunks = 0;
  std::uint64_t device_blocks = 0;  // device blocks of one chunk shard each (resident placements: all chunks)
  double offload_fraction = 0;      // of the resident chunks, the fraction whose optimizer states are off the device
  std::uint64_t resident_chunks = 0;
  std::uint64_t offloaded_resident_chunks = 0;
  std::uint32_t layout_candidate = 0;  // which of layout_candidates<Layout> (runtime_options::layout_candidate)
  byte_count nvme_block = 0;  // what the drive moves per request: one array of a chunk (parameters or an fp32 state)
};

enum class plan_limit : std::uint8_t {
  none,
  device_memory,     // the device budget per rank
  host_memory,       // the machine's host budget
  nvme_capacity,     // the NVMe store's free space (or no NVMe store)
  ranks,             // the collective cannot split this many ranks (hybrid<G> with ranks % G != 0)
  layout,            // the layout cannot pack the tensors (a tensor larger than a fixed chunk)
};

constexpr std::string_view to_string(plan_limit limit) noexcept {
  switch (limit) {
    case plan_limit::none: return "fits";
    case plan_limit::device_memory: return "device memory";
    case plan_limit::host_memory: return "host memory";
    case plan_limit::nvme_capacity: return "NVMe capacity";
    case plan_limit::ranks: return "rank count";
    case plan_limit::layout: return "layout";
  }
  return "?";
}

/// Peak bytes per tier. Device bytes are per rank; host and NVMe bytes are for the whole machine (all ranks).
struct memory_use {
  byte_count device = 0;
  byte_count device_parameters = 0;   // resident chunks and cache blocks
  byte_count device_working = 0;      // gathered chunks and gradient buffers in flight
  byte_count device_optimizer = 0;    // gradient shards and optimizer states updated on the device
  byte_count device_activations = 0;
  byte_count host = 0;
  byte_count nvme = 0;
};

/// Seconds per training step of one rank, by resource. `*_exposed` is the part overlap with compute does not hide.
struct time_breakdown {
  double compute = 0;
  double collective = 0;
  double host_to_device = 0;
  double device_to_host = 0;
  double nvme = 0;
  double optimizer = 0;  // the update itself (device and host kernels, NVMe state streaming overlapped)
  double collective_exposed = 0;
  double host_to_device_exposed = 0;
  double device_to_host_exposed = 0;
  double nvme_exposed = 0;
  double step = 0;  // predicted wall time of one step
};

/// Predictions closer than this (relative) are a tie: the cost model is not that precise, and the earlier plan of the
/// set (sets list the simpler plans first) is the safer choice.
inline constexpr double choice_tie_tolerance = 0.01;

/// The resource a step waits on most: the largest of its phase's concurrent parts and the update.
struct step_bound {
  std::string_view resource;  // "compute", "collectives", "host->device", "device->host", "NVMe", "optimizer"
  double seconds = 0;         // that resource's busy time in the step
  double share = 0;           // seconds / step
};

constexpr step_bound bound_of(const time_breakdown& t) noexcept {
  const std::pair<std::string_view, double> parts[] = {
      {"compute", t.compute},           {"collectives", t.collective}, {"host->device", t.host_to_device},
      {"device->host", t.device_to_host}, {"NVMe", t.nvme},              {"optimizer", t.optimizer}};
  step_bound bound{parts[0].first, parts[0].second, 0};
  for (const auto& [resource, seconds] : parts)
    if (seconds > bound.seconds) bound = {resource, seconds, 0};
  bound.share = t.step > 0 ? bound.seconds / t.step : 0;
  return bound;
}

struct prediction {
  bool feasible = false;
  plan_limit limit = plan_limit::none;
  byte_count needed = 0;     // of the broken limit: what the plan needs at its smallest
  byte_count available = 0;  // and what the machine has
  plan_knobs knobs;
  memory_use memory;
  time_breakdown time;
};

/// Why an infeasible plan does not fit, in words: "needs 1.24 GiB of device memory, has 1.00 GiB", "its collective
/// cannot split 3 ranks", "the layout cannot pack the tensors".
inline std::string why_infeasible(const prediction& p) {
  if (p.limit == plan_limit::ranks) return "its collective cannot split " + std::to_string(p.needed) + " ranks";
  if (p.limit == plan_limit::layout) return "the layout cannot pack the tensors";
  return "needs " + format_bytes(p.needed) + " of " + std::string(to_string(p.limit)) + ", has " +
         format_bytes(p.available);
}

}  // namespace chunkwise
