#pragma once
// explain_json: every plan of a set as JSON, the fields of explain_table (docs/plan-json.md, "plans[]", says what each
// means and its unit). Needs nlohmann_json: link chunkwise::json (CMake), which also makes <chunkwise/plan.hpp>
// include this header.
#include <chunkwise/plan/explain.hpp>
#include <chunkwise/plan/search.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

namespace chunkwise {

template <class PlanSet>
nlohmann::json explain_json(const std::array<prediction, PlanSet::size>& plans, std::optional<std::size_t> chosen) {
  const auto names = PlanSet::names();
  nlohmann::json list = nlohmann::json::array();
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const auto& p = plans[i];
    nlohmann::json entry{{"name", names[i]}, {"feasible", p.feasible}, {"chosen", chosen && *chosen == i}};
    if (!p.feasible) {
      entry.update({{"limit", std::string(to_string(p.limit))}, {"needed_bytes", p.needed}, {"available_bytes", p.available}});
    }
    entry.update({{"peak_device_bytes", p.memory.device},
                  {"host_bytes", p.memory.host},
                  {"nvme_bytes", p.memory.nvme},
                  {"step_seconds", p.feasible ? nlohmann::json(p.time.step) : nlohmann::json(nullptr)},
                  {"bound_by", p.feasible ? nlohmann::json(std::string(bound_of(p.time).resource))
                                          : nlohmann::json(nullptr)},
                  {"knobs",
                   {{"chunk_bytes", p.knobs.chunk_bytes},
                    {"chunks", p.knobs.chunks},
                    {"device_blocks", p.knobs.device_blocks},
                    {"offload_fraction", p.knobs.offload_fraction},
                    {"resident_chunks", p.knobs.resident_chunks},
                    {"layout_candidate", p.knobs.layout_candidate}}},
                  {"memory",
                   {{"device_parameters", p.memory.device_parameters},
                    {"device_working", p.memory.device_working},
                    {"device_optimizer", p.memory.device_optimizer},
                    {"device_activations", p.memory.device_activations}}},
                  {"time",
                   {{"compute", p.time.compute},
                    {"collective", p.time.collective},
                    {"host_to_device", p.time.host_to_device},
                    {"device_to_host", p.time.device_to_host},
                    {"nvme", p.time.nvme},
                    {"optimizer", p.time.optimizer},
                    {"collective_exposed", p.time.collective_exposed},
                    {"host_to_device_exposed", p.time.host_to_device_exposed},
                    {"device_to_host_exposed", p.time.device_to_host_exposed},
                    {"nvme_exposed", p.time.nvme_exposed}}}});
    list.push_back(std::move(entry));
  }
  return list;
}

}  // namespace chunkwise
