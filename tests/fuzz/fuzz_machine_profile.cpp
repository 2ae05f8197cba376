// libFuzzer target: bytes -> JSON -> machine_profile_from_json. Every input must either load or throw
// chunkwise::error; a loaded machine must pass validate(), survive to_json -> text -> load unchanged, and give
// finite, positive collective bandwidths at every message size.
#include "fuzz_support.hpp"

#include <chunkwise/profile/machine_json.hpp>
#include <chunkwise/profile/machine_profile.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using chunkwise::fuzz::fail;

bool same_curve(const chunkwise::bandwidth_curve& a, const chunkwise::bandwidth_curve& b) {
  if (a.count != b.count) return false;
  for (std::uint32_t i = 0; i < a.count; ++i)
    if (a.points[i].message_bytes != b.points[i].message_bytes ||
        a.points[i].bytes_per_second != b.points[i].bytes_per_second)
      return false;
  return true;
}

void check_equal(const chunkwise::machine_profile& a, const chunkwise::machine_profile& b) {
  CHUNKWISE_FUZZ_CHECK(a.name == b.name && a.fingerprint == b.fingerprint && a.kind == b.kind, "identity differs");
  CHUNKWISE_FUZZ_CHECK(a.devices == b.devices && a.device_memory == b.device_memory &&
                           a.host_memory == b.host_memory && a.nvme_capacity == b.nvme_capacity,
                       "capacities differ after the round trip");
  CHUNKWISE_FUZZ_CHECK(a.host_to_device_bytes_per_second == b.host_to_device_bytes_per_second &&
                           a.device_to_host_bytes_per_second == b.device_to_host_bytes_per_second &&
                           a.nvme_read_bytes_per_second == b.nvme_read_bytes_per_second &&
                           a.nvme_write_bytes_per_second == b.nvme_write_bytes_per_second,
                       "bandwidths differ after the round trip");
  CHUNKWISE_FUZZ_CHECK(same_curve(a.all_gather, b.all_gather) && same_curve(a.reduce_scatter, b.reduce_scatter) &&
                           same_curve(a.all_reduce, b.all_reduce),
                       "collective curves differ after the round trip");
  CHUNKWISE_FUZZ_CHECK(a.collective_latency_seconds == b.collective_latency_seconds &&
                           a.device_optimizer_params_per_second == b.device_optimizer_params_per_second &&
                           a.host_optimizer_params_per_second == b.host_optimizer_params_per_second &&
                           a.device_flops_per_second == b.device_flops_per_second,
                       "rates differ after the round trip");
}

void check_curve(const chunkwise::bandwidth_curve& curve, const char* which) {
  using chunkwise::byte_count;
  if (curve.count == 0) return;
  // At, between and beyond the measured sizes, including the extremes of byte_count.
  std::vector<byte_count> sizes{0, 1, ~byte_count{0}};
  for (std::uint32_t i = 0; i < curve.count; ++i) {
    const byte_count m = curve.points[i].message_bytes;
    sizes.push_back(m);
    if (m > 0) sizes.push_back(m - 1);
    if (m < ~byte_count{0}) sizes.push_back(m + 1);
    if (i > 0) sizes.push_back(curve.points[i - 1].message_bytes + (m - curve.points[i - 1].message_bytes) / 2);
  }
  for (const byte_count m : sizes) {
    const double value = curve.at(m);
    CHUNKWISE_FUZZ_CHECK(std::isfinite(value) && value > 0,
                         std::string(which) + ".at(" + std::to_string(m) + ") = " + std::to_string(value));
  }
  // Exact at the measured sizes, and between the neighbours' values in between.
  for (std::uint32_t i = 0; i < curve.count; ++i) {
    const auto& b = curve.points[i];
    CHUNKWISE_FUZZ_CHECK(curve.at(b.message_bytes) == b.bytes_per_second,
                         std::string(which) + ": not exact at measured size " + std::to_string(b.message_bytes));
    if (i == 0) continue;
    const auto& a = curve.points[i - 1];
    const double mid = curve.at(a.message_bytes + (b.message_bytes - a.message_bytes) / 2);
    CHUNKWISE_FUZZ_CHECK(mid >= std::min(a.bytes_per_second, b.bytes_per_second) &&
                             mid <= std::max(a.bytes_per_second, b.bytes_per_second),
                         std::string(which) + ": interpolation leaves its segment");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chunkwise;
  const auto document = fuzz::parse({reinterpret_cast<const char*>(data), size});
  if (!document) return 0;

  machine_profile machine;
  if (!fuzz::accepted([&] { machine = machine_profile_from_json(*document); }, "machine_profile_from_json"))
    return 0;

  if (!fuzz::accepted([&] { validate(machine); }, "validate"))
    fail("a loaded machine profile does not pass validate()");
  check_curve(machine.all_gather, "all_gather");
  check_curve(machine.reduce_scatter, "reduce_scatter");
  check_curve(machine.all_reduce, "all_reduce");

  std::string text;
  if (!fuzz::accepted([&] { text = to_json(machine).dump(1); }, "to_json"))
    fail("to_json of a loaded machine threw");
  const auto reparsed = fuzz::parse(text);
  if (!reparsed) fail("to_json wrote text that does not parse: " + text.substr(0, 200));
  machine_profile again;
  if (!fuzz::accepted([&] { again = machine_profile_from_json(*reparsed); }, "reload"))
    fail("a saved machine profile does not load again");
  check_equal(machine, again);
  return 0;
}
