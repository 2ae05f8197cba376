// Placement policies and the device chunk cache (next-use and LRU eviction, prefetch, departures, write-back) on the
// host backend with real moves.
#include <chunkwise/backend.hpp>
#include <chunkwise/placement.hpp>
#include <chunkwise/tier.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <random>
#include <chrono>
#include <thread>
#include <string>
#include <vector>

#include "contracts/placement_policy_contract.hpp"
#include "tier_test_support.hpp"

using namespace chunkwise;
using chunkwise::test::fill_random;
using chunkwise::test::matches_random;
using chunkwise::test::temp_dir;

namespace {

constexpr byte_count chunk_bytes = 64 * KiB;

// The smallest number of fetches any replacement policy needs to serve `trace` with `blocks` device blocks, starting
// empty, fetching only on demand: dynamic programming over (position, set of cached chunks).
std::uint64_t brute_force_min_fetches(const std::vector<std::uint32_t>& trace, std::size_t blocks) {
  std::map<std::pair<std::size_t, std::uint32_t>, std::uint64_t> memo;
  auto best = [&](auto&& self, std::size_t at, std::uint32_t cached) -> std::uint64_t {
    if (at == trace.size()) return 0;
    const auto key = std::make_pair(at, cached);
    if (auto found = memo.find(key); found != memo.end()) return found->second;
    const std::uint32_t want = 1u << trace[at];
    std::uint64_t result;
    if (cached & want) {
      result = self(self, at + 1, cached);
    } else if (static_cast<std::size_t>(__builtin_popcount(cached)) < blocks) {
      result = 1 + self(self, at + 1, cached | want);
    } else {
      result = UINT64_MAX;
      for (std::uint32_t victim = cached; victim != 0; victim &= victim - 1) {
        const std::uint32_t out = victim & (~victim + 1);
        result = std::min(result, 1 + self(self, at + 1, (cached & ~out) | want));
      }
    }
    memo.emplace(key, result);
    return result;
  };
  return best(best, 0, 0);
}

// A plain LRU reference: misses of `trace` with `blocks` blocks.
std::uint64_t reference_lru_misses(const std::vector<std::uint32_t>& trace, std::size_t blocks) {
  std::list<std::uint32_t> recent;  // front: most recent
  std::uint64_t misses = 0;
  for (auto chunk : trace) {
    auto found = std::find(recent.begin(), recent.end(), chunk);
    if (found != recent.end()) {
      recent.erase(found);
    } else {
      ++misses;
      if (recent.size() == blocks) recent.pop_back();
    }
    recent.push_front(chunk);
  }
  return misses;
}

// GPT-2-like: embedding, 12 layers forward, head, head backward, 12 layers backward, embedding backward. 5 chunks:
// chunk 0 holds the token and position embeddings, which GPT-2's head reuses (tied weights); chunks 1-4 hold three
// layers each.
std::vector<std::uint32_t> gpt2_like_step() {
  auto layer_chunk = [](int layer) { return static_cast<std::uint32_t>(1 + layer / 3); };
  std::vector<std::uint32_t> step{0};
  for (int l = 0; l < 12; ++l) step.push_back(layer_chunk(l));
  step.push_back(0);  // head forward (tied to the embedding)
  step.push_back(0);  // head backward
  for (int l = 11; l >= 0; --l) step.push_back(layer_chunk(l));
  step.push_back(0);
  return step;
}

// A host-backend rig: a pinned home of `chunks` chunks with known contents (chunk c holds the stream of seed c) and a
// device budget for `blocks` blocks.
struct pinned_rig {
  host_backend backend;
  pinned_host_tier home;
  emulated_device_tier device;
  transfer_engine<host_backend, pinned_host_tier> engine;
  std::vector<void*> homes;

  // `caches`: how many caches of `blocks` blocks live at once.
  pinned_rig(std::size_t chunks, std::size_t blocks, std::size_t caches = 1)
      : home(chunks * chunk_bytes), device(caches * blocks * chunk_bytes), engine(backend, home) {
    for (std::size_t c = 0; c < chunks; ++c) {
      homes.push_back(home.allocate_sync(chunk_bytes, 0));
      fill_random(homes.back(), chunk_bytes, c);
    }
  }
  ~pinned_rig() {
    for (void* h : homes) home.deallocate_sync(h, chunk_bytes, 0);
  }
  using cache_type = device_cache<transfer_engine<host_backend, pinned_host_tier>, emulated_device_tier>;
  cache_type cache(std::vector<std::uint32_t> order, cache_options options) {
    options.chunk_bytes = chunk_bytes;
    return cache_type(engine, device, homes, std::move(order), std::move(options));
  }
};

// Runs `trace` through `cache`, checking every chunk's bytes at every access. Returns false on the first mismatch.
template <class Cache>
bool run_trace(Cache& cache, const std::vector<std::uint32_t>& trace) {
  for (auto chunk : trace) {
    const void* data = cache.acquire(chunk);
    const bool good = matches_random(data, chunk_bytes, chunk);
    cache.release(chunk);
    if (!good) return false;
  }
  return true;
}

}  // namespace

TEST_CASE_TEMPLATE_APPLY(placement_policy_contract,
                         std::tuple<resident, cached<space::pinned_host>, cached<space::host>, cached<space::nvme>,
                                    cached<space::nvme, 4>, split<space::pinned_host>, split<space::nvme>,
                                    split<space::host, 1>>);

TEST_CASE("placement policies give the cost model constexpr byte counts") {
  static_assert(placement_policy<resident>);
  static_assert(placement_policy<cached<space::nvme>>);
  static_assert(placement_policy<cached<space::pinned_host>>);
  static_assert(placement_policy<split<space::nvme>>);
  constexpr byte_count c = 32 * MiB;
  static_assert(resident::device_bytes(c, 12, 3) == 12 * c);
  static_assert(resident::host_bytes(c, 12, 3) == 0 && resident::nvme_bytes(c, 12, 3) == 0);
  static_assert(cached<space::pinned_host>::device_bytes(c, 12, 3) == 3 * c);
  static_assert(cached<space::pinned_host>::device_bytes(c, 2, 3) == 2 * c);  // more blocks than chunks buy nothing
  static_assert(cached<space::pinned_host>::host_bytes(c, 12, 3) == 12 * c);
  static_assert(cached<space::nvme>::host_bytes(c, 12, 3) == 2 * c);  // staging only
  static_assert(cached<space::nvme, 4>::host_bytes(c, 12, 3) == 4 * c);
  static_assert(cached<space::nvme>::nvme_bytes(1000, 12, 3) == 12 * 4096);  // blocks rounded to the I/O alignment
  static_assert(split<space::host>::resident_chunks(12, 6) == 4);
  static_assert(split<space::host>::host_bytes(c, 12, 6) == 8 * c);
  static_assert(split<space::host>::resident_chunks(12, 2) == 0);
  static_assert(split<space::host, 1>::resident_chunks(12, 2) == 1);
  static_assert(split<space::nvme>::nvme_bytes(c, 12, 12) == 0);
  static_assert(split<space::nvme>::host_bytes(c, 12, 12) == 0);
  CHECK(std::string(cached<space::nvme>::name) == "cached<nvme>");
  CHECK(std::string(split<space::pinned_host>::name) == "split<pinned_host>");
}

TEST_CASE("next-use eviction needs the brute-force minimum number of fetches on small random traces") {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t chunks = 2 + rng() % 5;  // 2..6
    const std::size_t blocks = 1 + rng() % 3;  // 1..3
    const std::size_t length = 4 + rng() % 11;
    std::vector<std::uint32_t> trace(length);
    for (auto& chunk : trace) chunk = static_cast<std::uint32_t>(rng() % chunks);
    CAPTURE(trial);
    pinned_rig rig(chunks, blocks);
    auto cache = rig.cache(trace, {.blocks = blocks, .policy = eviction::next_use, .prefetch_depth = 0});
    REQUIRE(run_trace(cache, trace));
    CHECK(cache.stats().fetches() == brute_force_min_fetches(trace, blocks));
    CHECK(cache.stats().departures == 0);
    CHECK(cache.stats().hits + cache.stats().misses == length);
  }
}

TEST_CASE("LRU and next-use counters on a GPT-2-like trace") {
  const auto step = gpt2_like_step();
  std::vector<std::uint32_t> three_steps;
  for (int s = 0; s < 3; ++s) three_steps.insert(three_steps.end(), step.begin(), step.end());
  for (std::size_t blocks : {2, 3, 4}) {
    CAPTURE(blocks);
    pinned_rig rig(5, blocks, 3);
    auto lru = rig.cache(step, {.blocks = blocks, .policy = eviction::lru, .prefetch_depth = 0});
    REQUIRE(run_trace(lru, three_steps));
    CHECK(lru.stats().misses == reference_lru_misses(three_steps, blocks));
    CHECK(lru.stats().hits == three_steps.size() - lru.stats().misses);

    auto next_use = rig.cache(step, {.blocks = blocks, .policy = eviction::next_use, .prefetch_depth = 0});
    REQUIRE(run_trace(next_use, three_steps));
    // Optimal over the whole run, and strictly better than LRU: the tied head brings chunk 0 back mid-step.
    CHECK(next_use.stats().misses == brute_force_min_fetches(three_steps, blocks));
    CHECK(next_use.stats().misses < lru.stats().misses);
    MESSAGE("blocks " << blocks << ": next_use misses " << next_use.stats().misses << ", lru misses "
                      << lru.stats().misses << " over " << three_steps.size() << " accesses");
    CHECK(next_use.stats().departures == 0);
    CHECK(next_use.stats().bytes_home_to_device == next_use.stats().misses * chunk_bytes);
    CHECK(next_use.stats().bytes_device_to_home == 0);  // nothing dirty

    auto one_step = rig.cache(step, {.blocks = blocks, .policy = eviction::next_use, .prefetch_depth = 0});
    REQUIRE(run_trace(one_step, step));
    CHECK(one_step.stats().misses == brute_force_min_fetches(step, blocks));
  }
}

TEST_CASE("prefetch along the profiled order turns misses into hits without extra fetches") {
  const auto step = gpt2_like_step();
  std::vector<std::uint32_t> three_steps;
  for (int s = 0; s < 3; ++s) three_steps.insert(three_steps.end(), step.begin(), step.end());
  pinned_rig rig(5, 3, 3);
  auto demand = rig.cache(step, {.blocks = 3, .prefetch_depth = 0});
  REQUIRE(run_trace(demand, three_steps));
  auto ahead = rig.cache(step, {.blocks = 3, .prefetch_depth = 2});
  REQUIRE(run_trace(ahead, three_steps));
  MESSAGE("demand: " << demand.stats().misses << " misses; prefetch 2: " << ahead.stats().misses << " misses, "
                     << ahead.stats().prefetches << " prefetches, stalled "
                     << ahead.stats().stall_time.count() / 1000 << " us");
  MESSAGE(ahead.stats().summary());
  CHECK(ahead.stats().summary().find("pinned_host->device") != std::string::npos);
  CHECK(ahead.stats().prefetches > 0);
  CHECK(ahead.stats().misses < demand.stats().misses);
  CHECK(ahead.stats().fetches() == demand.stats().fetches());  // Belady-consistent prefetch fetches nothing extra
  auto lru_ahead = rig.cache(step, {.blocks = 3, .policy = eviction::lru, .prefetch_depth = 2});
  REQUIRE(run_trace(lru_ahead, three_steps));
  CHECK(lru_ahead.stats().prefetches > 0);
}

TEST_CASE("an access that departs from the profiled order costs a miss and a counter, never wrong data") {
  const auto step = gpt2_like_step();
  pinned_rig rig(6, 3);  // chunk 5 is never in the profiled order (an evaluation-only head, say)
  auto cache = rig.cache(step, {.blocks = 3, .prefetch_depth = 2});
  REQUIRE(run_trace(cache, step));
  const auto before = cache.stats();
  // A conditional layer skipped (layers 3-5 absent), a chunk the profile never saw, then out of order entirely.
  std::vector<std::uint32_t> odd{0, 0, 0, 0, 2, 5, 3, 4, 1, 5, 0, 4, 4, 3};
  REQUIRE(run_trace(cache, odd));
  CHECK(cache.stats().departures > before.departures);
  CHECK(cache.stats().misses > before.misses);
  CHECK(cache.stats().accesses == step.size() + odd.size());
  // Back on the profiled order: it re-synchronises and keeps serving correct bytes.
  REQUIRE(run_trace(cache, step));
  REQUIRE(run_trace(cache, step));
  const auto settled = cache.stats();
  REQUIRE(run_trace(cache, step));
  CHECK(cache.stats().departures == settled.departures);
}

TEST_CASE("dirty chunks are written back on eviction and on flush, and refetched with their new bytes") {
  pinned_rig rig(4, 2);
  const std::vector<std::uint32_t> order{0, 1, 2, 3};
  auto cache = rig.cache(order, {.blocks = 2, .prefetch_depth = 1});
  for (int round = 0; round < 3; ++round) {
    for (std::uint32_t c = 0; c < 4; ++c) {
      void* data = cache.acquire(c);
      REQUIRE(matches_random(data, chunk_bytes, 1000 * round + c));
      fill_random(data, chunk_bytes, 1000 * (round + 1) + c);  // an optimizer step, say
      cache.release(c, /*dirty=*/true);
    }
  }
  cache.flush();
  for (std::uint32_t c = 0; c < 4; ++c) CHECK(matches_random(rig.homes[c], chunk_bytes, 3000 + c));
  CHECK(cache.stats().write_backs >= 12);
  CHECK(cache.stats().bytes_device_to_home == cache.stats().write_backs * chunk_bytes);
  CHECK(rig.home.stats().bytes_written == cache.stats().bytes_device_to_home);
}

TEST_CASE("pinned chunks (split's resident ones) are never evicted") {
  const auto step = gpt2_like_step();
  pinned_rig rig(5, 4);
  constexpr std::size_t resident_count = split<space::pinned_host>::resident_chunks(5, 4);
  static_assert(resident_count == 2);
  const auto resident_ids = split<space::pinned_host>::resident_chunk_ids(step, 5, 4);
  CHECK(resident_ids == std::vector<std::uint32_t>{0, 1});  // the first chunks in profiled order
  auto cache = rig.cache(step, {.blocks = 4, .prefetch_depth = 1, .pinned_chunks = resident_ids});
  for (int s = 0; s < 3; ++s) REQUIRE(run_trace(cache, step));
  CHECK(cache.is_cached(0));
  CHECK(cache.is_cached(1));
  // Chunks 0 and 1 were fetched once each; only the streamed chunks move after the first step.
  pinned_rig again(5, 4);
  auto demand = again.cache(step, {.blocks = 4, .prefetch_depth = 0, .pinned_chunks = {0, 1}});
  REQUIRE(run_trace(demand, step));
  const auto first = demand.stats().fetches();
  REQUIRE(run_trace(demand, step));
  CHECK(demand.stats().fetches() - first <= 3);
}

TEST_CASE("cache errors: too few blocks for the budget, every block acquired, bad chunk ids") {
  pinned_rig rig(4, 2);
  const std::vector<std::uint32_t> order{0, 1, 2, 3};
  {
    std::string message;
    try {
      auto cache = rig.cache(order, {.blocks = 3});
    } catch (const chunkwise::error& e) {
      CHECK(e.code() == error_code::out_of_memory);
      message = e.what();
    }
    CHECK(message.find(std::to_string(chunk_bytes)) != std::string::npos);
    CHECK(rig.device.stats().in_use == 0);  // the blocks it did get went back
  }
  auto cache = rig.cache(order, {.blocks = 2, .prefetch_depth = 0});
  (void)cache.acquire(0);
  (void)cache.acquire(1);
  CHECK_THROWS_AS((void)cache.acquire(2), chunkwise::error);
  cache.release(1);
  (void)cache.acquire(2);  // now it fits
  CHECK_THROWS_AS(cache.release(3), chunkwise::error);
  CHECK_THROWS_AS((void)cache.acquire(9), chunkwise::error);
  CHECK_THROWS_AS(rig.cache({0, 7}, {.blocks = 1}), chunkwise::error);
  cache.release(0);
  cache.release(2);
}

TEST_CASE("an NVMe-homed cache serves the trace bit-exactly and reports a corrupted chunk") {
  temp_dir dir;
  host_backend backend;
  nvme_options store_options;
  store_options.directory = dir.path();
  store_options.block_bytes = chunk_bytes;
  store_options.capacity = 5 * chunk_bytes;
  store_options.io_bytes = 16 * KiB;
  nvme_tier store(store_options);
  pinned_host_tier pinned(1 * MiB);
  emulated_device_tier device(3 * chunk_bytes);
  emulated_device_tier device2(3 * chunk_bytes);
  transfer_options engine_options;
  engine_options.staging_bytes = chunk_bytes;
  using engine_type = transfer_engine<host_backend, nvme_tier, pinned_host_tier>;
  engine_type engine(backend, store, pinned, engine_options);
  std::vector<nvme_block> homes;
  void* buffer = pinned.allocate_sync(chunk_bytes, 4096);
  for (std::uint32_t c = 0; c < 5; ++c) {
    homes.push_back(store.allocate_sync(chunk_bytes));
    fill_random(buffer, chunk_bytes, c);
    store.write(homes.back(), buffer, chunk_bytes);
  }
  pinned.deallocate_sync(buffer, chunk_bytes, 4096);
  const auto step = gpt2_like_step();
  device_cache<engine_type, emulated_device_tier> cache(engine, device, homes, step,
                                                    {.blocks = 3, .chunk_bytes = chunk_bytes, .prefetch_depth = 2});
  for (int s = 0; s < 2; ++s) REQUIRE(run_trace(cache, step));
  CHECK(cache.stats().bytes_home_to_device == store.stats().bytes_read);
  // Dirty a chunk and flush: its new bytes reach the disk.
  void* data = cache.acquire(0);
  fill_random(data, chunk_bytes, 77);
  cache.release(0, true);
  cache.flush();
  {
    void* check = pinned.allocate_sync(chunk_bytes, 4096);
    store.read(homes[0], check, chunk_bytes);
    CHECK(matches_random(check, chunk_bytes, 77));
    fill_random(check, chunk_bytes, 0);  // restore chunk 0 for the next cache
    store.write(homes[0], check, chunk_bytes);
    pinned.deallocate_sync(check, chunk_bytes, 4096);
  }
  // Corrupt chunk 3 on disk; a fresh cache's fetch of it (prefetched or on demand) fails loudly, and the cache
  // keeps serving the other chunks.
  {
    const int fd = ::open(store.file().c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    const unsigned char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    REQUIRE(::pwrite(fd, junk, sizeof junk, static_cast<off_t>(store.file_offset(homes[3]) + 100)) == 8);
    ::fsync(fd);
    ::close(fd);
  }
  device_cache<engine_type, emulated_device_tier> fresh(engine, device2, homes, step,
                                                    {.blocks = 3, .chunk_bytes = chunk_bytes, .prefetch_depth = 2});
  std::size_t failures = 0;
  for (int s = 0; s < 2; ++s) {
    for (auto chunk : step) {
      if (chunk == 3) {
        std::string message;
        try {
          (void)fresh.acquire(3);
        } catch (const chunkwise::error& e) {
          message = e.what();
        }
        CHECK(message.find("checksum mismatch") != std::string::npos);
        CHECK(!fresh.is_cached(3));
        failures += message.empty() ? 0 : 1;
        continue;
      }
      REQUIRE(matches_random(fresh.acquire(chunk), chunk_bytes, chunk));
      fresh.release(chunk);
    }
  }
  CHECK(failures == 2 * static_cast<std::size_t>(std::count(step.begin(), step.end(), 3u)));
}

TEST_CASE("write-backs and refills wait for the device work named at release") {
  // The trainer's "kernel" runs on its own stream, after release returned: the write-back must see its bytes.
  pinned_rig rig(3, 1);
  host_stream compute;
  auto cache = rig.cache({0, 1, 2}, {.blocks = 1, .prefetch_depth = 0});
  void* block = cache.acquire(0);
  compute.enqueue([block] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fill_random(block, chunk_bytes, 4242);
  });
  using transfer_type = transfer<host_backend>;
  cache.release(0, /*dirty=*/true, transfer_type::after_event(rig.backend, rig.backend.record(compute)));
  REQUIRE(matches_random(cache.acquire(1), chunk_bytes, 1));  // evicts chunk 0 (one block): write-back, refill
  cache.release(1);
  CHECK(matches_random(rig.homes[0], chunk_bytes, 4242));
  CHECK(matches_random(cache.acquire(0), chunk_bytes, 4242));
  cache.release(0);
}

TEST_CASE("acquire_for leaves a fetch in flight to the consumer's stream; one done on a host thread is waited for") {
  pinned_rig rig(2, 1);
  host_stream compute;  // the consumer's stream (a GPU's compute stream)
  auto cache = rig.cache({0, 1}, {.blocks = 1, .prefetch_depth = 0});

  // The copy stream is held shut: the fetch of chunk 0 cannot run until the gate opens (after 5 s at the latest).
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  rig.backend.h2d().enqueue([opened] { opened.wait(); });
  std::atomic<bool> gate_open{false};
  std::promise<void> returned;
  std::thread watchdog([&] {
    (void)returned.get_future().wait_for(std::chrono::seconds(5));
    gate_open = true;
    gate.set_value();
  });
  void* block = cache.acquire_for(0, compute);
  const bool returned_before_the_fetch = !gate_open;
  returned.set_value();
  bool consumer_saw_chunk = false;
  compute.enqueue([&] { consumer_saw_chunk = matches_random(block, chunk_bytes, 0); });
  watchdog.join();
  compute.synchronize();
  CHECK(returned_before_the_fetch);
  CHECK(consumer_saw_chunk);  // the stream waited for the fetch
  CHECK(cache.stats().stream_ordered == 1);
  cache.release(0, false, transfer<host_backend>::after_event(rig.backend, rig.backend.record(compute)));

  // Chunk 1's home is being changed on a host thread: its fetch is ordered after that change, through a mover,
  // and completes on the host; no stream can wait for it, so acquire_for waits until the new bytes are in the block.
  auto changed = std::make_shared<completion>();
  cache.invalidate(1, transfer<host_backend>::after_completion(changed));
  std::thread updater([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fill_random(rig.homes[1], chunk_bytes, 77);
    changed->complete();
  });
  const void* updated = cache.acquire_for(1, compute);
  CHECK(matches_random(updated, chunk_bytes, 77));  // read at once on the host: the fetch had landed
  CHECK(cache.stats().stream_ordered == 1);
  cache.release(1);
  updater.join();
}
