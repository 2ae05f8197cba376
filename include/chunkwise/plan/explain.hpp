#pragma once
// explain: every plan of a set as a table (feasible or why not, memory, predicted step time and its breakdown, the
// knobs the search chose, the winner marked), and for the chosen plan the resource that bounds its step and what the
// next fastest plan would cost. The same as JSON: plan/explain_json.hpp (the json component).
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/plan/search.hpp>

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

namespace chunkwise {

namespace detail {
inline std::string format_seconds(double s) {
  char text[32];
  if (s >= 1.0) std::snprintf(text, sizeof text, "%.2f s", s);
  else if (s >= 1e-3) std::snprintf(text, sizeof text, "%.1f ms", s * 1e3);
  else std::snprintf(text, sizeof text, "%.0f us", s * 1e6);
  return text;
}
}  // namespace detail

/// The table; `chosen` marks the winner (none when nothing fits).
template <class PlanSet>
std::string explain_table(const std::array<prediction, PlanSet::size>& plans, std::optional<std::size_t> chosen) {
  const auto names = PlanSet::names();
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "  %-58s %10s %10s %10s %10s %6s %6s %5s  %s\n", "plan", "step", "device", "host",
                "nvme", "chunk", "blocks", "offl", "breakdown (exposed)");
  out += line;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const auto& p = plans[i];
    const char* mark = chosen && *chosen == i ? "*" : " ";
    if (!p.feasible) {
      std::snprintf(line, sizeof line, "%s %-58s infeasible: %s\n", mark, names[i].c_str(),
                    why_infeasible(p).c_str());
      out += line;
      continue;
    }
    const auto& t = p.time;
    const std::string breakdown =
        "compute " + detail::format_seconds(t.compute) + ", collective " + detail::format_seconds(t.collective) + " (" +
        detail::format_seconds(t.collective_exposed) + "), h2d " + detail::format_seconds(t.host_to_device) + " (" +
        detail::format_seconds(t.host_to_device_exposed) + "), d2h " + detail::format_seconds(t.device_to_host) + " (" +
        detail::format_seconds(t.device_to_host_exposed) + "), nvme " + detail::format_seconds(t.nvme) + " (" +
        detail::format_seconds(t.nvme_exposed) + "), optimizer " + detail::format_seconds(t.optimizer);
    std::snprintf(line, sizeof line, "%s %-58s %10s %10s %10s %10s %6s %6llu %4.0f%%  %s\n", mark, names[i].c_str(),
                  detail::format_seconds(t.step).c_str(), format_bytes(p.memory.device).c_str(),
                  format_bytes(p.memory.host).c_str(), format_bytes(p.memory.nvme).c_str(),
                  format_bytes(p.knobs.chunk_bytes).c_str(), static_cast<unsigned long long>(p.knobs.device_blocks),
                  100.0 * p.knobs.offload_fraction, breakdown.c_str());
    out += line;
  }
  return out;
}

/// "bound by compute: 15.3 ms of the 15.4 ms step (99%); the next fastest, NAME, is predicted 15.6 ms (+1.3%)": the
/// chosen plan's bottleneck (bound_of) and the runner-up among the plans that fit (none: "no other plan fits").
template <class PlanSet>
std::string explain_bound(const std::array<prediction, PlanSet::size>& plans, std::size_t chosen) {
  const auto names = PlanSet::names();
  const prediction& p = plans[chosen];
  const step_bound bound = bound_of(p.time);
  char share[32];
  std::snprintf(share, sizeof share, "%.0f%%", 100.0 * bound.share);
  std::string text = "bound by " + std::string(bound.resource) + ": " + detail::format_seconds(bound.seconds) +
                     " of the " + detail::format_seconds(p.time.step) + " step (" + share + ")";
  std::optional<std::size_t> next;
  for (std::size_t i = 0; i < plans.size(); ++i)
    if (i != chosen && plans[i].feasible && (!next || plans[i].time.step < plans[*next].time.step)) next = i;
  if (!next) return text + "; no other plan fits";
  char more[32];
  std::snprintf(more, sizeof more, "%+.1f%%", 100.0 * (plans[*next].time.step / p.time.step - 1.0));
  const bool tie = std::abs(plans[*next].time.step / p.time.step - 1.0) < choice_tie_tolerance;
  return text + "; the next fastest, " + names[*next] + ", is predicted " +
         detail::format_seconds(plans[*next].time.step) + " (" + more +
         (tie ? ", a tie within the search's tolerance: the plan listed first is kept)" : ")");
}

}  // namespace chunkwise
