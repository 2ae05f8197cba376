// Memory tiers, the NVMe store and the transfer engine on the host backend.
#include <chunkwise/backend.hpp>
#include <chunkwise/tier.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "contracts/memory_tier_contract.hpp"
#include "tier_test_support.hpp"

using namespace chunkwise;
using chunkwise::test::fill_random;
using chunkwise::test::matches_random;
using chunkwise::test::message_of;
using chunkwise::test::temp_dir;

namespace {

nvme_options small_store(const std::filesystem::path& dir, nvme_io_path path = nvme_io_path::automatic) {
  nvme_options options;
  options.directory = dir;
  options.block_bytes = 256 * KiB + 100;  // not a multiple of the I/O size or alignment
  options.capacity = 4 * (256 * KiB + 4096);
  options.io_bytes = 64 * KiB;
  options.queue_depth = 4;
  options.path = path;
  return options;
}

}  // namespace

namespace chunkwise::test {
template <class Tier>
struct host_tier_factory {
  static std::unique_ptr<Tier> make(byte_count budget) { return std::make_unique<Tier>(budget); }
  static host_stream& stream(Tier&) {
    static host_stream shared;
    return shared;
  }
  static void settle(Tier& tier) { stream(tier).synchronize(); }
};
template <> struct tier_factory<emulated_device_tier> : host_tier_factory<emulated_device_tier> {};
template <> struct tier_factory<pinned_host_tier> : host_tier_factory<pinned_host_tier> {};
template <> struct tier_factory<host_tier> : host_tier_factory<host_tier> {};
template <>
struct tier_factory<nvme_tier> {
  static std::unique_ptr<nvme_tier> make(byte_count budget) {
    static temp_dir dir;  // removed at exit, after every store in it
    nvme_options options;
    options.directory = dir.path();
    options.block_bytes = 64 * KiB;
    options.capacity = budget;
    options.io_bytes = 64 * KiB;
    return std::make_unique<nvme_tier>(options);
  }
  static immediate_stream stream(nvme_tier&) { return {}; }
  static void settle(nvme_tier&) {}
};
}  // namespace chunkwise::test

TEST_CASE_TEMPLATE_APPLY(memory_tier_contract,
                         std::tuple<emulated_device_tier, pinned_host_tier, host_tier, nvme_tier>);

TEST_CASE("crc32c gives the standard check value on both paths and chains") {
  const char* check = "123456789";
  CHECK(crc32c(check, 9) == 0xE3069283u);
  CHECK(crc32c_portable(check, 9) == 0xE3069283u);
  CHECK(crc32c(check + 4, 5, crc32c(check, 4)) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  std::vector<unsigned char> data(100008);  // room for the largest size at the largest offset
  fill_random(data.data(), data.size(), 7);
  for (std::size_t offset : {0, 1, 3, 7}) {
    for (std::size_t size : {0, 1, 7, 8, 9, 63, 4096, 100000}) {
      CHECK(crc32c(data.data() + offset, size) == crc32c_portable(data.data() + offset, size));
    }
  }
  MESSAGE("crc32c implementation: " << std::string(crc32c_implementation()));
}

TEST_CASE("tier properties and legal moves are known at compile time") {
  static_assert(has_property<emulated_device_tier, device_accessible>);
  static_assert(has_property<nvme_tier, file_backed>);
  static_assert(!has_property<nvme_tier, device_accessible>);
  static_assert(tier_access<space::device, space::pinned_host>::copyable);
  static_assert(tier_access<space::device, space::nvme>::staged);
  static_assert(!tier_access<space::device, space::nvme>::copyable);
  static_assert(tier_movable_v<space::nvme, space::host>);
  CHECK(true);
}

TEST_CASE_TEMPLATE("every memory tier round-trips random bytes through the device bit-exactly", Home, pinned_host_tier,
                   host_tier, emulated_device_tier) {
  host_backend backend;
  emulated_device_tier device(8 * MiB);
  Home home(8 * MiB);
  transfer_engine<host_backend, Home> engine(backend, home);
  const byte_count bytes = 3 * MiB + 17;
  void* source = home.allocate_sync(bytes, 0);
  void* block = device.allocate_sync(bytes, 0);
  void* back = home.allocate_sync(bytes, 0);
  fill_random(source, bytes, 42);
  std::memset(block, 0, bytes);
  auto fetched = engine.fetch(block, source, bytes);
  fetched.wait();
  CHECK(matches_random(block, bytes, 42));
  transfer<host_backend> after[] = {fetched};
  engine.write_back(back, block, bytes, after).wait();
  CHECK(matches_random(back, bytes, 42));
  CHECK(home.stats().bytes_read == bytes);
  CHECK(home.stats().bytes_written == bytes);
  CHECK(home.stats().in_use == 2 * bytes);
  CHECK(engine.stats().bytes_fetched == bytes);
  CHECK(engine.stats().bytes_written_back == bytes);
  home.deallocate_sync(source, bytes, 0);
  home.deallocate_sync(back, bytes, 0);
  device.deallocate(backend.h2d(), block, bytes, 0);  // stream-ordered free
  backend.synchronize(backend.h2d());
  CHECK(device.stats().in_use == 0);
  CHECK(device.stats().peak == bytes);
}

TEST_CASE("a tier past its budget throws out_of_memory naming the bytes asked, in use and the budget") {
  emulated_device_tier device(10 * MiB);
  void* first = device.allocate_sync(6 * MiB, 0);
  const std::string message = message_of([&] { (void)device.allocate_sync(5 * MiB, 0); });
  CHECK(message.find("out_of_memory") == 0);
  CHECK(message.find(std::to_string(5 * MiB)) != std::string::npos);   // asked
  CHECK(message.find(std::to_string(6 * MiB)) != std::string::npos);   // in use
  CHECK(message.find(std::to_string(10 * MiB)) != std::string::npos);  // budget
  CHECK(message.find("4.00 MiB free") != std::string::npos);
  CHECK(device.stats().in_use == 6 * MiB);  // the failed allocation took nothing
  device.deallocate_sync(first, 6 * MiB, 0);
  pinned_host_tier pinned(1 * MiB);
  CHECK(message_of([&] { (void)pinned.allocate_sync(2 * MiB, 0); }).find("out_of_memory") == 0);
  CHECK(message_of([&] { (void)pinned.allocate_sync(64, 3); }).find("invalid_argument") == 0);
}

TEST_CASE("a host tier reuses a freed block of the same size and keeps no more than its peak") {
  emulated_device_tier device(64 * MiB);
  void* first = device.allocate_sync(3 * MiB, 0);
  std::memset(first, 1, 3 * MiB);
  device.deallocate_sync(first, 3 * MiB, 0);
  CHECK(device.stats().in_use == 0);  // back to the budget at once, whether or not its memory is kept
  void* again = device.allocate_sync(3 * MiB, 0);
  if (detail::keep_freed_blocks) CHECK(again == first);  // the same mapping: no page is faulted in again
  CHECK(device.stats().in_use == 3 * MiB);
  void* other = device.allocate_sync(1 * MiB, 0);  // another size: a new block
  CHECK(other != again);
  device.deallocate_sync(again, 3 * MiB, 0);
  device.deallocate_sync(other, 1 * MiB, 0);
  // 4 MiB were in use at once: a 4 MiB block now takes the place of the cached ones rather than adding to them.
  void* big = device.allocate_sync(4 * MiB, 0);
  CHECK(device.stats().peak == 4 * MiB);
  void* small = device.allocate_sync(1 * MiB, 0);  // its cached block was handed back to make room for `big`
  CHECK(device.stats().peak == 5 * MiB);
  device.deallocate_sync(big, 4 * MiB, 0);
  device.deallocate_sync(small, 1 * MiB, 0);
  // the budget still refuses what does not fit, cached blocks or not
  CHECK(message_of([&] { (void)device.allocate_sync(65 * MiB, 0); }).find("out_of_memory") == 0);
}

TEST_CASE("the NVMe store round-trips random blocks bit-exactly on io_uring and on the thread pool") {
  temp_dir dir;
  for (auto path : {nvme_io_path::automatic, nvme_io_path::threads}) {
    nvme_tier store(small_store(dir.path(), path));
    CAPTURE(store.describe());
    if (path == nvme_io_path::threads) CHECK(store.io_path() == nvme_io_path::threads);
#if CHUNKWISE_HAS_URING
    if (path == nvme_io_path::automatic && store.io_path() != nvme_io_path::io_uring)
      MESSAGE("io_uring is not permitted here: " << store.describe());
#endif
    MESSAGE(store.describe());
    CHECK(store.block_count() == 4);
    pinned_host_tier pinned(4 * MiB);
    const byte_count bytes = store.block_bytes();
    const byte_count buffer_bytes = round_up(bytes, nvme_tier::io_alignment);
    std::vector<nvme_block> blocks;
    for (int b = 0; b < 4; ++b) blocks.push_back(store.allocate_sync(bytes));
    void* buffer = pinned.allocate_sync(buffer_bytes, 4096);
    for (int b = 0; b < 4; ++b) {
      fill_random(buffer, bytes, 100 + b);
      store.write(blocks[b], buffer, bytes);
    }
    for (int b = 3; b >= 0; --b) {
      std::memset(buffer, 0, buffer_bytes);
      store.read(blocks[b], buffer, bytes);
      CHECK(matches_random(buffer, bytes, 100 + b));
    }
    CHECK(store.stats().bytes_written == 4 * bytes);
    CHECK(store.stats().bytes_read == 4 * bytes);
    CHECK(store.stats().in_use == 4 * store.slot_bytes());
    // A fifth block does not fit: out_of_memory with the store's numbers.
    const std::string full = message_of([&] { (void)store.allocate_sync(bytes); });
    CHECK(full.find("out_of_memory") == 0);
    CHECK(full.find("NVMe") != std::string::npos);
    CHECK(message_of([&] { (void)store.allocate_sync(bytes + 1); }).find("invalid_argument") == 0);
    // Reads need the byte count written, an aligned buffer, and a written block.
    CHECK(message_of([&] { store.read(blocks[0], buffer, bytes - 1); }).find("invalid_argument") == 0);
    CHECK(message_of([&] { store.read(blocks[0], static_cast<char*>(buffer) + 512, bytes); })
              .find("not aligned") != std::string::npos);
    store.deallocate_sync(blocks[3]);
    blocks[3] = store.allocate_sync(bytes);
    CHECK(message_of([&] { store.read(blocks[3], buffer, bytes); }).find("illegal_state") == 0);
    for (auto block : blocks) store.deallocate_sync(block);
    CHECK(store.stats().in_use == 0);
    CHECK(message_of([&] { store.deallocate_sync(blocks[0]); }).find("not allocated") != std::string::npos);
    CHECK(message_of([&] { store.read(blocks[0], buffer, bytes); }).find("illegal_state") == 0);
    pinned.deallocate_sync(buffer, buffer_bytes, 4096);
    CHECK(std::filesystem::exists(store.file()));
  }
  CHECK(std::filesystem::is_empty(dir.path()));  // stores remove their files
}

TEST_CASE("one NVMe store serves reads and writes from several threads at once") {
  temp_dir dir;
  for (auto path : {nvme_io_path::automatic, nvme_io_path::threads}) {
    auto options = small_store(dir.path(), path);
    options.capacity = 8 * (256 * KiB + 4096);
    nvme_tier store(options);
    pinned_host_tier pinned(8 * MiB);
    const byte_count bytes = store.block_bytes();
    const byte_count padded = round_up(bytes, nvme_tier::io_alignment);
    std::vector<nvme_block> blocks;
    for (int b = 0; b < 8; ++b) blocks.push_back(store.allocate_sync(bytes));
    std::vector<std::thread> workers;
    std::vector<int> good(4, 0);
    std::vector<double> call_seconds(4, 0.0);  // each thread's time inside the store's calls
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < 4; ++t) {
      workers.emplace_back([&, t] {
        void* buffer = pinned.allocate_sync(padded, 4096);
        for (int round = 0; round < 5; ++round) {  // each thread owns blocks t and t + 4
          for (int b : {t, t + 4}) {
            const std::uint64_t seed = 1000u * static_cast<std::uint64_t>(round) + static_cast<std::uint64_t>(b);
            fill_random(buffer, bytes, seed);
            const auto before_write = std::chrono::steady_clock::now();
            store.write(blocks[b], buffer, bytes);
            const auto after_write = std::chrono::steady_clock::now();
            std::memset(buffer, 0, padded);
            const auto before_read = std::chrono::steady_clock::now();
            store.read(blocks[b], buffer, bytes);
            call_seconds[t] += std::chrono::duration<double>(after_write - before_write).count() +
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - before_read).count();
            good[t] += matches_random(buffer, bytes, seed) ? 1 : 0;
          }
        }
        pinned.deallocate_sync(buffer, padded, 4096);
      });
    }
    for (auto& worker : workers) worker.join();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int t = 0; t < 4; ++t) CHECK(good[t] == 10);
    CHECK(store.stats().bytes_written == 40 * bytes);
    // The drive's busy time counts overlapping calls once: within the wall time, at least the longest thread's
    // calls, at most all threads' calls together.
    const double busy = store.stats().busy_seconds;
    CHECK(busy <= wall);
    CHECK(busy >= *std::max_element(call_seconds.begin(), call_seconds.end()) * 0.99);
    CHECK(busy <= (call_seconds[0] + call_seconds[1] + call_seconds[2] + call_seconds[3]) * 1.01);
    for (auto block : blocks) store.deallocate_sync(block);
  }
}

namespace {
struct manual_clock {
  using duration = std::chrono::milliseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<manual_clock>;
  static constexpr bool is_steady = true;
  static inline time_point current{};
  static time_point now() noexcept { return current; }
  static void at(int ms) { current = time_point(duration(ms)); }
};
}  // namespace

TEST_CASE("a drive's busy clock counts overlapping requests once and idle gaps not at all") {
  detail::basic_busy_clock<manual_clock> clock;
  manual_clock::at(0);
  {
    const auto a = clock.busy();  // 0..80 ms
    manual_clock::at(20);
    {
      const auto b = clock.busy();  // 20..50 ms, inside a
      manual_clock::at(50);
    }
    CHECK(clock.seconds() == doctest::Approx(0.050));  // still open: a's interval so far
    manual_clock::at(80);
  }
  CHECK(clock.seconds() == doctest::Approx(0.080));
  manual_clock::at(200);  // idle 80..200 ms
  CHECK(clock.seconds() == doctest::Approx(0.080));
  {
    const auto c = clock.busy();  // 200..230 ms
    manual_clock::at(230);
  }
  CHECK(clock.seconds() == doctest::Approx(0.110));
}

TEST_CASE("a corrupted NVMe block is reported by its checksum, never returned as data") {
  temp_dir dir;
  for (auto path : {nvme_io_path::automatic, nvme_io_path::threads}) {
    nvme_tier store(small_store(dir.path(), path));
    pinned_host_tier pinned(1 * MiB);
    const byte_count bytes = store.block_bytes();
    void* buffer = pinned.allocate_sync(round_up(bytes, 4096), 4096);
    const nvme_block first = store.allocate_sync(bytes);
    const nvme_block second = store.allocate_sync(bytes);
    fill_random(buffer, bytes, 1);
    store.write(first, buffer, bytes);
    fill_random(buffer, bytes, 2);
    store.write(second, buffer, bytes);
    {  // flip one byte of the second block's third request behind the store's back
      const int fd = ::open(store.file().c_str(), O_RDWR);
      REQUIRE(fd >= 0);
      const auto offset = static_cast<off_t>(store.file_offset(second) + 2 * 64 * KiB + 1234);
      unsigned char byte = 0;
      REQUIRE(::pread(fd, &byte, 1, offset) == 1);
      byte = static_cast<unsigned char>(byte ^ 0x20u);
      REQUIRE(::pwrite(fd, &byte, 1, offset) == 1);
      ::fsync(fd);
      ::close(fd);
    }
    std::memset(buffer, 0, bytes);
    store.read(first, buffer, bytes);  // the other block is intact
    CHECK(matches_random(buffer, bytes, 1));
    const std::string message = message_of([&] { store.read(second, buffer, bytes); });
    CAPTURE(message);
    CHECK(message.find("io_error") == 0);
    CHECK(message.find("checksum mismatch in block " + std::to_string(second.slot) + " request 2") !=
          std::string::npos);
    // Through the engine, the fetch's completion carries the error.
    host_backend backend;
    emulated_device_tier device(1 * MiB);
    transfer_options options;
    options.staging_bytes = bytes;
    transfer_engine<host_backend, nvme_tier, pinned_host_tier> engine(backend, store, pinned, options);
    void* block = device.allocate_sync(bytes, 0);
    auto fetch = engine.fetch(block, second, bytes);
    CHECK(message_of([&] { fetch.wait(); }).find("checksum mismatch") != std::string::npos);
    engine.fetch(block, first, bytes).wait();
    CHECK(matches_random(block, bytes, 1));
    device.deallocate_sync(block, bytes, 0);
    pinned.deallocate_sync(buffer, round_up(bytes, 4096), 4096);
  }
}

TEST_CASE("an NVMe store that cannot be created fails at construction with a message") {
  temp_dir dir;
  SUBCASE("missing directory") {
    auto options = small_store(dir.path() / "no" / "such" / "dir");
    const std::string message = message_of([&] { nvme_tier store(options); });
    CHECK(message.find("io_error") == 0);
    CHECK(message.find("does not exist") != std::string::npos);
    CHECK(message.find((dir.path() / "no").string()) != std::string::npos);
  }
  SUBCASE("not a directory") {
    const auto file = dir.path() / "plain-file";
    { std::FILE* f = std::fopen(file.c_str(), "w"); REQUIRE(f != nullptr); std::fclose(f); }
    CHECK(message_of([&] { nvme_tier store(small_store(file)); }).find("not a directory") != std::string::npos);
  }
  SUBCASE("bad options") {
    auto options = small_store(dir.path());
    options.capacity = 100;
    CHECK(message_of([&] { nvme_tier store(options); }).find("holds no block") != std::string::npos);
    options = small_store(dir.path());
    options.io_bytes = 1000;
    CHECK(message_of([&] { nvme_tier store(options); }).find("io_bytes") != std::string::npos);
  }
  SUBCASE("disk full: a store larger than the free space") {
    auto options = small_store(dir.path());
    options.capacity = 1024 * TiB;
    const std::string message = message_of([&] { nvme_tier store(options); });
    CHECK(message.find("io_error") == 0);
    CHECK(message.find("no space") != std::string::npos);
    CHECK(message.find("1024.00 TiB") != std::string::npos);
    CHECK(std::filesystem::is_empty(dir.path()));
  }
  SUBCASE("disk full: a file size limit below the store's size") {
    // In a child, so the limit does not leak into the other tests. SIGXFSZ keeps its default action (kill): the
    // store must see the limit before fallocate would raise it.
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::close(pipe_fds[0]);
      const rlimit limit{512 * KiB, 512 * KiB};
      ::setrlimit(RLIMIT_FSIZE, &limit);
      int status = 3;
      std::string text = "no error";
      try {
        nvme_tier store(small_store(dir.path()));
      } catch (const chunkwise::error& e) {
        text = e.what();
        status = e.code() == error_code::io_error ? 0 : 2;
      }
      (void)!::write(pipe_fds[1], text.data(), text.size());
      ::_exit(status);
    }
    ::close(pipe_fds[1]);
    std::string text;
    char part[512];
    for (ssize_t n; (n = ::read(pipe_fds[0], part, sizeof part)) > 0;) text.append(part, static_cast<std::size_t>(n));
    ::close(pipe_fds[0]);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CAPTURE(text);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(text.find("RLIMIT_FSIZE") != std::string::npos);
    CHECK(text.find(std::to_string(4 * (256 * KiB + 4096))) != std::string::npos);  // the bytes it needs
    CHECK(std::filesystem::is_empty(dir.path()));  // the failed store removed its file
  }
}

namespace {
// A compute phase the caller runs while a transfer is in flight: slices of arithmetic, polling (never waiting on)
// the transfer between slices. Returns the number of slices run before the transfer was seen complete, or -1.
template <class Transfer>
long compute_until_ready(const Transfer& pending, double& sink) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  long slices = 0;
  double acc = sink;
  while (std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < 20000; ++i) acc = acc * 0.999999 + 1e-9 * i;
    ++slices;
    if (pending.ready()) {
      sink = acc;
      return slices;
    }
  }
  sink = acc;
  return -1;
}
}  // namespace

TEST_CASE("a fetch issued before a compute phase completes during it (host backend, worker threads)") {
  host_backend backend;
  emulated_device_tier device(80 * MiB);
  double sink = 1.0;
  const byte_count bytes = 32 * MiB;
  void* block = device.allocate_sync(bytes, 0);
  SUBCASE("pinned host home") {
    pinned_host_tier home(40 * MiB);
    transfer_engine<host_backend, pinned_host_tier> engine(backend, home);
    void* source = home.allocate_sync(bytes, 0);
    fill_random(source, bytes, 5);
    auto pending = engine.fetch(block, source, bytes);
    const long slices = compute_until_ready(pending, sink);  // the caller computes; it never calls wait()
    CHECK(slices > 0);
    CHECK(matches_random(block, bytes, 5));
    home.deallocate_sync(source, bytes, 0);
  }
  SUBCASE("NVMe home through pinned staging") {
    temp_dir dir;
    nvme_options options;
    options.directory = dir.path();
    options.block_bytes = bytes;
    options.capacity = bytes;
    nvme_tier home(options);
    pinned_host_tier pinned(80 * MiB);
    transfer_options engine_options;
    engine_options.staging_bytes = bytes;
    transfer_engine<host_backend, nvme_tier, pinned_host_tier> engine(backend, home, pinned, engine_options);
    const nvme_block stored = home.allocate_sync(bytes);
    fill_random(block, bytes, 6);
    engine.write_back(stored, block, bytes).wait();
    std::memset(block, 0, bytes);
    auto pending = engine.fetch(block, stored, bytes);
    const long slices = compute_until_ready(pending, sink);
    CHECK(slices > 0);
    pending.wait();
    CHECK(matches_random(block, bytes, 6));
    CHECK(home.stats().bytes_read == bytes);
  }
  device.deallocate_sync(block, bytes, 0);
  CHECK(sink != 0.0);
}

TEST_CASE("the engine keeps bytes in flight under its bound and orders dependent moves") {
  host_backend backend;
  pinned_host_tier home(16 * MiB);
  emulated_device_tier device(16 * MiB);
  transfer_options options;
  options.max_bytes_in_flight = 2 * MiB;
  transfer_engine<host_backend, pinned_host_tier> engine(backend, home, options);
  const byte_count bytes = 1 * MiB;
  std::vector<void*> sources, blocks;
  for (int i = 0; i < 8; ++i) {
    sources.push_back(home.allocate_sync(bytes, 0));
    blocks.push_back(device.allocate_sync(bytes, 0));
    fill_random(sources.back(), bytes, 200 + i);
  }
  std::vector<transfer<host_backend>> pending;
  for (int i = 0; i < 8; ++i) {
    pending.push_back(engine.fetch(blocks[i], sources[i], bytes));
    CHECK(engine.bytes_in_flight() <= options.max_bytes_in_flight);
  }
  for (auto& t : pending) t.wait();
  for (int i = 0; i < 8; ++i) CHECK(matches_random(blocks[i], bytes, 200 + i));
  // Write block 0 back to source 1, then fetch source 1 into block 2 after it: block 2 must see block 0's bytes.
  auto written = engine.write_back(sources[1], blocks[0], bytes);
  transfer<host_backend> after[] = {written};
  engine.fetch(blocks[2], sources[1], bytes, after).wait();
  CHECK(matches_random(blocks[2], bytes, 200));
  CHECK(engine.bytes_in_flight() == 0);
  MESSAGE("bound stalls: " << engine.stats().bound_stalls);
  for (int i = 0; i < 8; ++i) {
    home.deallocate_sync(sources[i], bytes, 0);
    device.deallocate_sync(blocks[i], bytes, 0);
  }
}
