#pragma once
// The search: for each plan of a plan_set, its inner knobs (chunk size, device blocks, optimizer offload fraction)
// are searched against the cost model; choose() returns the fastest plan that fits. constexpr throughout, so with a
// constant model and machine the choice is a compile-time constant, and identical at run time.
//
// Per plan: for each candidate chunk size of its layout and each offload fraction its optimizer policy allows
// (0, 1/8, ..., 1 when searched), the device block count is the largest that fits the device budget (device memory
// grows with blocks and more blocks never fetch more, so the largest fitting count is the fastest); the fastest
// feasible (chunk size, fraction, blocks) wins. A plan that fits nowhere reports the limit it breaks at its
// smallest configuration and the bytes that configuration needs.
#include <chunkwise/core/error.hpp>
#include <chunkwise/plan/cost_model.hpp>
#include <chunkwise/plan/detail/chunk_trace.hpp>
#include <chunkwise/plan/layout_candidates.hpp>
#include <chunkwise/plan/plan.hpp>
#include <chunkwise/plan/prediction.hpp>
#include <chunkwise/profile/machine_profile.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace chunkwise {

inline constexpr byte_count plan_alignment = 256;  // tensor alignment inside chunks for every plan

namespace detail {

/// Of two infeasible predictions, the one closer to fitting (a smaller shortfall on the same limit; device memory
/// shortfalls are the most useful to report).
constexpr bool closer_to_fitting(const prediction& a, const prediction& b) noexcept {
  if (a.limit != b.limit) return a.limit == plan_limit::device_memory;
  return a.needed - a.available < b.needed - b.available;
}

constexpr prediction check_limits(const machine_profile& machine, const memory_use& memory, prediction p) {
  p.memory = memory;
  p.feasible = false;
  if (memory.device > machine.device_memory) {
    p.limit = plan_limit::device_memory;
    p.needed = memory.device;
    p.available = machine.device_memory;
  } else if (memory.host > machine.host_memory) {
    p.limit = plan_limit::host_memory;
    p.needed = memory.host;
    p.available = machine.host_memory;
  } else if (memory.nvme > machine.nvme_capacity) {
    p.limit = plan_limit::nvme_capacity;
    p.needed = memory.nvme;
    p.available = machine.nvme_capacity;
  } else {
    p.limit = plan_limit::none;
    p.feasible = true;
  }
  return p;
}

}  // namespace detail

namespace detail {
/// One chunk size a layout offers the search: its summary and the chunk access trace at that size.
struct layout_candidate {
  layout_summary summary;
  chunk_trace trace;
  std::uint32_t index = 0;  // in layout_candidates<Layout>
};

/// The layout's candidate chunk sizes that can pack the model (none when no candidate can).
template <class Layout>
constexpr std::vector<layout_candidate> build_candidates(const model_profile& model, const layout_options& options) {
  using candidates = layout_candidates<Layout>;
  std::vector<layout_candidate> built;
  for (std::size_t candidate = 0; candidate < candidates::count; ++candidate) {
    if (!candidates::can_pack(model, options, candidate)) continue;
    const chunk_map map = candidates::build(model, options, candidate);
    built.push_back({map.summary(), trace_chunks(model, map), static_cast<std::uint32_t>(candidate)});
  }
  return built;
}
}  // namespace detail

/// The best knobs of one plan over the given chunk-size candidates, and their prediction (infeasible: the limit and
/// shortfall at its smallest configuration).
template <class Plan>
constexpr prediction search_plan(const model_profile& model, const machine_profile& machine,
                                 const std::vector<detail::layout_candidate>& candidates) {
  using placement = typename Plan::placement;
  using collective = typename Plan::collective;
  using execution = typename Plan::optimizer_execution;
  const int ranks = static_cast<int>(job_ranks(machine));

  prediction best;
  best.limit = plan_limit::layout;
  if (!collective::supports(ranks)) {
    best.limit = plan_limit::ranks;
    best.needed = job_ranks(machine);
    return best;
  }
  bool have_infeasible = false;
  for (const auto& [summary, trace, candidate_index] : candidates) {
    const detail::chunk_shares shares = detail::shares_of<collective>(model, summary, ranks);
    const std::uint64_t n = summary.chunk_count;

    // Fewest blocks the placement can stream with: every chunk for resident; else the widest pass's chunks
    // (a split placement also needs its stream blocks).
    std::uint64_t fewest_blocks = n;
    if constexpr (placement::uses_device_cache) {
      fewest_blocks = std::max<std::uint64_t>(trace.widest_pass, 1);
      if constexpr (requires { placement::stream_blocks; })
        fewest_blocks = std::max<std::uint64_t>(fewest_blocks, placement::stream_blocks);
      fewest_blocks = std::min(fewest_blocks, n);
      // and as many as keep every pass's streamed chunks within the blocks left for streaming (a split placement's
      // stream blocks are fixed; more blocks keep more chunks resident, so the predicate is monotone, and n blocks
      // keep every chunk resident)
      const auto passes_fit = [&](std::uint64_t blocks) {
        const std::uint64_t kept =
            placement::resident_chunks(static_cast<std::size_t>(n), static_cast<std::size_t>(blocks));
        return kept == n ||
               detail::count_fetches(trace, static_cast<std::uint32_t>(kept), blocks - kept) != ~std::uint64_t{0};
      };
      if (!passes_fit(fewest_blocks)) {
        std::uint64_t low = fewest_blocks, high = n;
        while (high - low > 1) {
          const std::uint64_t mid = low + (high - low) / 2;
          (passes_fit(mid) ? high : low) = mid;
        }
        fewest_blocks = high;
      }
    }
    const bool searched_fraction = execution::min_offload_fraction < execution::max_offload_fraction;
    const int fraction_points = searched_fraction ? 8 : 0;  // fractions 0, 1/8, ..., 1 when searched
    for (int point = 0; point <= fraction_points; ++point) {
      const double fraction =
          searched_fraction ? static_cast<double>(point) / fraction_points : execution::min_offload_fraction;
      const auto offloaded_at = [&](std::uint64_t blocks) {
        const std::uint64_t resident =
            placement::resident_chunks(static_cast<std::size_t>(n), static_cast<std::size_t>(blocks));
        const auto off = static_cast<std::uint64_t>(fraction * static_cast<double>(resident) + 0.5);
        return off < resident ? off : resident;
      };
      const auto memory_at = [&](std::uint64_t blocks) {
        return predict_memory<Plan>(machine, shares, trace, blocks, offloaded_at(blocks));
      };
      // Largest block count in [fewest_blocks, n] whose device memory fits (device memory grows with blocks).
      std::uint64_t blocks = fewest_blocks;
      if (memory_at(fewest_blocks).device <= machine.device_memory) {
        std::uint64_t low = fewest_blocks, high = n;
        while (low < high) {
          const std::uint64_t mid = low + (high - low + 1) / 2;
          if (memory_at(mid).device <= machine.device_memory) low = mid;
          else high = mid - 1;
        }
        blocks = low;
      }
      const std::uint64_t offloaded = offloaded_at(blocks);
      prediction p;
      const std::uint64_t resident_chunks =
          placement::resident_chunks(static_cast<std::size_t>(n), static_cast<std::size_t>(blocks));
      const double effective_fraction =
          resident_chunks == 0 ? fraction : static_cast<double>(offloaded) / static_cast<double>(resident_chunks);
      p.knobs = {summary.chunk_bytes, n, blocks, effective_fraction, resident_chunks, offloaded, candidate_index,
                 detail::nvme_block_bytes(shares)};
      p = detail::check_limits(machine, memory_at(blocks), p);
      if (p.feasible) {  // blocks >= fewest_blocks: every pass's streamed chunks fit the blocks left for streaming
        const std::uint64_t resident = p.knobs.resident_chunks;
        const std::uint64_t fetches =
            resident == n ? 0 : detail::count_fetches(trace, static_cast<std::uint32_t>(resident), blocks - resident);
        p.time = predict_time<Plan>(machine, shares, blocks, offloaded, fetches);
      }
      if (p.feasible) {
        if (!best.feasible || p.time.step < best.time.step) best = p;
      } else if (!best.feasible && (!have_infeasible || detail::closer_to_fitting(p, best))) {
        best = p;
        have_infeasible = true;
      }
    }
  }
  return best;
}

template <class Plan>
constexpr prediction search_plan(const model_profile& model, const machine_profile& machine) {
  return search_plan<Plan>(model, machine,
                           detail::build_candidates<typename Plan::layout>(model, {job_ranks(machine), plan_alignment}));
}

/// Every plan of the set, searched: index i holds plan_set::at<i>'s best prediction.
template <class PlanSet>
constexpr std::array<prediction, PlanSet::size> evaluate(const model_profile& model, const machine_profile& machine) {
  validate(model);
  validate(machine);
  // Plans that share the first plan's layout share its candidates: the layout search runs once.
  using first_layout = typename PlanSet::template at<0>::layout;
  const auto shared = detail::build_candidates<first_layout>(model, {job_ranks(machine), plan_alignment});
  const auto one = [&]<class Plan>(std::type_identity<Plan>) {
    if constexpr (std::is_same_v<typename Plan::layout, first_layout>) return search_plan<Plan>(model, machine, shared);
    else return search_plan<Plan>(model, machine);
  };
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::array<prediction, PlanSet::size>{one(std::type_identity<typename PlanSet::template at<I>>{})...};
  }(std::make_index_sequence<PlanSet::size>{});
}

template <class PlanSet>
struct choice {
  std::size_t index = 0;  // into PlanSet
  prediction predicted;   // the chosen plan's knobs and prediction
  std::array<prediction, PlanSet::size> plans{};  // every plan's, for explain()
};

namespace detail {
template <class PlanSet>
[[noreturn]] inline void raise_nothing_fits(const machine_profile& machine, const std::array<prediction, PlanSet::size>& plans) {
  const auto names = PlanSet::names();
  std::size_t closest = 0;
  for (std::size_t i = 1; i < plans.size(); ++i)
    if (closer_to_fitting(plans[i], plans[closest])) closest = i;
  const prediction& p = plans[closest];
  std::string message = "no plan fits this machine (" +
                        (machine.machines > 1 ? std::to_string(machine.machines) + " machines of " : std::string()) +
                        std::to_string(machine.devices) + " x " +
                        format_bytes(machine.device_memory) + " device memory, " + format_bytes(machine.host_memory) +
                        " host memory, " + format_bytes(machine.nvme_capacity) + " NVMe). ";
  if (p.limit == plan_limit::ranks)
    message += "No plan's collective supports " + std::to_string(job_ranks(machine)) + " ranks.";
  else
    message += "The closest is " + names[closest] + ": it needs " + format_bytes(p.needed) + " of " +
               std::string(to_string(p.limit)) + ", the machine has " + format_bytes(p.available) + ".";
  message += " Per plan:";
  for (std::size_t i = 0; i < plans.size(); ++i)
    message += "\n  " + names[i] + ": " + why_infeasible(plans[i]);
  raise(error_code::out_of_memory, message);
}
}  // namespace detail


/// The fastest plan that fits, with its knobs and prediction; ties (within choice_tie_tolerance) go to the earlier
/// plan. Throws error_code::out_of_memory naming the closest plan and the memory it would need when none fits.
template <class PlanSet>
constexpr choice<PlanSet> choose(const model_profile& model, const machine_profile& machine) {
  choice<PlanSet> result;
  result.plans = evaluate<PlanSet>(model, machine);
  bool found = false;
  for (std::size_t i = 0; i < PlanSet::size; ++i) {
    const auto& p = result.plans[i];
    if (p.feasible && (!found || p.time.step < result.predicted.time.step * (1.0 - choice_tie_tolerance))) {
      result.index = i;
      result.predicted = p;
      found = true;
    }
  }
  if (!found) detail::raise_nothing_fits<PlanSet>(machine, result.plans);
  return result;
}

}  // namespace chunkwise
