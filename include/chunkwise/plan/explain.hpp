#pragma once
// explain: every plan of a set as a table (feasible or why not, memory, predicted step time and its breakdown, the
// knobs the search chose, the winner marked). The same as JSON: plan/explain_json.hpp (the json component).
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/plan/search.hpp>

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
      std::string why = p.limit == plan_limit::ranks
                            ? "its collective cannot split " + std::to_string(p.needed) + " ranks"
                        : p.limit == plan_limit::layout
                            ? "the layout cannot pack the tensors"
                            : "needs " + format_bytes(p.needed) + " of " + std::string(to_string(p.limit)) +
                                  ", has " + format_bytes(p.available);
      std::snprintf(line, sizeof line, "%s %-58s infeasible: %s\n", mark, names[i].c_str(), why.c_str());
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

}  // namespace chunkwise
