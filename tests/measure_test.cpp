#include <chunkwise/measure/cache.hpp>
#include <chunkwise/measure/host.hpp>
#include <chunkwise/measure/rate_cache.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <limits>
#include <thread>

using namespace chunkwise;

// A backend other than the host's (as cuda_backend is), whose measurement the test supplies: a described machine with
// 40 GiB of device memory, counted each time it runs.
struct other_backend {
  static constexpr const char* name = "other";
};
int other_measurements = 0;
template <>
machine_profile chunkwise::measure<other_backend>(const measure_options& /*options*/) {
  ++other_measurements;
  return describe_machine({.gpus = 1, .gpu_memory = 40 * GiB});
}

TEST_CASE("measuring the host gives a valid profile that the cache returns unchanged") {
  const auto dir = std::filesystem::temp_directory_path() / ("chunkwise_measure_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::string> lines;
  measure_options options{.nvme_directory = dir, .nvme_test_bytes = 32 * MiB, .nvme_test_seconds = 0.1, .ranks = 2};
  options.progress = [&](const std::string& line) { lines.push_back(line); };

  const auto measured = measure_or_load<host_backend>(dir / "cache", options);
  CHECK_NOTHROW(validate(measured));
  CHECK(measured.kind == device_kind::host);
  CHECK(measured.devices == 2);
  CHECK(measured.fingerprint.view().rfind("host-", 0) == 0);
  CHECK(measured.host_to_device_bytes_per_second > 1e8);
  CHECK(measured.nvme_read_bytes_per_second > 1e6);
  CHECK(measured.nvme_write_bytes_per_second > 1e6);
  // By block size: 1, 4, 16 and 64 MiB; the flat rates are the 16 MiB ones, and the cost model's lookups follow.
  REQUIRE(measured.nvme_read_by_block.count == 4);
  REQUIRE(measured.nvme_write_by_block.count == 4);
  CHECK(measured.nvme_read_by_block.points[0].message_bytes == 1 * MiB);
  CHECK(measured.nvme_write_by_block.points[3].message_bytes == 64 * MiB);
  CHECK(measured.nvme_read_by_block.points[2].bytes_per_second == measured.nvme_read_bytes_per_second);
  CHECK(nvme_write_rate(measured, 16 * MiB) == measured.nvme_write_bytes_per_second);
  CHECK(nvme_read_rate(measured, 1 * MiB) == measured.nvme_read_by_block.points[0].bytes_per_second);
  for (std::uint32_t i = 1; i < 4; ++i) {  // a larger block is never slower
    CHECK(measured.nvme_read_by_block.points[i].bytes_per_second >=
          measured.nvme_read_by_block.points[i - 1].bytes_per_second);
    CHECK(measured.nvme_write_by_block.points[i].bytes_per_second >=
          measured.nvme_write_by_block.points[i - 1].bytes_per_second);
  }
  CHECK(measured.nvme_capacity > 0);
  CHECK(measured.nvme_cpu_seconds_per_byte > 0);  // submitting and completing I/O costs the CPU something
  CHECK(measured.nvme_cpu_seconds_per_byte < 1e-8);  // and far less than 10 s per GB
  CHECK(measured.all_gather.count == 3);
  CHECK(measured.all_reduce.points[2].message_bytes == 64 * MiB);
  // the fixed cost of a call, measured: a thread handshake costs more than a microsecond and far less than 10 ms
  CHECK(measured.collective_latency_seconds > 1e-6);
  CHECK(measured.collective_latency_seconds < 1e-2);
  CHECK(measured.host_optimizer_params_per_second > 1e6);
  CHECK(measured.device_flops_per_second > 1e8);
  // One progress line per measurement, and the total.
  REQUIRE(lines.size() >= 7);
  CHECK(lines.front().find("memory:") == 0);
  CHECK(lines[2].find("NVMe (") == 0);

  lines.clear();
  options.ranks = 1;
  const auto cached = measure_or_load<host_backend>(dir / "cache", options);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("using the measured profile") == 0);
  CHECK(cached.devices == 1);
  CHECK(cached.device_memory == measured.device_memory * 2);  // the same machine, split over one rank
  CHECK(cached.all_gather.at(8 * MiB) == measured.all_gather.at(8 * MiB));
  CHECK(cached.collective_latency_seconds == measured.collective_latency_seconds);
  CHECK(cached.nvme_read_by_block.at(4 * MiB) == measured.nvme_read_by_block.at(4 * MiB));
  CHECK(cached.nvme_write_by_block.count == 4);
  CHECK(cached.fingerprint == measured.fingerprint);
  std::filesystem::remove_all(dir);
}

TEST_CASE("each backend's profile has its own cache file: a GPU run never plans with the host's profile") {
  const auto dir = std::filesystem::temp_directory_path() / ("chunkwise_measure_other_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // The host's profile is cached (as a CPU run on this machine leaves it): 2 GiB of emulated device memory.
  save_machine_profile(describe_machine({.gpus = 1, .gpu_memory = 2 * GiB}), detail::cache_file(dir, "machine"));
  measure_options options;
  options.progress = [](const std::string&) {};
  other_measurements = 0;
  const auto measured = measure_or_load<other_backend>(dir, options);
  CHECK(other_measurements == 1);  // measured, not the host's file
  CHECK(measured.device_memory == 40 * GiB);
  CHECK(std::filesystem::exists(dir / ("machine-other-" + detail::machine_fingerprint() + ".json")));
  const auto cached = measure_or_load<other_backend>(dir, options);
  CHECK(other_measurements == 1);  // its own file, read
  CHECK(cached.device_memory == 40 * GiB);
  CHECK(measure_or_load<host_backend>(dir, options).device_memory == 2 * GiB);  // the host's, untouched
  std::filesystem::remove_all(dir);
}

TEST_CASE("a run measures the collective cost per call for its own thread-rank count") {
  // 3 ranks: more than this CI machine's 2 cores, so they take turns; still a positive, bounded cost per call.
  const double three = measure_thread_collective_latency(3);
  CHECK(three > 1e-7);
  CHECK(three < 1e-1);
  CHECK(measure_thread_collective_latency(1) < 1e-2);  // one rank: no peer to wait for
}

TEST_CASE("an NVMe directory that does not exist fails before anything is measured there") {
  measure_options options{.nvme_directory = "/nonexistent/chunkwise", .nvme_test_bytes = 16 * MiB};
  options.progress = [](const std::string&) {};
  CHECK_THROWS_WITH_AS(measure<host_backend>(options), doctest::Contains("/nonexistent/chunkwise"), error);
}

namespace {
struct rate_cache_dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("chunkwise_rate_cache_test_" + std::to_string(::getpid()));
  rate_cache_dir() { std::filesystem::remove_all(path); }
  ~rate_cache_dir() { std::filesystem::remove_all(path); }
};
}  // namespace

TEST_CASE("a program's own rate is measured once per key and machine, then read from beside the machine profile") {
  rate_cache_dir dir;
  int measured = 0;
  const auto measure = [&](double value) {
    return [&measured, value] {
      ++measured;
      return value;
    };
  };
  std::vector<std::string> lines;
  rate_cache_options options;
  options.progress = [&](const std::string& line) { lines.push_back(line); };

  const auto first = measure_or_load_rate(dir.path, "passes fp32 2x128", measure(1.5e9), options);
  CHECK(measured == 1);
  CHECK(first.measured_now);
  CHECK(first.value == 1.5e9);
  CHECK(first.file == dir.path / ("rates-" + detail::machine_fingerprint() + ".json"));  // the file's name
  CHECK(std::filesystem::exists(first.file));
  const auto again = measure_or_load_rate(dir.path, "passes fp32 2x128", measure(9.0), options);
  CHECK(measured == 1);  // read, not measured
  CHECK_FALSE(again.measured_now);
  CHECK(again.value == 1.5e9);
  CHECK(again.measured_at == first.measured_at);
  // Another key (another shape, dtype, rank count or build) has its own entry; the first one stays.
  CHECK(measure_or_load_rate(dir.path, "passes bf16 2x128", measure(2.5e9), options).value == 2.5e9);
  CHECK(measured == 2);
  CHECK(measure_or_load_rate(dir.path, "passes fp32 2x128", measure(9.0), options).value == 1.5e9);
  // measure_again replaces the entry.
  options.measure_again = true;
  CHECK(measure_or_load_rate(dir.path, "passes fp32 2x128", measure(1.25e9), options).value == 1.25e9);
  CHECK(measured == 3);
  options.measure_again = false;
  CHECK(measure_or_load_rate(dir.path, "passes fp32 2x128", measure(9.0), options).value == 1.25e9);
  CHECK(measure_or_load_rate(dir.path, "passes bf16 2x128", measure(9.0), options).value == 2.5e9);
  CHECK(measured == 3);
  CHECK(lines.empty());

  // `keep` bounds the file: the newest entries stay.
  options.keep = 2;
  CHECK(measure_or_load_rate(dir.path, "passes fp16 2x128", measure(3.5e9), options).value == 3.5e9);
  CHECK(measured == 4);
  CHECK(measure_or_load_rate(dir.path, "passes fp16 2x128", measure(9.0), options).value == 3.5e9);
  CHECK(measured == 4);
  const double kept_fp32 = measure_or_load_rate(dir.path, "passes fp32 2x128", measure(7.0), options).value;
  const double kept_bf16 = measure_or_load_rate(dir.path, "passes bf16 2x128", measure(7.0), options).value;
  CHECK(measured == 5);  // one of the two older entries was dropped (the same second: either), then measured again
  CHECK((kept_fp32 == 7.0) != (kept_bf16 == 7.0));

  CHECK(program_build_stamp() != "unknown");
  CHECK(program_build_stamp() == program_build_stamp());
}

TEST_CASE("programs sharing a rate cache lose no entry and measure a key once") {
  rate_cache_dir dir;
  rate_cache_options options;
  options.progress = [](const std::string& line) { FAIL("unexpected progress: " << line); };
  std::atomic<int> measured{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w)
    writers.emplace_back([&, w] {
      for (int k = 0; k < 5; ++k) {
        // Each writer its own keys, and all of them one shared key: measured by whichever comes first.
        (void)measure_or_load_rate(dir.path, "writer " + std::to_string(w) + " key " + std::to_string(k), [&] {
          ++measured;
          return 1.0 + w * 10 + k;
        }, options);
        (void)measure_or_load_rate(dir.path, "shared", [&] { return ++measured, 99.0; }, options);
      }
    });
  for (auto& t : writers) t.join();
  CHECK(measured == 21);
  for (int w = 0; w < 4; ++w)
    for (int k = 0; k < 5; ++k)
      CHECK(measure_or_load_rate(dir.path, "writer " + std::to_string(w) + " key " + std::to_string(k),
                                 [] { return -1.0; }, options).value == 1.0 + w * 10 + k);
  CHECK(load_measured_rates(detail::cache_file(dir.path, "rates")).size() == 21);
}

TEST_CASE("a rate cache that cannot be locked or written is read; what is measured then is used, not cached") {
  rate_cache_dir dir;
  std::vector<std::string> lines;
  rate_cache_options options;
  options.progress = [&](const std::string& line) { lines.push_back(line); };
  CHECK(measure_or_load_rate(dir.path, "kept", [] { return 3.0e9; }, options).value == 3.0e9);
  const auto file = detail::cache_file(dir.path, "rates");
  // The lock cannot be opened (a directory in its place: refused even to root, as CI runs).
  std::filesystem::remove(file.string() + ".lock");
  std::filesystem::create_directory(file.string() + ".lock");
  const auto kept = measure_or_load_rate(dir.path, "kept", [] { return 9.0; }, options);
  CHECK_FALSE(kept.measured_now);
  CHECK(kept.value == 3.0e9);
  CHECK(lines.empty());
  const auto fresh = measure_or_load_rate(dir.path, "new", [] { return 5.0e9; }, options);
  CHECK(fresh.measured_now);
  CHECK(fresh.value == 5.0e9);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("the rate measured now is used but not cached: cannot write the rate cache in " +
                      dir.path.string()) == 0);
  CHECK(lines[0].find(".lock") != std::string::npos);  // says what failed
  REQUIRE(load_measured_rates(file).size() == 1);  // the file as it was
  CHECK(load_measured_rates(file)[0].key == "kept");
  // A directory that cannot be made: measured, used, reported.
  lines.clear();
  const auto nowhere = measure_or_load_rate("/proc/self/no_such_cache", "new", [] { return 6.0e9; }, options);
  CHECK(nowhere.value == 6.0e9);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("the rate measured now is used but not cached") == 0);
  // An observation there is not cached either, and says so as an observation.
  lines.clear();
  CHECK(keep_rate(dir.path, "seen", 1.5, options).value == 1.5);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("the rate observed now is not cached: cannot write the rate cache in ") == 0);
  CHECK(load_measured_rates(file).size() == 1);
}

TEST_CASE("an observed rate is kept for the next run, read without measuring, and replaced by the next observation") {
  rate_cache_dir dir;
  std::vector<std::string> lines;
  rate_cache_options options;
  options.progress = [&](const std::string& line) { lines.push_back(line); };
  CHECK_FALSE(cached_rate_of(dir.path, "drive speed", options).has_value());  // nothing yet, no file needed
  const auto kept = keep_rate(dir.path, "drive speed", 1.42, options);
  CHECK(kept.measured_now);
  CHECK(kept.file == detail::cache_file(dir.path, "rates"));
  const auto read = cached_rate_of(dir.path, "drive speed", options);
  REQUIRE(read.has_value());
  CHECK_FALSE(read->measured_now);
  CHECK(read->value == 1.42);
  CHECK(read->measured_at == kept.measured_at);
  // The measured rates beside it stay; the next observation replaces this one.
  CHECK(measure_or_load_rate(dir.path, "passes", [] { return 2.0e9; }, options).value == 2.0e9);
  CHECK(keep_rate(dir.path, "drive speed", 0.8, options).value == 0.8);
  CHECK(cached_rate_of(dir.path, "drive speed", options)->value == 0.8);
  CHECK(cached_rate_of(dir.path, "passes", options)->value == 2.0e9);
  CHECK(load_measured_rates(kept.file).size() == 2);
  CHECK(lines.empty());
  for (const double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(keep_rate(dir.path, "drive speed", bad, options),
                         doctest::Contains("keep_rate: the observation of 'drive speed' gave"), error);
  }
  CHECK(cached_rate_of(dir.path, "drive speed", options)->value == 0.8);  // a bad observation kept nothing
  CHECK_THROWS_WITH_AS(keep_rate(dir.path, "", 1.0, options), doctest::Contains("the key is empty"), error);
  // An unreadable file reads as empty, said once; the next observation replaces it.
  std::ofstream(kept.file) << "{\"format\": \"other\"}";
  CHECK_FALSE(cached_rate_of(dir.path, "drive speed", options).has_value());
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("the cached rates are unreadable") == 0);
  CHECK(keep_rate(dir.path, "drive speed", 1.1, options).value == 1.1);
  CHECK(cached_rate_of(dir.path, "drive speed", options)->value == 1.1);
}

TEST_CASE("an unreadable rate cache is reported, measured over and replaced; a bad measurement is never cached") {
  rate_cache_dir dir;
  std::vector<std::string> lines;
  rate_cache_options options;
  options.progress = [&](const std::string& line) { lines.push_back(line); };
  const auto file = detail::cache_file(dir.path, "rates");
  std::filesystem::create_directories(dir.path);
  for (const char* broken : {"{\"format\": \"chunkwise.measured_rates\", \"version\": 1, \"rates\": [",  // cut short
                             "{\"format\": \"other\", \"version\": 1, \"rates\": []}",
                             "{\"format\": \"chunkwise.measured_rates\", \"version\": 1, \"rates\": "
                             "[{\"key\": \"k\", \"value\": -1, \"measured_at\": 5}]}"}) {
    CAPTURE(broken);
    std::ofstream(file) << broken;
    lines.clear();
    const auto rate = measure_or_load_rate(dir.path, "k", [] { return 4.0e9; }, options);
    CHECK(rate.measured_now);
    CHECK(rate.value == 4.0e9);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("the cached rates are unreadable; none is trusted, the file is replaced") == 0);
    CHECK(lines[0].find(file.string()) != std::string::npos);  // names the file
    lines.clear();
    CHECK_FALSE(measure_or_load_rate(dir.path, "k", [] { return 1.0; }, options).measured_now);  // replaced
    CHECK(lines.empty());
  }
  for (const double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(measure_or_load_rate(dir.path, "bad", [bad] { return bad; }, options),
                         doctest::Contains("the measurement of 'bad' gave"), error);
    int measured = 0;
    CHECK(measure_or_load_rate(dir.path, "bad", [&measured] { return ++measured, 2.0; }, options).value == 2.0);
    CHECK(measured == 1);  // the bad value was not kept
    options.measure_again = true;  // and the next round's bad value is measured, not read
    CHECK_THROWS_AS(measure_or_load_rate(dir.path, "bad", [bad] { return bad; }, options), error);
    options.measure_again = false;
    CHECK(measure_or_load_rate(dir.path, "bad", [] { return 9.0; }, options).value == 2.0);  // still the good one
    std::filesystem::remove(file);
  }
  CHECK_THROWS_WITH_AS(measure_or_load_rate(dir.path, "", [] { return 1.0; }, options),
                       doctest::Contains("the key is empty"), error);
}
