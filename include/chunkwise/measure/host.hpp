#pragma once
// measure<host_backend>(): the machine profile of this machine on the host backend, about 10 s in all by default.
//
// Host backend (the "device" is a host-memory budget, ranks are threads):
//   capacities      MemAvailable (/proc/meminfo), free space of the NVMe store's file system (statvfs)
//   host<->device   memcpy bandwidth of chunk-sized buffers: what the host backend's copy worker does
//   NVMe            steady overwrite and read rates of a store through the NVMe tier (io_uring or the thread pool)
//   collectives     thread_comm all-gather, reduce-scatter, all-reduce bus bandwidth at 1 to 64 MiB, 2 ranks, and
//                   the fixed cost of one call (one-float all-reduces from long-lived rank threads)
//   optimizer       the SIMD CPU AdamW over 16 M fp32 parameters, every core
//   compute         a cache-blocked fp32 GEMM (512^3), every core
#include <chunkwise/core/abi.hpp>
#include <chunkwise/backend/host.hpp>
#include <chunkwise/comm/thread_comm.hpp>
#include <chunkwise/core/atomic_file.hpp>  // detail::raise_io
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/measure/measure.hpp>
#include <chunkwise/optim/cpu_adam.hpp>
#include <chunkwise/profile/machine_profile.hpp>
#include <chunkwise/tier/nvme.hpp>

#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <span>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace chunkwise::detail::inline CHUNKWISE_ABI {

/// C += A * B for n x n row-major fp32 matrices, blocked for the cache and split by rows over `threads`.
inline void blocked_gemm(const float* a, const float* b, float* c, std::size_t n, unsigned threads) {
  constexpr std::size_t block = 64;
  const auto rows = [&](std::size_t row_begin, std::size_t row_end) {
    for (std::size_t kk = 0; kk < n; kk += block)
      for (std::size_t jj = 0; jj < n; jj += block)
        for (std::size_t i = row_begin; i < row_end; ++i)
          for (std::size_t k = kk, k_end = std::min(kk + block, n); k < k_end; ++k) {
            const float aik = a[i * n + k];
            float* __restrict crow = c + i * n;
            const float* __restrict brow = b + k * n;
            const std::size_t j_end = std::min(jj + block, n);
            for (std::size_t j = jj; j < j_end; ++j) crow[j] += aik * brow[j];
          }
  };
  std::vector<std::thread> workers;
  const std::size_t per = div_ceil(n, threads);
  for (unsigned t = 1; t < threads; ++t)
    workers.emplace_back(rows, std::min(n, t * per), std::min(n, (t + 1) * per));
  rows(0, std::min(n, per));
  for (auto& w : workers) w.join();
}

/// User and system CPU seconds this process has used so far.
inline double process_cpu_seconds() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

/// NVMe capacity and bandwidth through the NVMe tier, measured as the runtime drives the drive, for blocks of 1, 4,
/// 16 and 64 MiB (each chunk's blocks move whole, one call each; a small block keeps fewer requests in flight: 1 MiB
/// blocks ran at 0.65x the reads and 0.7x the writes of 16 MiB ones here, and an NVMe plan of 1 MiB chunks ran its
/// drive at 0.6x the 16 MiB rates). For each size a store of `nvme_test_bytes` is written once untimed (a new file's
/// extents are converted on their first write; the runtime's homes are written once and then overwritten every
/// step), then overwritten and read back block after block, each for at least `nvme_test_seconds` and one whole
/// pass (a single cold pass measured about half of what a run sustains), and taken as at least the smaller block's.
/// The flat rates are the 16 MiB ones. Also the CPU time per byte.
inline void measure_nvme(const measure_options& options, machine_profile& m) {
  using clock = std::chrono::steady_clock;
  if (options.nvme_directory.empty()) return;
  struct statvfs fs {};
  if (::statvfs(options.nvme_directory.c_str(), &fs) != 0) raise_io("statvfs", options.nvme_directory, errno);
  m.nvme_capacity = static_cast<byte_count>(fs.f_bavail) * fs.f_frsize;
  byte_count moved = 0;
  std::string store_description;
  const double cpu_before = process_cpu_seconds();
  for (const byte_count block : {1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB}) {
    const std::size_t blocks = static_cast<std::size_t>(std::max<byte_count>(1, options.nvme_test_bytes / block));
    nvme_tier store({.directory = options.nvme_directory, .capacity = blocks * block, .block_bytes = block});
    const std::unique_ptr<char, decltype(&std::free)> memory(
        static_cast<char*>(std::aligned_alloc(nvme_tier::io_alignment, block)), &std::free);
    if (memory == nullptr) raise(error_code::out_of_memory, "measure: no memory for an NVMe test buffer");
    char* const buffer = memory.get();
    std::memset(buffer, 7, block);
    std::vector<nvme_block> handles;
    for (std::size_t i = 0; i < blocks; ++i) handles.push_back(store.allocate_sync(block));
    for (const auto h : handles) store.write(h, buffer, block);
    // Bytes per second of `io` on block after block, for at least the test time and one pass over the store.
    const auto rate = [&](auto io) {
      const auto start = clock::now();
      std::size_t done = 0;
      while (done < blocks || seconds_since(start) < options.nvme_test_seconds) io(handles[done++ % blocks]);
      moved += done * block;
      return static_cast<double>(done * block) / seconds_since(start);
    };
    // A larger block is never slower (it keeps at least as many requests in flight): a point measured below the
    // one before it is the virtual disk's noise (this VM: 64 MiB reads once at 1.06 GB/s after 1.36 at 16 MiB, and
    // 1.4-1.5 GB/s at 157 MiB in other runs), so each point is at least the one before: what the curve so far gives
    // at this larger block (its last point; 0 while empty).
    const double write = rate([&](nvme_block h) { store.write(h, buffer, block); });
    m.nvme_write_by_block.add(block, std::max(write, m.nvme_write_by_block.at(block)));
    const double read = rate([&](nvme_block h) { store.read(h, buffer, block); });
    m.nvme_read_by_block.add(block, std::max(read, m.nvme_read_by_block.at(block)));
    for (const auto h : handles) store.deallocate_sync(h);
    if (block == 16 * MiB) store_description = store.describe();
  }
  m.nvme_read_bytes_per_second = m.nvme_read_by_block.at(16 * MiB);
  m.nvme_write_bytes_per_second = m.nvme_write_by_block.at(16 * MiB);
  // Nothing else runs in this process meanwhile: its CPU time is the I/O's (submission, completion, the kernel's
  // block layer and, on a virtual disk, its driver).
  m.nvme_cpu_seconds_per_byte = (process_cpu_seconds() - cpu_before) / static_cast<double>(moved);
  std::string by_block;
  for (std::uint32_t i = 0; i < m.nvme_read_by_block.count; ++i)
    by_block += (i == 0 ? "" : ", ") + format_bytes(m.nvme_read_by_block.points[i].message_bytes) + " " +
                format_rate(m.nvme_read_by_block.points[i].bytes_per_second) + " / " +
                format_rate(m.nvme_write_by_block.points[i].bytes_per_second);
  options.progress("NVMe (" + store_description + "): read " + format_rate(m.nvme_read_bytes_per_second) +
                   ", write " + format_rate(m.nvme_write_bytes_per_second) + "; by block, read / write: " + by_block +
                   "; " + std::to_string(static_cast<int>(m.nvme_cpu_seconds_per_byte * 1e12 + 0.5)) +
                   " ms of CPU per GB");
}

/// The fixed cost of one collective call among `world`'s ranks: every rank all-reduces one float `calls` times, from
/// long-lived threads as the runtime's ranks call (no thread start inside the timing); the median of 5 rounds, each
/// the slowest rank's time per call. What the cost model charges every chunk's collective besides its bytes. Ranks
/// outnumbering the cores wait for each other's turn on a core, and this measures that too (a median, not the
/// fastest round: the turns are the cost).
inline double measure_collective_latency(const thread_world& world, int calls = 100) {
  std::vector<double> rounds;
  for (int round = 0; round < 5; ++round) {
    std::vector<double> seconds(static_cast<std::size_t>(world.size()), 0.0);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world.size(); ++r)
      ranks.emplace_back([&, r] {
        auto comm = world.comm(r);
        float in[2] = {1.0f, 1.0f}, out[2] = {0.0f, 0.0f};
        const auto all_reduce = [&](int i) {
          return comm.all_reduce(std::span<const float>(&in[i % 2], 1), std::span<float>(&out[i % 2], 1),
                                 reduce_op::sum);
        };
        all_reduce(0).wait();  // every rank is running before the clock starts
        const auto start = std::chrono::steady_clock::now();
        // Two in flight, as the runtime's prefetched gathers and pending reductions are.
        auto previous = all_reduce(0);
        for (int i = 1; i < calls; ++i) {
          auto next = all_reduce(i);
          previous.wait();
          previous = std::move(next);
        }
        previous.wait();
        seconds[static_cast<std::size_t>(r)] = seconds_since(start) / calls;
      });
    for (auto& t : ranks) t.join();
    rounds.push_back(*std::max_element(seconds.begin(), seconds.end()));
  }
  std::nth_element(rounds.begin(), rounds.begin() + 2, rounds.end());
  return rounds[2];
}

/// The SIMD CPU AdamW over 16 M fp32 parameters on `threads` threads, in parameters per second.
inline double measure_cpu_adam(const measure_options& options, unsigned threads) {
  {
    const std::size_t n = 16u << 20;
    std::vector<float> master(n, 0.5f), grad(n, 0.01f), m1(n, 0.0f), m2(n, 0.0f);
    optim::cpu_adam adam(optim::adamw_config(), {.threads = threads});
    const optim::chunk_arrays chunk{master.data(), grad.data(), dtype::fp32, m1.data(), m2.data(), nullptr, dtype::fp32, n};
    std::uint64_t step = 0;
    const double s = time_per_call([&] { adam.step(chunk, {.lr = 1e-4f, .step = ++step}); }, 0.3);
    const double rate = static_cast<double>(n) / s;
    options.progress("CPU AdamW: " + format_rate(rate, " params/s") + " on " + std::to_string(threads) + " threads");
    return rate;
  }
}

}  // namespace chunkwise::detail

namespace chunkwise::inline CHUNKWISE_ABI {

/// The host backend's machine profile.
/// The fixed cost of one thread_comm collective call among `ranks` thread ranks of this machine. The machine profile
/// holds it for 2 ranks; a run with more ranks than cores measures its own (the ranks take turns on the cores).
inline double measure_thread_collective_latency(int ranks) {
  return detail::measure_collective_latency(thread_world(ranks));
}

template <>
inline machine_profile measure<host_backend>(const measure_options& options) {
  using clock = std::chrono::steady_clock;
  const auto total_start = clock::now();
  const unsigned threads = options.threads != 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  machine_profile m;
  m.kind = device_kind::host;
  m.fingerprint = detail::machine_fingerprint();
  m.devices = options.ranks;
  m.name = "host backend, " + std::to_string(threads) + " cores";

  // Capacities.
  const byte_count available = detail::meminfo_bytes("MemAvailable");
  m.host_memory = available / 2;
  m.device_memory = options.device_memory != 0 ? options.device_memory : available / 4 / options.ranks;
  options.progress("memory: " + format_bytes(available) + " available; device budget " + format_bytes(m.device_memory) +
                   " per rank, host budget " + format_bytes(m.host_memory));

  // Host <-> "device": memcpy of 64 MiB, the host backend's copy engine.
  {
    std::vector<char> src(64 * MiB, 1), dst(64 * MiB, 0);
    const double s = detail::time_per_call([&] { std::memcpy(dst.data(), src.data(), src.size()); });
    m.host_to_device_bytes_per_second = m.device_to_host_bytes_per_second = static_cast<double>(src.size()) / s;
    options.progress("host<->device copy: " + detail::format_rate(m.host_to_device_bytes_per_second));
  }

  detail::measure_nvme(options, m);

  // Collectives: 2 thread ranks, bus bandwidth as nccl-tests define it.
  {
    thread_world world(2);
    for (const byte_count bytes : {1 * MiB, 8 * MiB, 64 * MiB}) {
      const std::size_t n = bytes / sizeof(float);
      std::vector<std::vector<float>> in(2, std::vector<float>(n, 1.0f)), out(2, std::vector<float>(2 * n, 0.0f));
      const auto run = [&](auto&& op) {
        std::vector<std::thread> ranks;
        for (int r = 0; r < 2; ++r)
          ranks.emplace_back([&, r] {
            auto comm = world.comm(r);
            op(comm, r).wait();
          });
        for (auto& t : ranks) t.join();
      };
      const double ag = detail::time_per_call([&] {
        run([&](thread_comm& c, int r) { return c.all_gather(std::span<const float>(in[r]), std::span<float>(out[r])); });
      }, 0.1);
      const double rs = detail::time_per_call([&] {
        run([&](thread_comm& c, int r) {
          return c.reduce_scatter(std::span<const float>(out[r]), std::span<float>(in[r]), reduce_op::sum);
        });
      }, 0.1);
      const double ar = detail::time_per_call([&] {
        run([&](thread_comm& c, int r) {
          return c.all_reduce(std::span<const float>(in[r]), std::span<float>(out[r]).first(n), reduce_op::sum);
        });
      }, 0.1);
      // busbw: gather/scatter algbw (total bytes / time) x (n-1)/n; all-reduce algbw x 2(n-1)/n, n = 2.
      const double total = 2.0 * static_cast<double>(bytes);
      m.all_gather.add(bytes, total / ag * 0.5);
      m.reduce_scatter.add(bytes, total / rs * 0.5);
      m.all_reduce.add(bytes, static_cast<double>(bytes) / ar);
    }
    m.collective_latency_seconds = detail::measure_collective_latency(world);
    options.progress("collectives (2 thread ranks, 64 MiB): all-gather " + detail::format_rate(m.all_gather.at(64 * MiB)) +
                     ", reduce-scatter " + detail::format_rate(m.reduce_scatter.at(64 * MiB)) + ", all-reduce " +
                     detail::format_rate(m.all_reduce.at(64 * MiB)) + " bus bandwidth, " +
                     std::to_string(static_cast<int>(m.collective_latency_seconds * 1e6 + 0.5)) + " us per call");
  }

  m.host_optimizer_params_per_second = detail::measure_cpu_adam(options, threads);
  m.device_optimizer_params_per_second = m.host_optimizer_params_per_second;  // the host backend's device is the CPU

  // Compute: blocked fp32 GEMM.
  {
    const std::size_t n = 512;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
    const double s = detail::time_per_call([&] { detail::blocked_gemm(a.data(), b.data(), c.data(), n, threads); }, 0.3);
    m.device_flops_per_second = 2.0 * static_cast<double>(n * n * n) / s;
    options.progress("GEMM 512^3 fp32: " + detail::format_rate(m.device_flops_per_second, "FLOP/s"));
  }
  return detail::finish_measurement(options, std::move(m), total_start);
}

}  // namespace chunkwise
