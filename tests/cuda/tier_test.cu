// The CUDA tiers, backend, transfer engine and device cache: compiled and linked by nvcc in every CUDA build, run
// where a GPU exists (exit 77 otherwise). Mirrors the host-backend tests on real device memory.
#include "gpu_test_main.hpp"

#include <chunkwise/backend/cuda/backend.cuh>
#include <chunkwise/core/cuda/host_wait.cuh>
#include <chunkwise/placement/device_cache.hpp>
#include <chunkwise/tier/cuda/device.cuh>
#include <chunkwise/tier/cuda/pinned_host.cuh>
#include <chunkwise/tier/nvme.hpp>
#include <chunkwise/tier/transfer_engine.hpp>

#include <chrono>
#include <cstdint>
#include <ctime>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace chunkwise;

namespace {

void fill(void* data, byte_count bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* out = static_cast<unsigned char*>(data);
  for (byte_count i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(rng());
}
bool matches(const void* data, byte_count bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto* in = static_cast<const unsigned char*>(data);
  for (byte_count i = 0; i < bytes; ++i)
    if (in[i] != static_cast<unsigned char>(rng())) return false;
  return true;
}
// Copies a device block to the host and compares it with the stream of `seed`.
bool device_matches(const void* device_block, byte_count bytes, std::uint64_t seed) {
  std::vector<unsigned char> host(bytes);
  if (cudaMemcpy(host.data(), device_block, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  return matches(host.data(), bytes, seed);
}

using pinned_engine = transfer_engine<cuda_backend, cuda_pinned_host_tier>;
using nvme_engine = transfer_engine<cuda_backend, nvme_tier, cuda_pinned_host_tier>;
static_assert(backend<cuda_backend>);
static_assert(pinned_engine::staged == false && nvme_engine::staged == true);

// Keeps one GPU thread busy for about `cycles` clock cycles.
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Whether the kernel just launched on `stream` has already finished: a tool that makes launches wait for their
// kernels (a sanitizer may) leaves nothing to wait for, and the checks that need a kernel still running skip.
bool launch_waited(cudaStream_t stream) {
  const cudaError_t status = cudaStreamQuery(stream);
  if (status == cudaErrorNotReady) return cuda_not_ready();
  REQUIRE(status == cudaSuccess);
  MESSAGE("skipped: the launch waited for its kernel (a sanitizer?), so nothing was left to wait for");
  return true;
}
// Seconds of CPU the calling thread has used.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
// `wait` behind about a second of GPU work: the wall time it took and the CPU time the thread spent in it.
template <class Wait>
std::pair<double, double> wall_and_cpu_seconds(Wait&& wait) {
  const auto start = std::chrono::steady_clock::now();
  const double cpu = thread_cpu_seconds();
  wait();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
          thread_cpu_seconds() - cpu};
}

}  // namespace

TEST_CASE("a host thread waiting for the GPU sleeps rather than spins (backend events, host_wait_event)") {
  // CUDA's default wait spins a core; the runtime's waiters share the cores with the CPU Adam's threads.
  cuda_backend backend;
  spin<<<1, 1, 0, backend.compute()>>>(2'000'000'000LL);  // about 1 s at 2 GHz
  if (launch_waited(backend.compute())) return;
  const auto event = backend.record(backend.compute());
  const auto [wall, cpu] = wall_and_cpu_seconds([&] { backend.wait(event); });
  MESSAGE("backend.wait: " << wall << " s, of which " << cpu << " s on the CPU");
  CHECK(wall > 0.2);
  CHECK(cpu < 0.25 * wall);
  host_wait_event done("test");
  spin<<<1, 1, 0, backend.compute()>>>(2'000'000'000LL);
  if (launch_waited(backend.compute())) return;
  const auto [stream_wall, stream_cpu] = wall_and_cpu_seconds([&] { done.wait_for_stream(backend.compute(), "test"); });
  MESSAGE("host_wait_event::wait_for_stream: " << stream_wall << " s, of which " << stream_cpu << " s on the CPU");
  CHECK(stream_wall > 0.2);
  CHECK(stream_cpu < 0.25 * stream_wall);
  CHECK(cudaStreamQuery(backend.compute()) == cudaSuccess);
}

TEST_CASE("the backend's events are reused once no handle holds them, never while one does") {
  cuda_backend backend;
  cudaEvent_t first = nullptr;
  {
    const auto event = backend.record(backend.h2d());
    first = event.get();
    const auto other = backend.record(backend.h2d());
    CHECK(other.get() != first);  // held: not handed out again
    const auto copy = event;      // a copy holds it too
  }
  const auto again = backend.record(backend.d2h());
  const auto next = backend.record(backend.d2h());
  CHECK((again.get() == first || next.get() == first));  // back in the pool once the last handle went
  backend.wait(again);
  backend.wait(next);
  CHECK(backend.ready(again));
}

TEST_CASE("an event query that finds work unfinished leaves no error for the next kernel launch's check") {
  // cudaEventQuery's cudaErrorNotReady is also the thread's last error: uncleared, the next launch checked with
  // cudaGetLastError (cuda_adam's, the trainer's row kernels') would fail with it.
  cuda_backend backend;
  spin<<<1, 1, 0, backend.compute()>>>(4'000'000'000LL);  // about 2 s at 2 GHz
  if (launch_waited(backend.compute())) return;
  const auto event = backend.record(backend.compute());
  CHECK_FALSE(backend.ready(event));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  spin<<<1, 1, 0, backend.compute()>>>(1);
  CHECK(cudaGetLastError() == cudaSuccess);
  backend.wait(event);
  CHECK(backend.ready(event));
}

TEST_CASE("CUDA tiers round-trip random bytes through device memory bit-exactly") {
  cuda_backend backend;
  cuda_device_tier device(64 * MiB);
  cuda_pinned_host_tier pinned(64 * MiB);
  pinned_engine engine(backend, pinned);
  const byte_count bytes = 8 * MiB + 4;
  void* source = pinned.allocate_sync(bytes);
  void* back = pinned.allocate_sync(bytes);
  void* block = device.allocate(backend.h2d(), bytes, 256);
  fill(source, bytes, 11);
  auto fetched = engine.fetch(block, source, bytes);
  fetched.wait();
  CHECK(device_matches(block, bytes, 11));
  transfer<cuda_backend> after[] = {fetched};
  engine.write_back(back, block, bytes, after).wait();
  CHECK(matches(back, bytes, 11));
  device.deallocate(backend.h2d(), block, bytes);
  pinned.deallocate_sync(source, bytes);
  pinned.deallocate_sync(back, bytes);
  CHECK(device.stats().peak == bytes);
  CHECK(device.stats().in_use == 0);
}

TEST_CASE("the CUDA device tier's budget fails with the bytes asked, in use and the budget") {
  cuda_device_tier device(16 * MiB);
  void* first = device.allocate_sync(12 * MiB);
  std::string message;
  try {
    (void)device.allocate_sync(8 * MiB);
  } catch (const chunkwise::error& e) {
    CHECK(e.code() == error_code::out_of_memory);
    message = e.what();
  }
  CHECK(message.find(std::to_string(8 * MiB)) != std::string::npos);
  CHECK(message.find(std::to_string(16 * MiB)) != std::string::npos);
  device.deallocate_sync(first, 12 * MiB);
}

TEST_CASE("NVMe -> device through pinned staging, and a device cache over a GPT-2-like trace") {
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  const byte_count chunk = 4 * MiB;
  nvme_options options;
  options.directory = dir;
  options.block_bytes = chunk;
  options.capacity = 5 * chunk;
  nvme_tier store(options);
  MESSAGE(store.describe());
  cuda_backend backend;
  cuda_device_tier device(3 * chunk);
  cuda_pinned_host_tier pinned(4 * chunk);
  transfer_options engine_options;
  engine_options.staging_bytes = chunk;
  nvme_engine engine(backend, store, pinned, engine_options);
  std::vector<nvme_block> homes;
  void* buffer = pinned.allocate_sync(chunk, 4096);
  for (std::uint32_t c = 0; c < 5; ++c) {
    homes.push_back(store.allocate_sync(chunk));
    fill(buffer, chunk, c);
    store.write(homes.back(), buffer, chunk);
  }
  pinned.deallocate_sync(buffer, chunk);
  std::vector<std::uint32_t> step{0};
  for (int l = 0; l < 12; ++l) step.push_back(static_cast<std::uint32_t>(1 + l / 3));
  step.push_back(0);
  step.push_back(0);
  for (int l = 11; l >= 0; --l) step.push_back(static_cast<std::uint32_t>(1 + l / 3));
  step.push_back(0);
  device_cache<nvme_engine, cuda_device_tier> cache(engine, device, homes, step,
                                                    {.blocks = 3, .chunk_bytes = chunk, .prefetch_depth = 2});
  for (int s = 0; s < 2; ++s) {
    for (auto c : step) {
      CHECK(device_matches(cache.acquire(c), chunk, c));
      cache.release(c);
    }
  }
  CHECK(cache.stats().prefetches > 0);
  CHECK(cache.stats().bytes_home_to_device == store.stats().bytes_read);
}
