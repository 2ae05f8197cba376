#pragma once
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>

#include <cctype>
#include <cstdlib>
#include <exception>
#include <string>

namespace chunkwise {

inline byte_count parse_bytes(const std::string& text) {
  const auto fail = [&] {
    detail::raise(error_code::invalid_argument,
                  "'" + text + "' is not a byte size; write a number with an optional unit such as 512MiB, 24GiB or 3GB");
  };
  std::size_t pos = 0;
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  const std::size_t number_begin = pos;
  while (pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) ++pos;
  if (pos == number_begin) fail();
  // The whole number must parse: strtod stops quietly at a second '.' ("1.2.3GiB") or takes "." as 0.
  const std::string number = text.substr(number_begin, pos - number_begin);
  char* number_end = nullptr;
  const double value = std::strtod(number.c_str(), &number_end);
  if (number_end != number.c_str() + number.size()) fail();
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  std::string unit = text.substr(pos);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  struct unit_scale { const char* name; double scale; };
  constexpr unit_scale units[] = {
      {"", 1.0},         {"b", 1.0},        {"kib", 0x1p10},  {"mib", 0x1p20},  {"gib", 0x1p30},  {"tib", 0x1p40},
      {"k", 0x1p10},     {"m", 0x1p20},     {"g", 0x1p30},    {"t", 0x1p40},    {"kb", 1e3},       {"mb", 1e6},
      {"gb", 1e9},       {"tb", 1e12}};
  for (const auto& u : units) {
    if (unit == u.name) {
      const double bytes = value * u.scale;
      if (!(bytes >= 0.0) || bytes > 1.8e19) fail();
      return static_cast<byte_count>(bytes + 0.5);
    }
  }
  fail();
  return 0;
}

inline std::uint64_t parse_count(const std::string& text, const std::string& what) {
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || text[0] == '-' || text[0] == '+' || std::isspace(static_cast<unsigned char>(text[0])))
    detail::raise(error_code::invalid_argument, what + " expects a non-negative integer, got '" + text + "'");
  return value;
}

}  // namespace chunkwise
