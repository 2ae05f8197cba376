// Tier throughput. Host-backend device tier: fetch (pinned home -> device block) and write-back through the transfer
// engine against a plain memcpy of the same bytes, and a device cache running a GPT-2-like trace with evictions.
// NVMe tier: sequential block writes and reads (O_DIRECT, io_uring or the pread pool) for bench/compare/nvme.sh.
//
// Environment: CHUNKWISE_BENCH_DIR (the NVMe store's directory; default $TMPDIR or /tmp),
//              CHUNKWISE_BENCH_NVME_BYTES (store file bytes; default 1 GiB), CHUNKWISE_BENCH_BLOCK_BYTES (default 64 MiB).
#include <chunkwise/backend.hpp>
#include <chunkwise/placement.hpp>
#include <chunkwise/tier.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace chunkwise;

namespace {

byte_count env_bytes(const char* name, byte_count fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? parse_bytes(text) : fallback;
}
std::string bench_dir() {
  if (const char* dir = std::getenv("CHUNKWISE_BENCH_DIR"); dir != nullptr && *dir != '\0') return dir;
  if (const char* dir = std::getenv("TMPDIR"); dir != nullptr && *dir != '\0') return dir;
  return "/tmp";
}

void BM_memcpy(benchmark::State& state) {
  const auto bytes = static_cast<byte_count>(state.range(0));
  pinned_host_tier home(bytes);
  emulated_device_tier device(bytes);
  void* source = home.allocate_sync(bytes, 0);
  void* block = device.allocate_sync(bytes, 0);
  std::memset(source, 1, bytes);
  std::memset(block, 0, bytes);
  for (auto _ : state) {
    std::memcpy(block, source, bytes);
    benchmark::DoNotOptimize(block);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  home.deallocate_sync(source, bytes, 0);
  device.deallocate_sync(block, bytes, 0);
}

// One fetch and one write-back per iteration, each waited for: the latency-bound case (no overlap).
void BM_device_tier_fetch_evict(benchmark::State& state) {
  const auto bytes = static_cast<byte_count>(state.range(0));
  host_backend backend;
  pinned_host_tier home(2 * bytes);
  emulated_device_tier device(bytes);
  transfer_engine<host_backend, pinned_host_tier> engine(backend, home);
  void* source = home.allocate_sync(bytes, 0);
  void* target = home.allocate_sync(bytes, 0);
  void* block = device.allocate_sync(bytes, 0);
  std::memset(source, 1, bytes);
  std::memset(target, 0, bytes);
  std::memset(block, 0, bytes);
  for (auto _ : state) {
    engine.fetch(block, source, bytes).wait();
    engine.write_back(target, block, bytes).wait();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * bytes));
  home.deallocate_sync(source, bytes, 0);
  home.deallocate_sync(target, bytes, 0);
  device.deallocate_sync(block, bytes, 0);
}

// The same bytes as BM_device_tier_fetch_evict, by memcpy on the calling thread.
void BM_memcpy_fetch_evict(benchmark::State& state) {
  const auto bytes = static_cast<byte_count>(state.range(0));
  std::vector<char> source(bytes, 1), target(bytes, 0), block(bytes, 0);
  for (auto _ : state) {
    std::memcpy(block.data(), source.data(), bytes);
    std::memcpy(target.data(), block.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * bytes));
}

// A device cache of 3 blocks over 5 chunks running a GPT-2-like step (tied head) with every chunk dirty after its
// backward use: fetches, evictions and write-backs, prefetch depth 2. Bytes = bytes moved both ways.
void BM_device_cache_step(benchmark::State& state) {
  const auto bytes = static_cast<byte_count>(state.range(0));
  host_backend backend;
  pinned_host_tier home(5 * bytes);
  emulated_device_tier device(3 * bytes);
  transfer_engine<host_backend, pinned_host_tier> engine(backend, home);
  std::vector<void*> homes;
  for (int c = 0; c < 5; ++c) {
    homes.push_back(home.allocate_sync(bytes, 0));
    std::memset(homes.back(), c, bytes);
  }
  std::vector<std::uint32_t> step{0};
  for (int l = 0; l < 12; ++l) step.push_back(static_cast<std::uint32_t>(1 + l / 3));
  step.push_back(0);
  step.push_back(0);
  for (int l = 11; l >= 0; --l) step.push_back(static_cast<std::uint32_t>(1 + l / 3));
  step.push_back(0);
  const std::size_t backward_start = step.size() / 2;
  {
    device_cache<transfer_engine<host_backend, pinned_host_tier>, emulated_device_tier> cache(
        engine, device, homes, step, {.blocks = 3, .chunk_bytes = bytes, .prefetch_depth = 2});
    for (auto _ : state) {
      for (std::size_t i = 0; i < step.size(); ++i) {
        benchmark::DoNotOptimize(cache.acquire(step[i]));
        cache.release(step[i], /*dirty=*/i >= backward_start);
      }
    }
    const auto& stats = cache.stats();
    state.SetBytesProcessed(static_cast<std::int64_t>(stats.bytes_home_to_device + stats.bytes_device_to_home));
    state.counters["misses/step"] =
        benchmark::Counter(static_cast<double>(stats.misses), benchmark::Counter::kAvgIterations);
    state.counters["fetches/step"] =
        benchmark::Counter(static_cast<double>(stats.fetches()), benchmark::Counter::kAvgIterations);
    state.counters["stall_us/step"] = benchmark::Counter(
        static_cast<double>(stats.stall_time.count()) / 1e3, benchmark::Counter::kAvgIterations);
  }
  for (void* h : homes) home.deallocate_sync(h, bytes, 0);
}

// ---- NVMe: sequential blocks of the store, one block per iteration, O_DIRECT ----
struct nvme_rig {
  std::unique_ptr<nvme_tier> store;
  std::unique_ptr<pinned_host_tier> pinned;
  std::vector<nvme_block> blocks;
  void* buffer = nullptr;
  byte_count block_bytes = 0;

  nvme_rig(byte_count io_bytes, unsigned queue_depth, nvme_io_path path) {
    block_bytes = env_bytes("CHUNKWISE_BENCH_BLOCK_BYTES", 64 * MiB);
    nvme_options options;
    options.directory = bench_dir();
    options.block_bytes = block_bytes;
    options.capacity = env_bytes("CHUNKWISE_BENCH_NVME_BYTES", 1 * GiB);
    options.io_bytes = io_bytes;
    options.queue_depth = queue_depth;
    options.path = path;
    store = std::make_unique<nvme_tier>(options);
    pinned = std::make_unique<pinned_host_tier>(round_up(block_bytes, 4096));
    buffer = pinned->allocate_sync(round_up(block_bytes, 4096), 4096);
    std::memset(buffer, 0x5A, block_bytes);
    for (std::uint32_t b = 0; b < store->block_count(); ++b) blocks.push_back(store->allocate_sync(block_bytes));
  }
  ~nvme_rig() { pinned->deallocate_sync(buffer, round_up(block_bytes, 4096), 4096); }
};

void nvme_sequential(benchmark::State& state, bool reading, nvme_io_path path) {
  try {
    nvme_rig rig(static_cast<byte_count>(state.range(0)) * KiB, static_cast<unsigned>(state.range(1)), path);
    // One untimed pass over the store first: a fresh file's extents are "unwritten" and their first write converts
    // them (slower, once per store); the timed passes see the steady state, as fio does on its existing file.
    for (auto block : rig.blocks) rig.store->write(block, rig.buffer, rig.block_bytes);
    std::size_t next = 0;
    for (auto _ : state) {
      if (reading) rig.store->read(rig.blocks[next], rig.buffer, rig.block_bytes);
      else rig.store->write(rig.blocks[next], rig.buffer, rig.block_bytes);
      next = (next + 1) % rig.blocks.size();
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * rig.block_bytes));
    state.SetLabel(rig.store->describe());
  } catch (const chunkwise::error& e) {
    state.SkipWithError(e.what());
  }
}
void BM_nvme_write(benchmark::State& state) { nvme_sequential(state, false, nvme_io_path::automatic); }
void BM_nvme_read(benchmark::State& state) { nvme_sequential(state, true, nvme_io_path::automatic); }
void BM_nvme_write_threads(benchmark::State& state) { nvme_sequential(state, false, nvme_io_path::threads); }
void BM_nvme_read_threads(benchmark::State& state) { nvme_sequential(state, true, nvme_io_path::threads); }

// Reads overlapped with compute: a device cache (3 blocks, prefetch 2) over chunks homed on NVMe, with `compute_ms`
// of arithmetic per access on the calling thread. Without overlap a step takes compute + I/O; with it, about the
// larger of the two. Counters: the step's compute and stall (acquire waiting for a fetch), per step.
void BM_nvme_cache_overlap(benchmark::State& state) {
  const byte_count chunk = 16 * MiB;
  const auto compute = std::chrono::microseconds(state.range(0) * 1000);
  try {
    nvme_options options;
    options.directory = bench_dir();
    options.block_bytes = chunk;
    options.capacity = 6 * chunk;
    nvme_tier store(options);
    host_backend backend;
    pinned_host_tier pinned(4 * chunk);
    emulated_device_tier device(3 * chunk);
    transfer_options engine_options;
    engine_options.staging_bytes = chunk;
    using engine_type = transfer_engine<host_backend, nvme_tier, pinned_host_tier>;
    engine_type engine(backend, store, pinned, engine_options);
    std::vector<nvme_block> homes;
    void* buffer = pinned.allocate_sync(chunk, 4096);
    for (int c = 0; c < 6; ++c) {
      homes.push_back(store.allocate_sync(chunk));
      std::memset(buffer, c, chunk);
      store.write(homes.back(), buffer, chunk);
    }
    pinned.deallocate_sync(buffer, chunk, 4096);
    const std::vector<std::uint32_t> step{0, 1, 2, 3, 4, 5};  // six layers forward: every access a fetch
    device_cache<engine_type, emulated_device_tier> cache(engine, device, homes, step,
                                                      {.blocks = 3, .chunk_bytes = chunk, .prefetch_depth = 2});
    double sink = 0;
    std::chrono::nanoseconds computing{0};
    for (auto _ : state) {
      for (auto c : step) {
        const auto* data = static_cast<const unsigned char*>(cache.acquire(c));
        const auto start = std::chrono::steady_clock::now();
        double acc = data[0];
        while (std::chrono::steady_clock::now() - start < compute)
          for (int i = 0; i < 1000; ++i) acc = acc * 0.999 + 1e-9 * i;
        computing += std::chrono::steady_clock::now() - start;
        sink += acc;
        cache.release(c);
      }
    }
    benchmark::DoNotOptimize(sink);
    const auto& stats = cache.stats();
    state.SetBytesProcessed(static_cast<std::int64_t>(stats.bytes_home_to_device));
    state.counters["compute_ms/step"] =
        benchmark::Counter(static_cast<double>(computing.count()) / 1e6, benchmark::Counter::kAvgIterations);
    state.counters["stall_ms/step"] =
        benchmark::Counter(static_cast<double>(stats.stall_time.count()) / 1e6, benchmark::Counter::kAvgIterations);
  } catch (const chunkwise::error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_crc32c(benchmark::State& state) {
  std::vector<unsigned char> data(static_cast<std::size_t>(state.range(0)), 0xA5);
  std::uint32_t crc = 0;
  for (auto _ : state) benchmark::DoNotOptimize(crc = crc32c(data.data(), data.size(), crc));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * data.size()));
}

}  // namespace

BENCHMARK(BM_memcpy)->Arg(16 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(BM_device_tier_fetch_evict)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(BM_memcpy_fetch_evict)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(BM_device_cache_step)->Arg(4 << 20)->Arg(16 << 20)->UseRealTime();
// Args: request KiB, queue depth.
BENCHMARK(BM_nvme_write)->Args({1024, 4})->Args({1024, 1})->Args({256, 8})->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_nvme_read)->Args({1024, 4})->Args({1024, 1})->Args({256, 8})->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_nvme_write_threads)->Args({1024, 4})->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_nvme_read_threads)->Args({1024, 4})->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_nvme_cache_overlap)->Arg(0)->Arg(10)->Arg(20)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_crc32c)->Arg(1 << 20);

// bench/compare/nvme.sh sets CHUNKWISE_BENCH_IO_KIB and CHUNKWISE_BENCH_QUEUE_DEPTH to the block size and queue depth
// it gives fio; nvme_compare_{read,write} then run with exactly those.
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const char* io_kib = std::getenv("CHUNKWISE_BENCH_IO_KIB");
  const char* queue_depth = std::getenv("CHUNKWISE_BENCH_QUEUE_DEPTH");
  if (io_kib != nullptr && queue_depth != nullptr) {
    const std::int64_t kib = std::atoll(io_kib), depth = std::atoll(queue_depth);
    benchmark::RegisterBenchmark("nvme_compare_read", BM_nvme_read)->Args({kib, depth})->UseRealTime()->MinTime(2.0);
    benchmark::RegisterBenchmark("nvme_compare_write", BM_nvme_write)->Args({kib, depth})->UseRealTime()->MinTime(2.0);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
