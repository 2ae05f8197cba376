#include <chunkwise/measure/cache.hpp>
#include <chunkwise/measure/host.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

using namespace chunkwise;

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
