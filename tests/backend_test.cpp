// Backends: the backend contract (tests/contracts/backend_contract.hpp) for the host backend. The CUDA backend's
// run lives with the CUDA tests.
#include <chunkwise/backend.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "contracts/backend_contract.hpp"

using namespace chunkwise;

static_assert(backend<host_backend>);
static_assert(!backend<int>);

namespace chunkwise::test {
// "Device" memory of the host backend is host memory.
template <>
struct backend_factory<host_backend> {
  using buffer = std::vector<std::byte>;
  static std::unique_ptr<host_backend> make() { return std::make_unique<host_backend>(); }
  static buffer allocate(host_backend&, byte_count bytes) { return buffer(bytes, std::byte{0xee}); }
  static void* data(buffer& b) { return b.data(); }
  static std::vector<std::byte> read(host_backend&, const buffer& b) { return b; }
};
}  // namespace chunkwise::test

TEST_CASE_TEMPLATE_APPLY(backend_contract, std::tuple<host_backend>);

TEST_CASE("the host backend refuses a copy to or from a null buffer on the caller's thread, and 0 bytes is no copy") {
  host_backend backend;
  std::vector<std::byte> buffer(16, std::byte{1});
  CHECK_THROWS_WITH_AS(backend.copy_async(backend.h2d(), nullptr, buffer.data(), 16),
                       doctest::Contains("copy_async of 16 bytes to a null buffer"), error);
  CHECK_THROWS_WITH_AS(backend.copy_async(backend.d2h(), buffer.data(), nullptr, 16),
                       doctest::Contains("from a null buffer"), error);
  backend.copy_async(backend.h2d(), nullptr, nullptr, 0);  // nothing to move: no memcpy(nullptr, ...) either
  backend.synchronize(backend.h2d());
  CHECK(buffer[0] == std::byte{1});
}

TEST_CASE("the host backend's compute stream is the caller's thread: work runs at once, its errors reach the caller") {
  host_backend backend;
  const auto caller = std::this_thread::get_id();
  std::thread::id ran_on;
  backend.compute().enqueue([&] { ran_on = std::this_thread::get_id(); });
  CHECK(ran_on == caller);  // before any synchronize
  CHECK(backend.ready(backend.record(backend.compute())));
  CHECK_THROWS_WITH_AS(backend.compute().enqueue([] { throw_error(error_code::io_error, "kernel failed"); }),
                       doctest::Contains("kernel failed"), error);
  // A copy stream's worker is another thread, and its work is done only once synchronized.
  backend.h2d().enqueue([&] { ran_on = std::this_thread::get_id(); });
  backend.synchronize(backend.h2d());
  CHECK(ran_on != caller);
}
