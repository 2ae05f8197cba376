// Fault injection: short transfers, EIO, ENOSPC and delays in the NVMe store (both I/O paths), through the transfer
// engine and the device cache; stalled and stopped ranks in thread_comm; failed writes, fsyncs and renames in
// write_file_atomically. Every fault must end in a clear error or a correct retry, never in wrong data.
#include <chunkwise/backend.hpp>
#include <chunkwise/comm.hpp>
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/placement.hpp>
#include <chunkwise/testing.hpp>
#include <chunkwise/tier.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tier_test_support.hpp"

using namespace chunkwise;
using namespace chunkwise::testing;  // the fault injectors
using chunkwise::test::fill_random;
using chunkwise::test::matches_random;
using chunkwise::test::message_of;
using chunkwise::test::temp_dir;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Blocks of 256 KiB + 100 bytes in 64 KiB requests: 5 requests, the last one 4096 bytes (padded).
nvme_options faulty_store(const std::filesystem::path& dir, nvme_io_path path,
                          std::shared_ptr<nvme_fault_injector> faults, bool direct_io = true) {
  nvme_options options;
  options.directory = dir;
  options.block_bytes = 256 * KiB + 100;
  options.capacity = 3 * (256 * KiB + 4096);
  options.io_bytes = 64 * KiB;
  options.queue_depth = 4;
  options.path = path;
  options.faults = std::move(faults);
  options.direct_io = direct_io;
  return options;
}

// Runs `body` on a store of each I/O path: io_uring (skipped with a message where it is not built or not permitted)
// and the pread/pwrite thread pool, with O_DIRECT, and the thread pool once more through the page cache.
void on_both_paths(const std::filesystem::path& dir, const std::shared_ptr<nvme_fault_injector>& faults,
                   const std::function<void(nvme_tier&)>& body) {
  const std::pair<nvme_io_path, bool> variants[] = {
      {nvme_io_path::io_uring, true}, {nvme_io_path::threads, true}, {nvme_io_path::threads, false}};
  for (const auto& [path, direct] : variants) {
    faults->clear();
    std::unique_ptr<nvme_tier> store;
    try {
      store = std::make_unique<nvme_tier>(faulty_store(dir, path, faults, direct));
    } catch (const chunkwise::error& e) {
      if (path != nvme_io_path::io_uring || e.code() != error_code::unsupported) throw;
      MESSAGE("io_uring case skipped: " << e.what());
      continue;
    }
    CAPTURE(store->describe());
    body(*store);
  }
}

// The bytes of `block` in the store file, read behind the store's back.
std::vector<unsigned char> bytes_on_disk(const nvme_tier& store, nvme_block block, byte_count bytes) {
  std::vector<unsigned char> out(bytes);
  const int fd = ::open(store.file().c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::pread(fd, out.data(), bytes, static_cast<off_t>(store.file_offset(block))) ==
          static_cast<ssize_t>(bytes));
  ::close(fd);
  return out;
}

// A pinned, aligned buffer of one block.
struct staging {
  pinned_host_tier tier{1 * MiB};
  byte_count bytes;
  void* data;
  explicit staging(byte_count b) : bytes(round_up(b, nvme_tier::io_alignment)), data(tier.allocate_sync(bytes, 4096)) {}
  staging(const staging&) = delete;
  staging& operator=(const staging&) = delete;
  ~staging() { tier.deallocate_sync(data, bytes, 4096); }
};

}  // namespace

TEST_CASE("short reads and writes are resumed until every byte moved, on both I/O paths") {
  temp_dir dir;
  auto faults = std::make_shared<nvme_fault_injector>();
  on_both_paths(dir.path(), faults, [&](nvme_tier& store) {
    const byte_count bytes = store.block_bytes();
    staging buffer(bytes);
    const nvme_block block = store.allocate_sync(bytes);
    // Writes: request 0 short three times by 1000 bytes (unaligned: resumed from the last 4 KiB boundary), request 4
    // (the 4096-byte tail) short once by 4095. Reads: request 2 short twice by 64 KiB - 4096, request 3 by 1 byte.
    faults->add({.fault = nvme_fault::short_by(1000), .op = nvme_op::write, .request = 0, .times = 3});
    faults->add({.fault = nvme_fault::short_by(4095), .op = nvme_op::write, .request = 4});
    faults->add({.fault = nvme_fault::short_by(64 * KiB - 4096), .op = nvme_op::read, .request = 2, .times = 2});
    faults->add({.fault = nvme_fault::short_by(1), .op = nvme_op::read, .request = 3});
    fill_random(buffer.data, bytes, 7);
    store.write(block, buffer.data, bytes);
    CHECK(faults->injected() == 4);
    CHECK(matches_random(buffer.data, bytes, 7));  // the source is untouched
    const auto disk = bytes_on_disk(store, block, bytes);
    CHECK(matches_random(disk.data(), bytes, 7));  // the file holds every byte
    std::memset(buffer.data, 0, buffer.bytes);
    store.read(block, buffer.data, bytes);
    CHECK(faults->injected() == 7);
    CHECK(matches_random(buffer.data, bytes, 7));

    // EINTR and EAGAIN are retried.
    faults->clear();
    faults->add({.fault = nvme_fault::fail(EINTR), .op = nvme_op::write, .request = 1, .times = 3});
    faults->add({.fault = nvme_fault::fail(EAGAIN), .op = nvme_op::read, .request = 4, .times = 3});
    fill_random(buffer.data, bytes, 8);
    store.write(block, buffer.data, bytes);
    std::memset(buffer.data, 0, buffer.bytes);
    store.read(block, buffer.data, bytes);
    CHECK(matches_random(buffer.data, bytes, 8));
    CHECK(faults->injected() == 6);
    fill_random(buffer.data, bytes, 7);
    store.write(block, buffer.data, bytes);

    // A request that keeps moving less than one aligned unit makes no progress: a bounded retry, then io_error.
    faults->clear();
    faults->add({.fault = nvme_fault::short_by(64 * KiB), .op = nvme_op::read, .request = 1, .times = 0});
    std::memset(buffer.data, 0, buffer.bytes);
    const std::string message = message_of([&] { store.read(block, buffer.data, bytes); });
    CAPTURE(message);
    CHECK(message.find("io_error") == 0);
    CHECK(contains(message, "read of block " + std::to_string(block.slot) + " request 1"));
    CHECK(contains(message, "made no progress in 16 attempts"));
    CHECK(contains(message, store.file().string()));
    faults->clear();  // a failed read harms nothing: the block reads back whole
    store.read(block, buffer.data, bytes);
    CHECK(matches_random(buffer.data, bytes, 7));
    store.deallocate_sync(block);
  });
}

TEST_CASE("retryable faults hitting several threads' requests in any order leave every block bit-exact") {
  temp_dir dir;
  auto faults = std::make_shared<nvme_fault_injector>();
  on_both_paths(dir.path(), faults, [&](nvme_tier& store) {
    // Each rule is spent after a few attempts, in whatever order the threads reach it: at most 12 attempts of one
    // request make no progress, under the store's bound of 16.
    faults->add({.fault = nvme_fault::short_by(1000), .times = 8});
    faults->add({.fault = nvme_fault::fail(EAGAIN), .skip = 3, .times = 4});
    faults->add({.fault = nvme_fault::sleep(std::chrono::milliseconds(1)), .skip = 5, .times = 8});
    faults->add({.fault = nvme_fault::short_by(64 * KiB - 8192), .op = nvme_op::read, .skip = 2, .times = 8});
    const byte_count bytes = store.block_bytes();
    std::vector<nvme_block> blocks;
    for (std::uint32_t b = 0; b < store.block_count(); ++b) blocks.push_back(store.allocate_sync(bytes));
    std::vector<int> good(blocks.size(), 0);
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < blocks.size(); ++t) {
      workers.emplace_back([&, t] {
        staging buffer(bytes);
        for (std::uint64_t round = 0; round < 4; ++round) {
          const std::uint64_t seed = 1000 * round + t;
          fill_random(buffer.data, bytes, seed);
          store.write(blocks[t], buffer.data, bytes);
          std::memset(buffer.data, 0, buffer.bytes);
          store.read(blocks[t], buffer.data, bytes);
          good[t] += matches_random(buffer.data, bytes, seed) ? 1 : 0;
        }
      });
    }
    for (auto& worker : workers) worker.join();
    for (std::size_t t = 0; t < blocks.size(); ++t) CHECK(good[t] == 4);
    CHECK(faults->injected() == 28);  // every rule spent
    for (auto block : blocks) store.deallocate_sync(block);
  });
}

TEST_CASE("EIO on a read fails it with io_error naming the call, block, file and errno; the block stays readable") {
  temp_dir dir;
  auto faults = std::make_shared<nvme_fault_injector>();
  on_both_paths(dir.path(), faults, [&](nvme_tier& store) {
    const byte_count bytes = store.block_bytes();
    staging buffer(bytes);
    const nvme_block first = store.allocate_sync(bytes);
    const nvme_block second = store.allocate_sync(bytes);
    fill_random(buffer.data, bytes, 1);
    store.write(first, buffer.data, bytes);
    fill_random(buffer.data, bytes, 2);
    store.write(second, buffer.data, bytes);
    faults->add({.fault = nvme_fault::fail(EIO), .op = nvme_op::read, .block = second.slot, .request = 1});
    const std::string message = message_of([&] { store.read(second, buffer.data, bytes); });
    CAPTURE(message);
    CHECK(message.find("io_error") == 0);
    CHECK(contains(message, "read of block " + std::to_string(second.slot) + " request 1"));
    CHECK(contains(message, store.file().string()));
    CHECK(contains(message, store.io_path() == nvme_io_path::io_uring ? "io_uring read failed" : "pread failed"));
    CHECK(contains(message, std::strerror(EIO)));
    CHECK(contains(message, "errno " + std::to_string(EIO)));
    // The retry reads the right bytes; the other block was never touched.
    std::memset(buffer.data, 0, buffer.bytes);
    store.read(second, buffer.data, bytes);
    CHECK(matches_random(buffer.data, bytes, 2));
    store.read(first, buffer.data, bytes);
    CHECK(matches_random(buffer.data, bytes, 1));
    CHECK(faults->injected() == 1);
  });
}

TEST_CASE("a write that fails (ENOSPC, EIO) leaves its block unreadable, never stale, and the others intact") {
  temp_dir dir;
  auto faults = std::make_shared<nvme_fault_injector>();
  for (const int error_number : {ENOSPC, EIO}) {
    CAPTURE(error_number);
    on_both_paths(dir.path(), faults, [&](nvme_tier& store) {
      const byte_count bytes = store.block_bytes();
      staging buffer(bytes);
      const nvme_block target = store.allocate_sync(bytes);
      const nvme_block other = store.allocate_sync(bytes);
      fill_random(buffer.data, bytes, 10);
      store.write(target, buffer.data, bytes);
      fill_random(buffer.data, bytes, 20);
      store.write(other, buffer.data, bytes);
      const auto other_before = bytes_on_disk(store, other, bytes);

      // The new contents of `target` fail at request 3 (after requests 0..2 may have reached the disk).
      faults->add({.fault = nvme_fault::fail(error_number), .op = nvme_op::write, .block = target.slot,
                    .request = 3});
      fill_random(buffer.data, bytes, 30);
      const std::string message = message_of([&] { store.write(target, buffer.data, bytes); });
      CAPTURE(message);
      CHECK(message.find("io_error") == 0);
      CHECK(contains(message, "write of block " + std::to_string(target.slot) + " request 3"));
      CHECK(contains(message, store.file().string()));
      CHECK(contains(message, store.io_path() == nvme_io_path::io_uring ? "io_uring write failed" : "pwrite failed"));
      CHECK(contains(message, std::strerror(error_number)));
      if (error_number == ENOSPC) {
        CHECK(contains(message, "disk full"));
        CHECK(contains(message, "still needed 65536 bytes"));
        CHECK(contains(message, "free"));
      }
      CHECK(matches_random(buffer.data, bytes, 30));  // the caller's bytes are untouched

      // The failed block is refused, loudly: its disk bytes are part old, part new.
      const std::string refused = message_of([&] { store.read(target, buffer.data, bytes); });
      CAPTURE(refused);
      CHECK(refused.find("io_error") == 0);
      CHECK(contains(refused, "block " + std::to_string(target.slot) + ", whose last write failed"));
      // Every other block is bit-identical, on disk and through the store.
      CHECK(bytes_on_disk(store, other, bytes) == other_before);
      std::memset(buffer.data, 0, buffer.bytes);
      store.read(other, buffer.data, bytes);
      CHECK(matches_random(buffer.data, bytes, 20));
      // Writing the block again (the fault is spent) makes it whole.
      fill_random(buffer.data, bytes, 30);
      store.write(target, buffer.data, bytes);
      std::memset(buffer.data, 0, buffer.bytes);
      store.read(target, buffer.data, bytes);
      CHECK(matches_random(buffer.data, bytes, 30));
      CHECK(faults->injected() == 1);
    });
  }
}

TEST_CASE("an io_uring submission the kernel refuses fails the I/O, retires the ring, and the next I/O works") {
  temp_dir dir;
  auto faults = std::make_shared<nvme_fault_injector>();
  std::unique_ptr<nvme_tier> store;
  try {
    store = std::make_unique<nvme_tier>(faulty_store(dir.path(), nvme_io_path::io_uring, faults));
  } catch (const chunkwise::error& e) {
    if (e.code() != error_code::unsupported) throw;
    MESSAGE("skipped: " << e.what());
    return;
  }
  const byte_count bytes = store->block_bytes();
  staging buffer(bytes);
  const nvme_block block = store->allocate_sync(bytes);
  fill_random(buffer.data, bytes, 40);
  store->write(block, buffer.data, bytes);
  // The first batch of the read (requests 0..3) is refused; then the second batch of a read, with requests in flight.
  for (const std::uint64_t skip : {0, 1}) {
    CAPTURE(skip);
    faults->clear();
    faults->add({.fault = nvme_fault::fail(EAGAIN), .op = nvme_op::submit, .skip = skip});
    const std::string message = message_of([&] { store->read(block, buffer.data, bytes); });
    CAPTURE(message);
    CHECK(message.find("io_error") == 0);
    CHECK(contains(message, "io_uring_submit took 0 of"));
    CHECK(contains(message, std::strerror(EAGAIN)));
    CHECK(contains(message, "read of block " + std::to_string(block.slot)));
    std::memset(buffer.data, 0, buffer.bytes);
    store->read(block, buffer.data, bytes);  // a fresh ring; nothing of the refused batch runs later
    CHECK(matches_random(buffer.data, bytes, 40));
  }
  // A refused write: the block is refused until written again.
  faults->clear();
  faults->add({.fault = nvme_fault::fail(EBUSY), .op = nvme_op::submit});
  fill_random(buffer.data, bytes, 41);
  CHECK(contains(message_of([&] { store->write(block, buffer.data, bytes); }), std::strerror(EBUSY)));
  CHECK(contains(message_of([&] { store->read(block, buffer.data, bytes); }), "whose last write failed"));
  fill_random(buffer.data, bytes, 41);
  store->write(block, buffer.data, bytes);
  std::memset(buffer.data, 0, buffer.bytes);
  store->read(block, buffer.data, bytes);
  CHECK(matches_random(buffer.data, bytes, 41));
}

TEST_CASE("delays on every request change only the time, never the bytes") {
  temp_dir dir;
  auto faults = std::make_shared<nvme_fault_injector>();
  on_both_paths(dir.path(), faults, [&](nvme_tier& store) {
    const byte_count bytes = store.block_bytes();
    staging buffer(bytes);
    const nvme_block block = store.allocate_sync(bytes);
    faults->add({.fault = nvme_fault::sleep(std::chrono::milliseconds(5)), .times = 0});
    const auto start = std::chrono::steady_clock::now();
    fill_random(buffer.data, bytes, 5);
    store.write(block, buffer.data, bytes);
    std::memset(buffer.data, 0, buffer.bytes);
    store.read(block, buffer.data, bytes);
    CHECK(matches_random(buffer.data, bytes, 5));
    CHECK(faults->injected() == 10);  // 5 requests each way
    // At least the longest chain of sleeps: 5 requests on queue_depth 4 ways means two rounds per direction.
    CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(20));
  });
}

TEST_CASE("ENOSPC from fallocate fails the store's construction with the bytes it needs and leaves no file") {
  temp_dir dir;
  auto faults = std::make_shared<nvme_fault_injector>();
  faults->add({.fault = nvme_fault::fail(ENOSPC), .op = nvme_op::allocate});
  const auto options = faulty_store(dir.path(), nvme_io_path::threads, faults);
  const std::string message = message_of([&] { nvme_tier store(options); });
  CAPTURE(message);
  CHECK(message.find("io_error") == 0);
  CHECK(contains(message, "fallocate failed"));
  CHECK(contains(message, std::strerror(ENOSPC)));
  CHECK(contains(message, "no space: the store needs " + format_bytes(3 * (256 * KiB + 4096))));
  CHECK(std::filesystem::is_empty(dir.path()));
  nvme_tier store(options);  // the fault is spent: the next store is made
  CHECK(store.block_count() == 3);
}

TEST_CASE("a faulty NVMe fetch surfaces as io_error at acquire; acquiring again after the fault returns the bytes") {
  temp_dir dir;
  auto faults = std::make_shared<nvme_fault_injector>();
  constexpr byte_count chunk = 64 * KiB;
  nvme_options options;
  options.directory = dir.path();
  options.block_bytes = chunk;
  options.capacity = 4 * chunk;
  options.io_bytes = 16 * KiB;
  options.faults = faults;
  nvme_tier store(options);
  CAPTURE(store.describe());
  pinned_host_tier pinned(1 * MiB);
  emulated_device_tier device(2 * chunk);
  host_backend backend;
  transfer_options engine_options;
  engine_options.staging_bytes = chunk;
  using engine_type = transfer_engine<host_backend, nvme_tier, pinned_host_tier>;
  engine_type engine(backend, store, pinned, engine_options);
  std::vector<nvme_block> homes;
  {
    staging buffer(chunk);
    for (std::uint32_t c = 0; c < 4; ++c) {
      homes.push_back(store.allocate_sync(chunk));
      fill_random(buffer.data, chunk, 100 + c);
      store.write(homes.back(), buffer.data, chunk);
    }
  }
  device_cache<engine_type, emulated_device_tier> cache(engine, device, homes, {0, 1, 2, 3},
                                                    {.blocks = 2, .chunk_bytes = chunk, .policy = eviction::lru,
                                                     .prefetch_depth = 0});
  // Chunk 2's fetch fails with EIO on its second request, every time, until the fault is cleared.
  faults->add({.fault = nvme_fault::fail(EIO), .op = nvme_op::read, .block = homes[2].slot, .request = 1,
               .times = 0});
  for (std::uint32_t c : {0u, 1u}) {
    CHECK(matches_random(cache.acquire(c), chunk, 100 + c));
    cache.release(c);
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::string message = message_of([&] { (void)cache.acquire(2); });
    CAPTURE(message);
    CHECK(message.find("io_error") == 0);
    CHECK(contains(message, "read of block " + std::to_string(homes[2].slot) + " request 1"));
    CHECK(contains(message, std::strerror(EIO)));
    CHECK(!cache.is_cached(2));
  }
  faults->clear();
  CHECK(matches_random(cache.acquire(2), chunk, 102));
  cache.release(2);

  // A dirty chunk whose write-back fails at flush: flush throws, the cached copy keeps the new bytes and stays dirty,
  // so the next flush, once the fault is gone, stores them.
  void* data = cache.acquire(3);
  fill_random(data, chunk, 200);
  cache.release(3, /*dirty=*/true);
  faults->add({.fault = nvme_fault::fail(EIO), .op = nvme_op::write, .block = homes[3].slot});
  CHECK(contains(message_of([&] { cache.flush(); }), std::strerror(EIO)));
  CHECK(matches_random(cache.acquire(3), chunk, 200));
  cache.release(3);  // not marked dirty again: the failed flush kept it dirty
  cache.flush();
  {
    staging buffer(chunk);
    store.read(homes[3], buffer.data, chunk);
    CHECK(matches_random(buffer.data, chunk, 200));
  }
  // A write-back that fails on eviction (nobody waits for it): the chunk's next fetch is refused, never stale.
  data = cache.acquire(3);
  fill_random(data, chunk, 300);
  cache.release(3, /*dirty=*/true);
  faults->add({.fault = nvme_fault::fail(EIO), .op = nvme_op::write, .block = homes[3].slot});
  for (std::uint32_t c : {0u, 1u}) {  // the two blocks go to chunks 0 and 1: chunk 3 is evicted and written back
    CHECK(matches_random(cache.acquire(c), chunk, 100 + c));
    cache.release(c);
  }
  CHECK(!cache.is_cached(3));
  const std::string refused = message_of([&] { (void)cache.acquire(3); });
  CAPTURE(refused);
  CHECK(refused.find("io_error") == 0);
  CHECK(contains(refused, "whose last write failed"));
}

namespace {

// Inputs of rank r: element i is r * 1000 + i (exact in fp32); the sum over ranks is exact too.
std::vector<float> input_of(int rank, std::size_t count) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>(rank * 1000 + static_cast<int>(i));
  return v;
}

float sum_at(int ranks, std::size_t i) {
  float total = 0;
  for (int r = 0; r < ranks; ++r) total += static_cast<float>(r * 1000 + static_cast<int>(i));
  return total;
}

constexpr float sentinel = -12345.0f;

}  // namespace

TEST_CASE("a rank stalled for less than the timeout delays the collective, the result is exact") {
  constexpr int ranks = 4;
  constexpr std::size_t count = 1000;
  auto faults = std::make_shared<thread_fault_injector>();
  faults->stall(2, 1, std::chrono::milliseconds(50));
  faults->stall(1, 2, std::chrono::milliseconds(30));
  thread_world world(ranks, std::chrono::milliseconds(2000), faults);
  std::vector<std::vector<float>> in, out;
  for (int r = 0; r < ranks; ++r) {
    in.push_back(input_of(r, count));
    out.emplace_back(count, sentinel);
  }
  std::vector<thread_comm::request> done;
  for (int r = 0; r < ranks; ++r) {
    auto comm = world.comm(r);
    done.push_back(comm.all_reduce(std::span<const float>(in[r]), std::span<float>(out[r]), reduce_op::sum));
    done.push_back(comm.barrier());
  }
  for (auto& request : done) request.wait();
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < count; ++i) REQUIRE(out[r][i] == sum_at(ranks, i));
}

TEST_CASE("a rank stalled past the timeout fails the collective on every rank, naming it, outputs untouched") {
  constexpr int ranks = 3;
  constexpr std::size_t count = 300;
  auto faults = std::make_shared<thread_fault_injector>();
  faults->stall(1, 2, std::chrono::milliseconds(800));  // 8 timeouts: no scheduler delay lets it arrive in time
  thread_world world(ranks, std::chrono::milliseconds(100), faults);
  std::vector<std::vector<float>> in, out;
  for (int r = 0; r < ranks; ++r) {
    in.push_back(input_of(r, count));
    out.emplace_back(count, sentinel);
  }
  // Operation #1 runs clean.
  std::vector<thread_comm::request> first, second;
  for (int r = 0; r < ranks; ++r)
    first.push_back(world.comm(r).all_reduce(std::span<const float>(in[r]), std::span<float>(out[r]), reduce_op::sum));
  for (auto& request : first) request.wait();
  for (int r = 0; r < ranks; ++r) {
    CHECK(out[r][count - 1] == sum_at(ranks, count - 1));
    std::fill(out[r].begin(), out[r].end(), sentinel);
  }
  // Operation #2: rank 1 sleeps 800 ms before arriving; the others give up after 100 ms.
  for (int r = 0; r < ranks; ++r)
    second.push_back(world.comm(r).all_reduce(std::span<const float>(in[r]), std::span<float>(out[r]), reduce_op::sum));
  for (int r = 0; r < ranks; ++r) {
    std::string message;
    error_code code = error_code::invalid_argument;
    try {
      second[r].wait();
    } catch (const chunkwise::error& e) {
      message = e.what();
      code = e.code();
    }
    CAPTURE(r);
    CAPTURE(message);
    CHECK(code == error_code::comm_error);
    CHECK(contains(message, "all_reduce #2"));
    CHECK(contains(message, "for rank 1, which has not arrived"));
  }
  for (int r = 0; r < ranks; ++r)
    CHECK(std::all_of(out[r].begin(), out[r].end(), [](float x) { return x == sentinel; }));
  // The group stays failed: the next operation throws at once on every rank.
  for (int r = 0; r < ranks; ++r) CHECK(contains(message_of([&] { world.comm(r).barrier().wait(); }), "group failed"));
}

TEST_CASE("a rank that stops fails its own request at once and its peers' at the timeout, outputs untouched") {
  constexpr int ranks = 3;
  constexpr std::size_t count = 50;
  auto faults = std::make_shared<thread_fault_injector>();
  faults->stop(2, 2);
  thread_world world(ranks, std::chrono::milliseconds(100), faults);
  std::vector<std::vector<float>> buffers;
  for (int r = 0; r < ranks; ++r) buffers.emplace_back(count, r == 0 ? 7.0f : sentinel);
  std::vector<thread_comm::request> first, second;
  for (int r = 0; r < ranks; ++r) first.push_back(world.comm(r).broadcast(std::span<float>(buffers[r]), 0));
  for (auto& request : first) request.wait();
  for (int r = 0; r < ranks; ++r) CHECK(buffers[r][count - 1] == 7.0f);
  for (int r = 1; r < ranks; ++r) std::fill(buffers[r].begin(), buffers[r].end(), sentinel);
  std::fill(buffers[0].begin(), buffers[0].end(), 9.0f);
  for (int r = 0; r < ranks; ++r) second.push_back(world.comm(r).broadcast(std::span<float>(buffers[r]), 0));
  const std::string stopped = message_of([&] { second[2].wait(); });
  CAPTURE(stopped);
  CHECK(stopped.find("comm_error") == 0);
  CHECK(contains(stopped, "rank 2 stopped before broadcast #2 (fault injected)"));
  for (int r = 0; r < 2; ++r) {
    const std::string message = message_of([&] { second[r].wait(); });
    CAPTURE(message);
    CHECK(message.find("comm_error") == 0);
    CHECK(contains(message, "for rank 2, which has not arrived"));
  }
  for (int r = 1; r < ranks; ++r)
    CHECK(std::all_of(buffers[r].begin(), buffers[r].end(), [](float x) { return x == sentinel; }));
}

TEST_CASE("faults reach communicators split from a faulty world") {
  constexpr int ranks = 4;
  auto faults = std::make_shared<thread_fault_injector>();
  faults->stop(1, 1, "world/1");  // rank 1 of the odd ranks' communicator (world rank 3)
  thread_world world(ranks, std::chrono::milliseconds(100), faults);
  std::vector<std::future<thread_comm>> parts;
  for (int r = 0; r < ranks; ++r)
    parts.push_back(std::async(std::launch::async, [&world, r] { return world.comm(r).split(r % 2, r); }));
  std::vector<thread_comm> comms;
  for (auto& part : parts) comms.push_back(part.get());
  std::vector<thread_comm::request> done;
  for (int r = 0; r < ranks; ++r) done.push_back(comms[r].barrier());
  done[0].wait();  // the even ranks' communicator is unharmed
  done[2].wait();
  CHECK(contains(message_of([&] { done[3].wait(); }), "rank 1 stopped before barrier #1"));
  CHECK(contains(message_of([&] { done[1].wait(); }), "thread_comm 'world/1': rank 0 waited 100 ms"));
}

TEST_CASE("a write, fsync or rename that fails leaves the old file whole and no temporary file behind") {
  temp_dir dir;
  const auto file = dir.path() / "state.bin";
  std::string old_contents(100'000, '\0');
  fill_random(old_contents.data(), old_contents.size(), 1);
  write_file_atomically(file, old_contents);
  std::string new_contents(150'000, '\0');
  fill_random(new_contents.data(), new_contents.size(), 2);
  const auto only_the_file = [&] {
    std::size_t entries = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      ++entries;
      CHECK(entry.path() == file);
    }
    return entries == 1;
  };

  SUBCASE("ENOSPC half way through the write") {
    atomic_write_faults faults;
    faults.write_fails_after = 70'000;
    const std::string message = message_of([&] { write_file_atomically(file, new_contents, &faults); });
    CAPTURE(message);
    CHECK(message.find("io_error") == 0);
    CHECK(contains(message, "write '" + file.string() + ".tmp."));
    CHECK(contains(message, std::strerror(ENOSPC)));
  }
  SUBCASE("EIO from fsync") {
    atomic_write_faults faults;
    faults.fsync_error = EIO;
    const std::string message = message_of([&] { write_file_atomically(file, new_contents, &faults); });
    CAPTURE(message);
    CHECK(contains(message, "fsync '"));
    CHECK(contains(message, std::strerror(EIO)));
  }
  SUBCASE("a rename that fails") {
    atomic_write_faults faults;
    faults.rename_error = EXDEV;
    const std::string message = message_of([&] { write_file_atomically(file, new_contents, &faults); });
    CAPTURE(message);
    CHECK(contains(message, "rename '" + file.string() + "' failed"));
    CHECK(contains(message, std::strerror(EXDEV)));
  }
  CHECK(read_file(file) == old_contents);
  CHECK(only_the_file());
  // Without faults the new contents replace the old.
  const atomic_write_faults none;
  write_file_atomically(file, new_contents, &none);
  CHECK(read_file(file) == new_contents);
  CHECK(only_the_file());
}
