#pragma once
// How a runtime is put together from its plan, model and options, before the first pass: the checked model, the
// plan agreement, the layout at the searched chunk size, the chunks each pass touches, how many chunks stay on the
// device (resident) and whose optimizer states are offloaded, the chunk records, and the home storage's layout.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/abi.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/hash.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/plan/layout_candidates.hpp>
#include <chunkwise/profile/model_profile.hpp>
#include <chunkwise/runtime/chunk_record.hpp>
#include <chunkwise/runtime/detail/pass_chunks.hpp>
#include <chunkwise/runtime/detail/rank_agreement.hpp>
#include <chunkwise/runtime/home_storage.hpp>
#include <chunkwise/runtime/options.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace chunkwise::detail::inline CHUNKWISE_ABI {

inline const model_profile& checked_model(const model_profile& model) {
  validate(model);
  for (const auto& t : model.tensors) {
    if (t.type != dtype::fp32 && t.type != dtype::bf16 && t.type != dtype::fp16)
      raise(error_code::unsupported, "runtime: tensor '" + t.name.str() + "' is " + std::string(to_string(t.type)) +
                                         "; the runtime trains fp32, bf16 or fp16 parameters");
    if (t.type != model.tensors.front().type)
      raise(error_code::unsupported, "runtime: tensor '" + t.name.str() + "' is " + std::string(to_string(t.type)) +
                                         " but '" + model.tensors.front().name.str() + "' is " +
                                         std::string(to_string(model.tensors.front().type)) +
                                         "; every parameter of a run has one element type (its master weights and "
                                         "optimizer states are fp32 whatever it is)");
  }
  return model;
}
/// The element type of the working parameters and gradients: the tensors' (fp32 when there are none).
inline dtype compute_type(const model_profile& model) noexcept {
  return model.tensors.empty() ? dtype::fp32 : model.tensors.front().type;
}

/// Every rank must run the same plan on the same model with the same layout knobs.
template <class Plan, communicator Comm>
bool agree_on_plan(const model_profile& model, host_exchange<Comm>& comm, const runtime_options& options) {
  const std::uint64_t mine = fnv1a(tensor_list_hash(model))  // continued over the plan and the knobs
                                 .add(Plan::name())
                                 .add(options.alignment)
                                 .add(options.chunk_bytes.value_or(0))
                                 .add(options.layout_candidate.value_or(~std::size_t{0}))
                                 .add(options.device_blocks.value_or(0))
                                 .value();
  agree_on_fingerprint(comm, mine, Plan::name() + " on '" + model.name.str() + "'");
  return true;
}

/// The layout's candidate the search chose: by its index, or by its chunk capacity (or the layout's own choice).
template <class Plan>
chunk_map build_layout(const model_profile& model, const layout_options& options, std::optional<byte_count> chunk_bytes,
                       std::optional<std::size_t> candidate_index = std::nullopt) {
  using candidates = layout_candidates<typename Plan::layout>;
  if (candidate_index) {
    const std::size_t c = *candidate_index;
    if (c >= candidates::count || !candidates::can_pack(model, options, c))
      raise(error_code::invalid_argument, "runtime: " + Plan::name() + " has no layout candidate " + std::to_string(c) +
                                              " for this model and " + std::to_string(options.ranks) + " ranks (it has " +
                                              std::to_string(candidates::count) + "; give the search's knob)");
    chunk_map map = candidates::build(model, options, c);
    if (chunk_bytes && map.summary().chunk_bytes != *chunk_bytes)
      raise(error_code::invalid_argument, "runtime: " + Plan::name() + "'s layout candidate " + std::to_string(c) +
                                              " has chunks of up to " + std::to_string(map.summary().chunk_bytes) +
                                              " bytes, not " + std::to_string(*chunk_bytes) +
                                              " (give both knobs from the same search)");
    return map;
  }
  if (!chunk_bytes) return Plan::layout::build(model, options);
  std::string tried;
  for (std::size_t candidate = 0; candidate < candidates::count; ++candidate) {
    if (!candidates::can_pack(model, options, candidate)) continue;
    chunk_map map = candidates::build(model, options, candidate);
    if (map.summary().chunk_bytes == *chunk_bytes) return map;
    tried += (tried.empty() ? "" : ", ") + std::to_string(map.summary().chunk_bytes);
  }
  raise(error_code::invalid_argument, "runtime: " + Plan::name() + " has no chunk size of " +
                                          std::to_string(*chunk_bytes) + " bytes for this model and " +
                                          std::to_string(options.ranks) + " ranks; its candidates: " + tried +
                                          " (give the search's knob for the same rank count)");
}

/// The chunks each pass touches, in first-touch order.
inline pass_chunk_lists chunks_by_pass(const model_profile& model, const chunk_map& map) {
  pass_chunk_lists passes(model.passes.size());
  for (std::size_t s = 0; s < model.passes.size(); ++s)
    for (const auto t : model.passes[s].tensors) {
      const auto c = map.locations[t].chunk;
      if (std::find(passes[s].begin(), passes[s].end(), c) == passes[s].end()) passes[s].push_back(c);
    }
  return passes;
}

/// Where the chunks go: device blocks (the planner's knob, or the fallback documented at runtime_options), the
/// resident chunks they leave (Placement::resident_chunks, the first in first-use order), and how many of those
/// keep their optimizer states off the device (the last ones).
struct chunk_placement {
  std::size_t device_blocks = 0;
  std::size_t resident = 0;
  std::size_t offloaded = 0;
};

template <class Plan>
chunk_placement place_chunks(std::size_t chunks, const pass_chunk_lists& pass_chunks,
                             const runtime_options& options) {
  using placement = typename Plan::placement;
  std::size_t widest = 0;
  for (const auto& in_pass : pass_chunks) widest = std::max(widest, in_pass.size());
  std::size_t fallback = std::max<std::size_t>(2, widest);
  if constexpr (requires { placement::stream_blocks; }) fallback = chunks / 2 + placement::stream_blocks;
  chunk_placement p;
  p.device_blocks = placement::uses_device_cache ? options.device_blocks.value_or(fallback) : chunks;
  if (p.device_blocks == 0)
    raise(error_code::invalid_argument, "runtime: device_blocks = 0; " + std::string(placement::name) +
                                            " needs at least one device block");
  p.resident = placement::uses_device_cache ? placement::resident_chunks(chunks, p.device_blocks) : chunks;
  const auto default_offloaded = static_cast<std::size_t>(Plan::optimizer_execution::min_offload_fraction *
                                                              static_cast<double>(p.resident) + 0.5);
  p.offloaded = std::min(options.offloaded_chunks.value_or(default_offloaded), p.resident);
  if (Plan::optimizer_execution::max_offload_fraction == 0.0 && p.offloaded != 0)
    raise(error_code::invalid_argument, "runtime: " + Plan::name() + " keeps every optimizer state on the device; "
                                        "offloaded_chunks must be 0 (use optimizer_auto or optimizer_offload to "
                                        "move states to the host)");
  return p;
}

/// A device the host cannot address (a GPU's) runs what the runtime drives through backend_parts<Backend>; several
/// ranks there need a communicator whose collectives take device memory (reaches_device_memory<Comm>): a host
/// communicator is refused, naming the way out.
template <class Plan, class Backend, communicator Comm>
void check_device_reach(const Comm& comm) {
  if constexpr (!backend_parts<Backend>::device_is_host_memory) {
    if (comm.size() > 1 && !reaches_device_memory<Comm>)
      raise(error_code::unsupported, "runtime: " + Plan::name() + " on the " + Backend::name + " backend with " +
                                         std::to_string(comm.size()) + " ranks: this communicator's collectives run "
                                         "on the host and cannot read the device's memory; run one rank, or a "
                                         "communicator that reaches device memory (nccl_comm on a GPU)");
  }
}

/// Each chunk's geometry, initial state and reduced-gradient buffer, which lives with its optimizer states.
template <class Plan, communicator Comm, class Ops, class DeviceTier, class HostTier, class Backend>
std::vector<chunk_record<Comm>> make_records(const chunk_map& map, const Ops& ops, const chunk_placement& p,
                                             dtype type, DeviceTier& device, HostTier& host, Backend& backend) {
  constexpr bool shards = Plan::collective::shards_parameters;
  std::vector<chunk_record<Comm>> records(map.chunks.size());
  visit_element(type, "runtime", [&]<class T>(T) {
    for (std::uint32_t c = 0; c < records.size(); ++c) {
      auto& b = records[c];
      const std::size_t elements = map.chunks[c].capacity / sizeof(T);
      b.index = c;
      b.life = chunk_life(c, !shards && c < p.resident ? chunk_state::ready : chunk_state::released);
      b.shards_parameters = shards;
      b.owned = ops.template owned<T>(elements);
      b.full_elements = ops.template full_elements<T>(elements);
      b.home_elements = ops.template home_elements<T>(elements);
      b.states_on_device = c < p.resident - p.offloaded;
      b.owned_gradient = b.states_on_device ? gradient_buffer(device, backend.compute(), b.owned.elements, type)
                                            : tier_buffer(host, b.owned.elements, type);
    }
  });
  return records;
}

/// The homes: every chunk's parameters and moments, and for streamed placements the order their cache follows (a
/// chunk the previous pass used too stays acquired: one access) and its blocks, which must hold the widest pass's
/// streamed chunks at once.
template <class Plan, class Record>
home_layout make_home_layout(const model_profile& model, const pass_chunk_lists& pass_chunks,
                             const std::vector<Record>& records, const chunk_placement& p,
                             const runtime_options& options) {
  home_layout h;
  h.resident = p.resident;
  h.blocks = p.device_blocks - p.resident;
  h.nvme_directory = options.nvme_directory;
  h.type = compute_type(model);
  for (const auto& b : records) {
    h.owned_offset.push_back(b.owned.offset - b.home_first());
    h.param_elements.push_back(b.home_elements);
    h.state_elements.push_back(b.owned.elements);
    h.states_on_device.push_back(b.states_on_device ? 1 : 0);
  }
  std::size_t widest = 0;
  std::string widest_label;
  for (std::size_t s = 0; s < pass_chunks.size(); ++s) {
    std::size_t streamed_here = 0;
    for (const auto c : pass_chunks[s])
      if (c >= p.resident) {
        if (s == 0 || !pass_uses(pass_chunks, s - 1, c))
          h.streamed_order.push_back(static_cast<std::uint32_t>(c - p.resident));
        ++streamed_here;
      }
    if (streamed_here > widest) {
      widest = streamed_here;
      widest_label = std::string(model.passes[s].label.view());
    }
  }
  // The cache prefetches along accesses, the gathers along passes: prefetch_depth passes of the widest are that
  // many accesses. A window of 2 accesses fetched each 3-chunk pass's last chunk only when its pass began: measured,
  // a 0.2 ms stall (one chunk's copy) at every layer, forward and backward.
  h.prefetch_depth = options.prefetch_depth * std::max<std::size_t>(widest, 1);
  if (p.resident < records.size() && h.blocks < widest)
    raise(error_code::invalid_argument,
          "runtime: " + Plan::name() + " with device_blocks = " + std::to_string(p.device_blocks) + " keeps " +
              std::to_string(p.resident) + " chunks resident and streams " +
              std::to_string(records.size() - p.resident) + " through " + std::to_string(h.blocks) +
              " blocks, but pass '" + widest_label + "' needs " + std::to_string(widest) +
              " streamed chunks at once; use at least " + std::to_string(p.resident + widest) + " device blocks");
  return h;
}

/// Every chunk's initial home state: the whole chunk in fp32, initialised tensor by tensor; this rank keeps its home
/// part (master weights exact, a bf16/fp16 working copy rounded).
template <class Homes, class Record, class Initializer>
void initialize_homes(Homes& homes, const std::vector<Record>& records, const chunk_map& map,
                      const model_profile& model, const Initializer& initialize) {
  const std::size_t element_bytes = size_of(compute_type(model));
  std::vector<float> staging;
  for (const auto& b : records) {
    staging.assign(b.full_elements, 0.0f);
    for (const auto& slot : map.chunks[b.index].slots)
      initialize(slot.tensor, std::span<float>(staging.data() + slot.offset / element_bytes,
                                               model.tensors[slot.tensor].elements));
    homes.update(b.index, [&](const home_view& home) {
      home.assign(std::span<const float>(staging.data() + b.home_first(), b.home_elements));
    });
  }
}

}  // namespace chunkwise::detail
