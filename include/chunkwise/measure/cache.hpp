#pragma once
// measure_or_load<Backend>(): a machine profile measured once per machine and backend and kept as JSON in a cache
// directory, keyed by the machine's fingerprint (a GPU machine keeps two: the host backend's, which CPU runs plan
// with, and the CUDA backend's, which runs whose chunks live on the GPU plan with). Needs nlohmann_json: link
// chunkwise::json (CMake), which also makes <chunkwise/measure.hpp> include this header.
#include <chunkwise/core/abi.hpp>
#include <chunkwise/measure/measure.hpp>
#include <chunkwise/profile/machine_json.hpp>
#include <chunkwise/profile/machine_profile.hpp>

#include <filesystem>
#include <string>
#include <string_view>

namespace chunkwise::detail::inline CHUNKWISE_ABI {

/// The cache file's name of Backend's profile: "machine" for the host backend's (as ever), "machine-<backend>" for
/// another's.
template <class Backend>
std::string machine_cache_name() {
  const std::string_view name = Backend::name;
  return name == "host" ? std::string("machine") : "machine-" + std::string(name);
}

}  // namespace chunkwise::detail

namespace chunkwise::inline CHUNKWISE_ABI {

/// The cached profile of this machine and Backend (`cache_directory`/machine-<fingerprint>.json for the host
/// backend, machine-<backend>-<fingerprint>.json for another) if there is one, else a fresh measurement, saved there
/// atomically.
template <class Backend>
machine_profile measure_or_load(const std::filesystem::path& cache_directory, const measure_options& options = {}) {
  const auto file = detail::cache_file(cache_directory, detail::machine_cache_name<Backend>());
  if (std::filesystem::exists(file)) {
    auto cached = load_machine_profile(file);
    // The cache holds the machine; how it is used (ranks, the device budget) is this run's.
    const byte_count per_rank_total = cached.device_memory * cached.devices;
    cached.devices = options.ranks;
    cached.device_memory = options.device_memory != 0 ? options.device_memory : per_rank_total / options.ranks;
    options.progress("using the measured profile " + file.string());
    return cached;
  }
  // The cache keeps what the machine has (its own device memory), never this run's budget: a later run without a
  // budget must not inherit it.
  measure_options machine_only = options;
  machine_only.device_memory = 0;
  auto measured = measure<Backend>(machine_only);
  std::filesystem::create_directories(cache_directory);
  save_machine_profile(measured, file);
  options.progress("saved " + file.string());
  if (options.device_memory != 0) measured.device_memory = options.device_memory;
  return measured;
}

}  // namespace chunkwise
