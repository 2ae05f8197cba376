#pragma once
// measured_rate <-> JSON (format "chunkwise.measured_rates", version 1): the rates a program measured for itself on
// one machine, each under the key its caller composed (measure/rate_cache.hpp keeps them):
//   { "format": "chunkwise.measured_rates", "version": 1,
//     "rates": [ { "key": "...", "value": 1.2e10, "measured_at": 1796593984 }, ... ] }
// "measured_at": seconds since the Unix epoch. Loading checks types (errors name the field's path) and that every
// value is a rate > 0.
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/profile/detail/json_fields.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace chunkwise {

inline constexpr std::string_view measured_rates_format = "chunkwise.measured_rates";
inline constexpr std::uint64_t measured_rates_version = 1;

struct measured_rate {
  std::string key;
  double value = 0;
  std::int64_t measured_at = 0;  // seconds since the Unix epoch
};

/// The file's rates; throws parse_error naming what is wrong.
inline std::vector<measured_rate> load_measured_rates(const std::filesystem::path& file) {
  const nlohmann::json document = detail::parse_json_file(file);
  const std::string name = file.string();
  if (detail::json_string(detail::json_field(document, "format", name), name + ".format") != measured_rates_format)
    detail::raise_field(name + ".format", "expected \"" + std::string(measured_rates_format) + "\"");
  if (detail::json_unsigned(detail::json_field(document, "version", name), name + ".version") != measured_rates_version)
    detail::raise_field(name + ".version", "expected " + std::to_string(measured_rates_version));
  std::vector<measured_rate> rates;
  for (const auto& item : detail::json_array(detail::json_field(document, "rates", name), name + ".rates")) {
    const std::string at = name + ".rates[" + std::to_string(rates.size()) + "]";
    const auto field = [&](std::string_view key) -> const nlohmann::json& { return detail::json_field(item, key, at); };
    measured_rate rate{detail::json_string(field("key"), at + ".key"),
                       detail::json_number(field("value"), at + ".value"),
                       static_cast<std::int64_t>(detail::json_unsigned(field("measured_at"), at + ".measured_at"))};
    if (!(rate.value > 0) || !std::isfinite(rate.value)) detail::raise_field(at + ".value", "expected a rate > 0");
    rates.push_back(std::move(rate));
  }
  return rates;
}

/// Written atomically: the old file or the new one, never half.
inline void save_measured_rates(const std::vector<measured_rate>& rates, const std::filesystem::path& file) {
  nlohmann::json items = nlohmann::json::array();
  for (const auto& r : rates)
    items.push_back({{"key", r.key}, {"value", r.value}, {"measured_at", static_cast<std::uint64_t>(r.measured_at)}});
  const nlohmann::json document = {
      {"format", measured_rates_format}, {"version", measured_rates_version}, {"rates", std::move(items)}};
  write_file_atomically(file, document.dump(1) + "\n");
}

}  // namespace chunkwise
