#pragma once
// Typed field access on nlohmann::json with errors that name the field's path ("profile.tensors[3].elements").
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/tensor_spec.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace chunkwise::detail {

inline std::string json_type_name(const nlohmann::json& value) {
  if (value.is_number_unsigned()) return "unsigned integer";
  if (value.is_number_integer()) return value.get<std::int64_t>() < 0 ? "negative integer" : "integer";
  if (value.is_number_float()) return "fractional number";
  return value.type_name();
}

[[noreturn]] inline void raise_field(const std::string& path, const std::string& what) {
  raise(error_code::parse_error, path + ": " + what);
}

inline const nlohmann::json& json_field(const nlohmann::json& object, std::string_view key, const std::string& path) {
  if (!object.is_object()) raise_field(path, "expected an object, found " + json_type_name(object));
  const auto it = object.find(key);
  if (it == object.end()) raise_field(path + "." + std::string(key), "missing field");
  return *it;
}

inline std::uint64_t json_unsigned(const nlohmann::json& value, const std::string& path) {
  // Parsed text gives non-negative integers as unsigned; documents built in code may hold them as signed.
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer() && value.get<std::int64_t>() >= 0)
    return static_cast<std::uint64_t>(value.get<std::int64_t>());
  raise_field(path, "expected an unsigned integer, found " + json_type_name(value));
}

inline double json_number(const nlohmann::json& value, const std::string& path) {
  if (!value.is_number()) raise_field(path, "expected a number, found " + json_type_name(value));
  return value.get<double>();
}

inline std::string json_string(const nlohmann::json& value, const std::string& path) {
  if (!value.is_string()) raise_field(path, "expected a string, found " + json_type_name(value));
  return value.get<std::string>();
}

inline bool json_bool(const nlohmann::json& value, const std::string& path) {
  if (!value.is_boolean()) raise_field(path, "expected true or false, found " + json_type_name(value));
  return value.get<bool>();
}

/// A string field that names something (a tensor, a pass, a machine): at most tensor_name::capacity characters.
inline tensor_name json_name(const nlohmann::json& value, const std::string& path) {
  const std::string text = json_string(value, path);
  if (text.size() > tensor_name::capacity)
    raise_field(path, "name has " + std::to_string(text.size()) + " characters; at most " +
                          std::to_string(tensor_name::capacity) + " fit");
  return tensor_name(text);
}

inline const nlohmann::json& json_array(const nlohmann::json& value, const std::string& path) {
  if (!value.is_array()) raise_field(path, "expected an array, found " + json_type_name(value));
  return value;
}

inline nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number beyond double's range ("1e400") throws out_of_range (406) from the parser.
    raise(error_code::parse_error, source + " is not valid JSON: " + e.what());
  }
}

/// The JSON document in `file`; errors name the file.
inline nlohmann::json parse_json_file(const std::filesystem::path& file) {
  std::string quoted = "'";  // built by appending: GCC 12 warns falsely (-Wrestrict) on "'" + std::string
  quoted += file.string();
  quoted += "'";
  return parse_json_text(read_file(file), quoted);
}

}  // namespace chunkwise::detail
