#pragma once
// The backend contract (backend/concepts.hpp), for every backend: `backend_factory<B>` builds one and gives the
// suite "device" memory (the concept itself allocates nothing: tiers do),
//   static std::unique_ptr<B> make();
//   using buffer = ...;                                   an owner of device bytes
//   static buffer allocate(B&, byte_count);
//   static void* data(buffer&);
//   static std::vector<std::byte> read(B&, const buffer&); a synchronous copy to the host, outside the streams
// and TEST_CASE_TEMPLATE_APPLY(backend_contract, std::tuple<B1, ...>) runs the suite.
//
// What it holds a backend to, as the concept promises (CUDA stream and event semantics):
// - copies on one stream run in issue order (a later copy overwrites an earlier one; a copy reads what an earlier
//   one wrote), of any size including 0;
// - record(stream) completes once the work queued before it has run: after wait(event) that work is visible, and
//   every event recorded earlier on the stream is ready; ready() turns true by itself, without a wait;
// - wait_on(stream, event) orders later work on `stream` after the event, without blocking the caller: a buffer
//   handed back and forth between h2d and d2h forty times arrives intact each time;
// - synchronize(stream) returns once everything queued on it has run; a default event is complete, and waiting on
//   it (or on an empty stream's event) costs nothing; bind_thread works on any thread.
#include <chunkwise/backend/concepts.hpp>
#include <chunkwise/core/bytes.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

namespace chunkwise::test {

template <class Backend>
struct backend_factory;  // make(), buffer, allocate(B&, bytes), data(buffer&), read(B&, const buffer&)

namespace backend_contract {

inline std::vector<std::byte> random_bytes(std::size_t count, std::uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<std::byte> bytes(count);
  for (auto& b : bytes) b = static_cast<std::byte>(generator() >> 24);
  return bytes;
}

}  // namespace backend_contract
}  // namespace chunkwise::test

TEST_CASE_TEMPLATE_DEFINE("backend contract: stream order, events, cross-stream waits and synchronize", Backend,
                          backend_contract) {
  using namespace chunkwise;
  using factory = chunkwise::test::backend_factory<Backend>;
  using chunkwise::test::backend_contract::random_bytes;
  using namespace std::chrono_literals;
  static_assert(backend<Backend>);
  CHECK(std::string_view(Backend::name).size() > 0);
  auto backend_ptr = factory::make();
  Backend& b = *backend_ptr;

  SUBCASE("a default event is complete, and so is an event recorded on an idle stream") {
    const typename Backend::event_type none{};
    CHECK(b.ready(none));
    b.wait(none);
    b.wait_on(b.h2d(), none);  // nothing to wait for: later work runs
    const auto idle = b.record(b.d2h());
    b.wait(idle);
    CHECK(b.ready(idle));
    b.synchronize(b.h2d());
    b.synchronize(b.d2h());
  }

  SUBCASE("a round trip through device memory returns the bytes, for any size") {
    for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{(256 << 10) + 3}}) {
      CAPTURE(size);
      // One byte more than is copied: real pointers even for 0 bytes, and a byte that must stay as it was.
      const auto in = random_bytes(size + 1, static_cast<std::uint32_t>(size + 1));
      std::vector<std::byte> out(size + 1, std::byte{0x5a});
      auto device = factory::allocate(b, size + 1);
      b.copy_async(b.h2d(), factory::data(device), in.data(), size);
      const auto uploaded = b.record(b.h2d());
      b.wait_on(b.d2h(), uploaded);
      b.copy_async(b.d2h(), out.data(), factory::data(device), size);
      const auto downloaded = b.record(b.d2h());
      b.wait(downloaded);
      CHECK(b.ready(downloaded));
      CHECK(b.ready(uploaded));  // d2h waited for it, and d2h's work is done
      CHECK(std::memcmp(out.data(), in.data(), size) == 0);
      CHECK(out[size] == std::byte{0x5a});
    }
  }

  SUBCASE("copies on one stream run in issue order") {
    constexpr std::size_t big = 1 << 20, small = 4096;
    const auto a = random_bytes(big, 1), c = random_bytes(small, 2);
    auto d = factory::allocate(b, big), e = factory::allocate(b, big);
    auto& s = b.h2d();
    b.copy_async(s, factory::data(d), a.data(), big);                 // a long copy...
    b.copy_async(s, factory::data(d), c.data(), small);               // ...then a short one over its start
    b.copy_async(s, factory::data(e), factory::data(d), big);         // then a copy that reads the result
    const auto done = b.record(s);
    b.wait(done);
    auto expected = a;
    std::memcpy(expected.data(), c.data(), small);
    CHECK(factory::read(b, d) == expected);
    CHECK(factory::read(b, e) == expected);
  }

  SUBCASE("an event completes after the work queued before it, and after every earlier event") {
    constexpr std::size_t size = 512 << 10;
    const auto a = random_bytes(size, 3);
    std::vector<std::byte> out(size);
    auto d = factory::allocate(b, size);
    auto& s = b.h2d();
    std::vector<typename Backend::event_type> events;
    for (int round = 0; round < 8; ++round) {
      b.copy_async(s, factory::data(d), a.data(), size);
      events.push_back(b.record(s));
    }
    b.copy_async(s, out.data(), factory::data(d), size);
    events.push_back(b.record(s));
    // Polling alone brings the last event to completion (no wait call), within a generous time.
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!b.ready(events.back()) && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    REQUIRE(b.ready(events.back()));
    for (const auto& event : events) CHECK(b.ready(event));
    CHECK(out == a);
    b.wait(events.front());  // waiting again on completed events returns
    b.wait(events.back());
  }

  SUBCASE("synchronize returns once every copy queued on the stream has run") {
    constexpr std::size_t size = 64 << 10;
    std::vector<std::vector<std::byte>> sources, targets;
    for (std::uint32_t i = 0; i < 16; ++i) {
      sources.push_back(random_bytes(size, 100 + i));
      targets.emplace_back(size);
    }
    auto& s = b.d2h();
    const auto before = b.record(s);
    for (std::size_t i = 0; i < sources.size(); ++i) b.copy_async(s, targets[i].data(), sources[i].data(), size);
    b.synchronize(s);
    CHECK(b.ready(before));
    for (std::size_t i = 0; i < sources.size(); ++i) CHECK(targets[i] == sources[i]);
  }

  SUBCASE("wait_on orders work across streams both ways") {
    // One device buffer handed back and forth: h2d writes it after d2h has read the last contents (write after
    // read), d2h reads it after h2d has written it (read after write). Without the waits the copies race.
    constexpr std::size_t size = 256 << 10;
    constexpr int rounds = 40;
    std::vector<std::vector<std::byte>> sources, results(rounds, std::vector<std::byte>(size));
    for (int i = 0; i < rounds; ++i) sources.push_back(random_bytes(size, 500u + static_cast<std::uint32_t>(i)));
    auto device = factory::allocate(b, size);
    typename Backend::event_type read_back{};
    for (int i = 0; i < rounds; ++i) {
      b.wait_on(b.h2d(), read_back);
      b.copy_async(b.h2d(), factory::data(device), sources[static_cast<std::size_t>(i)].data(), size);
      const auto written = b.record(b.h2d());
      b.wait_on(b.d2h(), written);
      b.copy_async(b.d2h(), results[static_cast<std::size_t>(i)].data(), factory::data(device), size);
      read_back = b.record(b.d2h());
    }
    b.wait(read_back);
    int wrong = 0;
    for (int i = 0; i < rounds; ++i)
      if (results[static_cast<std::size_t>(i)] != sources[static_cast<std::size_t>(i)]) ++wrong;
    CHECK(wrong == 0);
  }

  SUBCASE("bind_thread may be called on any thread, and work issued there joins the stream's order") {
    b.bind_thread();
    constexpr std::size_t size = 64 << 10;
    const auto a = random_bytes(size, 9), c = random_bytes(size, 10);
    std::vector<std::byte> out(size);
    auto d = factory::allocate(b, size);
    b.copy_async(b.h2d(), factory::data(d), a.data(), size);
    std::thread other([&] {
      b.bind_thread();
      b.copy_async(b.h2d(), factory::data(d), c.data(), size);  // after the first: it was issued later
    });
    other.join();
    b.copy_async(b.h2d(), out.data(), factory::data(d), size);
    b.synchronize(b.h2d());
    CHECK(out == c);
  }
}
