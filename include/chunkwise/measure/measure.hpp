#pragma once
// measure<Backend>(): the machine profile from microbenchmarks on this machine, each announced by a progress line;
// measure_or_load() (measure/cache.hpp, the json component) keeps the result in a JSON cache keyed by a machine
// fingerprint. The backends' measurements are
// specialisations in measure/host.hpp and measure/cuda/measure.cuh. The measure part sits above the parts it
// measures (tiers, communicators, optimizers); nothing below it includes it.
#include <chunkwise/core/abi.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/hash.hpp>
#include <chunkwise/profile/machine_profile.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>

namespace chunkwise::inline CHUNKWISE_ABI {

struct measure_options {
  std::filesystem::path nvme_directory = std::filesystem::temp_directory_path();  // "" = no NVMe store
  byte_count nvme_test_bytes = 256 * MiB;
  double nvme_test_seconds = 0.6;  // each of the NVMe write and read measurements, at least (and one pass)
  byte_count device_memory = 0;  // host backend: the device budget per rank; 0 = half of the available memory / ranks
  std::uint32_t ranks = 1;
  unsigned threads = 0;          // 0 = every core
  std::function<void(const std::string&)> progress = [](const std::string& line) {
    std::fprintf(stderr, "measure: %s\n", line.c_str());
  };
};

}  // namespace chunkwise

namespace chunkwise::detail::inline CHUNKWISE_ABI {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Runs `body` until at least `min_seconds` passed (and at least once); returns seconds per call, the best of
/// three batches (noise on a shared machine only ever adds time).
template <class F>
double time_per_call(F&& body, double min_seconds = 0.15) {
  double best = 1e300;
  for (int batch = 0; batch < 3; ++batch) {
    int calls = 0;
    const auto start = std::chrono::steady_clock::now();
    do {
      body();
      ++calls;
    } while (seconds_since(start) < min_seconds / 3);
    best = std::min(best, seconds_since(start) / calls);
  }
  return best;
}

/// "2.95 GB/s" (decimal units, as bandwidths are quoted).
inline std::string format_rate(double per_second, const char* unit = "B/s") {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int p = 0;
  while (per_second >= 1000.0 && p < 5) {
    per_second /= 1000.0;
    ++p;
  }
  char text[40];
  std::snprintf(text, sizeof text, "%.2f %s%s", per_second, prefixes[p], unit);
  return text;
}

inline byte_count meminfo_bytes(const char* key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  std::uint64_t kib = 0;
  std::string unit;
  while (in >> name >> kib >> unit)
    if (name == std::string(key) + ":") return kib * KiB;
  return 0;
}

/// Raised whenever a measurement's method changes, so that a cached profile measured the old way is measured again
/// (2: the NVMe store's steady overwrite and read rates, not one cold pass; 3: and by block size; 4: never lower
/// for a larger block; 5: thread_comm's waits poll before they sleep, a collective call's cost a sixth of before).
inline constexpr int measurement_revision = 5;

/// A stable name for this machine and how it is measured: CPU model, core count, total memory, the revision.
inline std::string machine_fingerprint() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown-cpu";
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  const std::string description = model + "|" + std::to_string(std::thread::hardware_concurrency()) + "|" +
                                  std::to_string(meminfo_bytes("MemTotal") / GiB) + "|" +
                                  std::to_string(measurement_revision);
  const std::uint64_t hash = fnv1a().add(description).value();
  char text[24];
  std::snprintf(text, sizeof text, "host-%016llx", static_cast<unsigned long long>(hash));
  return text;
}

/// A cache file of this machine's: `directory`/<what>-<fingerprint>.json ("machine": its profile; "rates": the
/// rates programs measured on it).
inline std::filesystem::path cache_file(const std::filesystem::path& directory, std::string_view what) {
  return directory / (std::string(what) + "-" + machine_fingerprint() + ".json");
}

/// The end of every backend's measurement: says how long it took, and validates what was measured.
inline machine_profile finish_measurement(const measure_options& options, machine_profile m,
                                          std::chrono::steady_clock::time_point start) {
  char done[48];
  std::snprintf(done, sizeof done, "done in %.1f s", seconds_since(start));
  options.progress(done);
  validate(m);
  return m;
}

}  // namespace chunkwise::detail

namespace chunkwise::inline CHUNKWISE_ABI {

template <class Backend>
machine_profile measure(const measure_options& options = {});

}  // namespace chunkwise
