#pragma once
// machine_profile <-> JSON (format "chunkwise.machine_profile", version 1): every field of machine_profile under its
// own name; a bandwidth curve is an array of {"message_bytes", "bytes_per_second"}. Loading checks types (errors
// name the field's path) and then validate().
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/profile/detail/json_fields.hpp>
#include <chunkwise/profile/machine_profile.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace chunkwise {

inline constexpr std::string_view machine_profile_format = "chunkwise.machine_profile";
inline constexpr std::uint64_t machine_profile_version = 1;

namespace detail {
inline nlohmann::json curve_to_json(const bandwidth_curve& curve) {
  nlohmann::json points = nlohmann::json::array();
  for (std::uint32_t i = 0; i < curve.count; ++i)
    points.push_back({{"message_bytes", curve.points[i].message_bytes},
                      {"bytes_per_second", curve.points[i].bytes_per_second}});
  return points;
}
inline bandwidth_curve curve_from_json(const nlohmann::json& value, const std::string& path) {
  const auto& points = json_array(value, path);
  if (points.size() > bandwidth_curve::capacity)
    raise_field(path, std::to_string(points.size()) + " points; at most " + std::to_string(bandwidth_curve::capacity) +
                          " fit");
  bandwidth_curve curve;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    curve.add(json_unsigned(json_field(points[i], "message_bytes", at), at + ".message_bytes"),
              json_number(json_field(points[i], "bytes_per_second", at), at + ".bytes_per_second"));
  }
  return curve;
}
}  // namespace detail

inline nlohmann::json to_json(const machine_profile& m) {
  return {{"format", machine_profile_format},
          {"version", machine_profile_version},
          {"name", m.name.str()},
          {"fingerprint", m.fingerprint.str()},
          {"kind", std::string(to_string(m.kind))},
          {"devices", m.devices},
          {"device_memory", m.device_memory},
          {"host_memory", m.host_memory},
          {"nvme_capacity", m.nvme_capacity},
          {"host_to_device_bytes_per_second", m.host_to_device_bytes_per_second},
          {"device_to_host_bytes_per_second", m.device_to_host_bytes_per_second},
          {"nvme_read_bytes_per_second", m.nvme_read_bytes_per_second},
          {"nvme_write_bytes_per_second", m.nvme_write_bytes_per_second},
          {"nvme_cpu_seconds_per_byte", m.nvme_cpu_seconds_per_byte},
          {"nvme_read_by_block", detail::curve_to_json(m.nvme_read_by_block)},
          {"nvme_write_by_block", detail::curve_to_json(m.nvme_write_by_block)},
          {"all_gather", detail::curve_to_json(m.all_gather)},
          {"reduce_scatter", detail::curve_to_json(m.reduce_scatter)},
          {"all_reduce", detail::curve_to_json(m.all_reduce)},
          {"collective_latency_seconds", m.collective_latency_seconds},
          {"machines", m.machines},
          {"inter_machine", detail::curve_to_json(m.inter_machine)},
          {"inter_machine_latency_seconds", m.inter_machine_latency_seconds},
          {"device_optimizer_params_per_second", m.device_optimizer_params_per_second},
          {"host_optimizer_params_per_second", m.host_optimizer_params_per_second},
          {"device_flops_per_second", m.device_flops_per_second}};
}

inline machine_profile machine_profile_from_json(const nlohmann::json& document, const std::string& path = "machine") {
  using namespace detail;
  const auto field = [&](std::string_view key) -> const nlohmann::json& { return json_field(document, key, path); };
  const auto at = [&](std::string_view key) { return path + "." + std::string(key); };
  const std::string format = json_string(field("format"), at("format"));
  if (format != machine_profile_format)
    raise_field(at("format"), "expected \"" + std::string(machine_profile_format) + "\", found \"" + format + "\"");
  const std::uint64_t version = json_unsigned(field("version"), at("version"));
  if (version != machine_profile_version)
    raise_field(at("version"), "version " + std::to_string(version) + " is not supported; this build reads " +
                                   std::to_string(machine_profile_version));
  machine_profile m;
  m.name = json_name(field("name"), at("name"));
  m.fingerprint = json_name(field("fingerprint"), at("fingerprint"));
  const std::string kind = json_string(field("kind"), at("kind"));
  if (kind == "cuda") m.kind = device_kind::cuda;
  else if (kind == "host") m.kind = device_kind::host;
  else raise_field(at("kind"), "expected \"cuda\" or \"host\", found \"" + kind + "\"");
  const std::uint64_t devices = json_unsigned(field("devices"), at("devices"));
  if (devices > 65536) raise_field(at("devices"), std::to_string(devices) + " devices; at most 65536");
  m.devices = static_cast<std::uint32_t>(devices);
  m.device_memory = json_unsigned(field("device_memory"), at("device_memory"));
  m.host_memory = json_unsigned(field("host_memory"), at("host_memory"));
  m.nvme_capacity = json_unsigned(field("nvme_capacity"), at("nvme_capacity"));
  const auto number = [&](std::string_view key) { return json_number(field(key), at(key)); };
  m.host_to_device_bytes_per_second = number("host_to_device_bytes_per_second");
  m.device_to_host_bytes_per_second = number("device_to_host_bytes_per_second");
  m.nvme_read_bytes_per_second = number("nvme_read_bytes_per_second");
  m.nvme_write_bytes_per_second = number("nvme_write_bytes_per_second");
  if (document.contains("nvme_cpu_seconds_per_byte"))  // optional: older profiles have none (0)
    m.nvme_cpu_seconds_per_byte = number("nvme_cpu_seconds_per_byte");
  for (const auto& [key, curve] : {std::pair{"nvme_read_by_block", &m.nvme_read_by_block},
                                   std::pair{"nvme_write_by_block", &m.nvme_write_by_block}})
    if (document.contains(key)) *curve = curve_from_json(field(key), at(key));  // optional: flat rates without
  m.all_gather = curve_from_json(field("all_gather"), at("all_gather"));
  m.reduce_scatter = curve_from_json(field("reduce_scatter"), at("reduce_scatter"));
  m.all_reduce = curve_from_json(field("all_reduce"), at("all_reduce"));
  m.collective_latency_seconds = number("collective_latency_seconds");
  // One machine unless the profile says otherwise (profiles written before these fields describe one machine).
  if (document.contains("machines")) {
    const std::uint64_t machines = json_unsigned(field("machines"), at("machines"));
    if (machines > 65536) raise_field(at("machines"), std::to_string(machines) + " machines; at most 65536");
    m.machines = static_cast<std::uint32_t>(machines);
  }
  if (document.contains("inter_machine")) m.inter_machine = curve_from_json(field("inter_machine"), at("inter_machine"));
  if (document.contains("inter_machine_latency_seconds"))
    m.inter_machine_latency_seconds = number("inter_machine_latency_seconds");
  m.device_optimizer_params_per_second = number("device_optimizer_params_per_second");
  m.host_optimizer_params_per_second = number("host_optimizer_params_per_second");
  m.device_flops_per_second = number("device_flops_per_second");
  validate(m);
  return m;
}

inline machine_profile load_machine_profile(const std::filesystem::path& file) {
  return machine_profile_from_json(detail::parse_json_file(file), file.string());
}

inline void save_machine_profile(const machine_profile& machine, const std::filesystem::path& file) {
  write_file_atomically(file, to_json(machine).dump(1) + "\n");
}

}  // namespace chunkwise
