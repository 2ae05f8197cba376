#pragma once
// The communicator contract (comm/concepts.hpp), for every communicator and world size: a harness H runs the suite
// on every rank of one world,
//   struct H { using comm_type = ...; template <class Body> static void run(Body body); };
// calling body(comm) once per rank (threads, or this process of an MPI job) and rethrowing a rank's failure, and
// TEST_CASE_TEMPLATE_APPLY(communicator_contract, std::tuple<H1, H2, ...>) runs it. Checks run on every rank.
//
// What it holds a communicator to: ranks 0..size-1, each once; every collective, out of place and in place, equal
// bit for bit to the plain rank-order fp32 reference (comm_support.hpp) for fp32, bf16 and fp16, sum and average,
// counts 0, 1, 7 and 1001; special values (inf, NaN, -0) reduced as that reference does; all_gather and broadcast
// of a non-arithmetic trivially copyable type, from every root; barrier completing only once every rank has called
// it; split by color ordered by (key, rank); issue order on one communicator and across a split without waits in
// between; default requests complete; buffers that break the conventions rejected on the calling thread with
// invalid_argument naming the sizes, leaving the communicator usable.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>

#include <doctest/doctest.h>

#include "../comm_support.hpp"
#include "expect_error.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace chunkwise::test::comm_contract {

/// A trivially copyable element that is no number: all_gather and broadcast move its bytes untouched.
struct record {
  std::uint32_t id;
  std::uint16_t tag;
  std::byte mark[2];
};
static_assert(transferable_element<record> && !reducible_element<record>);

inline record make_record(int rank, std::size_t i) {
  return record{static_cast<std::uint32_t>(rank * 100'003 + static_cast<int>(i)), static_cast<std::uint16_t>(i * 7),
                {static_cast<std::byte>(rank), static_cast<std::byte>(i)}};
}

inline bool same_records(std::span<const record> a, std::span<const record> b) {
  return test_support::same_bits(a, b);
}

/// Ranks are 0..size-1, each exactly once, and every rank agrees on the size.
template <class Comm>
void check_ranks(Comm& comm) {
  const int size = comm.size();
  CHECK(size >= 1);
  CHECK(comm.rank() >= 0);
  CHECK(comm.rank() < size);
  const std::vector<std::int32_t> mine{comm.rank(), size};
  std::vector<std::int32_t> all(2 * static_cast<std::size_t>(size), -1);
  comm.all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(all)).wait();
  for (int q = 0; q < size; ++q) {
    CHECK(all[2 * static_cast<std::size_t>(q)] == q);
    CHECK(all[2 * static_cast<std::size_t>(q) + 1] == size);
  }
}

/// all_gather and broadcast of records (bytes, not numbers), out of place and in place, from every root.
template <class Comm>
void check_byte_moves(Comm& comm, std::size_t count) {
  const int size = comm.size(), rank = comm.rank();
  const auto n = static_cast<std::size_t>(size), r = static_cast<std::size_t>(rank);
  std::vector<std::vector<record>> inputs(n);
  for (int q = 0; q < size; ++q)
    for (std::size_t i = 0; i < count; ++i) inputs[static_cast<std::size_t>(q)].push_back(make_record(q, i));
  std::vector<record> expected;
  for (const auto& input : inputs) expected.insert(expected.end(), input.begin(), input.end());

  std::vector<record> gathered(count * n, record{});
  comm.all_gather(std::span<const record>(inputs[r]), std::span<record>(gathered)).wait();
  CHECK(same_records(gathered, expected));
  std::vector<record> in_place(count * n, record{});
  std::copy(inputs[r].begin(), inputs[r].end(), in_place.begin() + static_cast<std::ptrdiff_t>(r * count));
  comm.all_gather(std::span<const record>(in_place.data() + r * count, count), std::span<record>(in_place)).wait();
  CHECK(same_records(in_place, expected));

  for (int root = 0; root < size; ++root) {
    CAPTURE(root);
    std::vector<record> buffer = inputs[r];
    comm.broadcast(std::span<record>(buffer), root).wait();
    CHECK(same_records(buffer, inputs[static_cast<std::size_t>(root)]));
  }
}

/// Reductions of inf, -inf, NaN and signed zeros: the result is what the fp32 rank-order reference gives (NaN where
/// it gives NaN, whatever the payload; otherwise the same bits).
template <class T, class Comm>
void check_special_values(Comm& comm) {
  using test_support::from_float;
  using test_support::to_float32;
  const int size = comm.size(), rank = comm.rank();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Element i of rank q: a pattern that puts inf, -inf, NaN, -0 and finite values on different ranks.
  const auto value = [&](int q, std::size_t i) -> float {
    switch ((i + static_cast<std::size_t>(q) * (i % 3 + 1)) % 7) {
      case 0: return inf;
      case 1: return -0.0f;
      case 2: return i % 5 == 0 ? nan : 1.5f;
      case 3: return i % 2 == 0 ? -inf : -2.0f;
      case 4: return -0.0f;
      default: return 0.25f * static_cast<float>(q + 1);
    }
  };
  constexpr std::size_t count = 70;
  std::vector<std::vector<T>> inputs(static_cast<std::size_t>(size));
  for (int q = 0; q < size; ++q)
    for (std::size_t i = 0; i < count; ++i) inputs[static_cast<std::size_t>(q)].push_back(from_float<T>(value(q, i)));
  const auto agree = [](const std::vector<T>& got, const std::vector<T>& want) {
    if (got.size() != want.size()) return false;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const float g = to_float32(got[i]), w = to_float32(want[i]);
      if (std::isnan(w) ? !std::isnan(g) : !test_support::same_bits(std::span<const T>(&got[i], 1),
                                                                       std::span<const T>(&want[i], 1)))
        return false;
    }
    return true;
  };
  for (const reduce_op op : {reduce_op::sum, reduce_op::average}) {
    CAPTURE(to_string(op));
    std::vector<T> reduced(count);
    comm.all_reduce(test_support::cview(inputs[static_cast<std::size_t>(rank)]), std::span<T>(reduced), op).wait();
    CHECK(agree(reduced, test_support::rank_order_reduce(inputs, 0, count, op)));
  }
}

/// barrier() completes on a rank only after every rank has called it: the last rank calls it late; the others'
/// requests are not complete before that (test() polls false) and their wait lasts about as long.
template <class Comm>
void check_barrier(Comm& comm) {
  using namespace std::chrono_literals;
  const int size = comm.size(), rank = comm.rank();
  comm.barrier().wait();  // line up
  if (size == 1) {
    auto alone = comm.barrier();
    alone.wait();
    CHECK(alone.test());
    return;
  }
  constexpr auto late = 200ms;
  if (rank == size - 1) {
    std::this_thread::sleep_for(late);
    comm.barrier().wait();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  auto request = comm.barrier();
  const bool early = request.test();
  request.wait();
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK_FALSE(early);
  CHECK(waited >= late / 4);  // the late rank started sleeping when every rank left the first barrier
  CHECK(request.test());
}

/// A rank's operations take effect in issue order: each consumes the output of the one before, and only the last
/// request is waited for; then every earlier one is complete too. Also across a communicator split from this one.
template <class Comm>
void check_issue_order(Comm& comm) {
  const int size = comm.size(), rank = comm.rank();
  const auto n = static_cast<std::size_t>(size), r = static_cast<std::size_t>(rank);
  constexpr std::size_t shard = 513;
  std::vector<std::vector<float>> grads;
  for (int q = 0; q < size; ++q) grads.push_back(test_support::random_integers(shard * n, 300u + unsigned(q)));
  const auto summed = test_support::rank_order_reduce(grads, 0, shard * n, reduce_op::sum);

  std::vector<float> mine(shard), full(shard * n);
  auto scattered = comm.reduce_scatter(test_support::cview(grads[r]), std::span<float>(mine), reduce_op::sum);
  auto gathered = comm.all_gather(std::span<const float>(mine), std::span<float>(full));
  // every rank holds `summed` now: the average over ranks of equal values is the value (exact for these integers)
  auto averaged = comm.all_reduce(std::span<const float>(full), std::span<float>(full), reduce_op::average);
  auto last = comm.barrier();
  last.wait();
  CHECK(scattered.test());
  CHECK(gathered.test());
  CHECK(averaged.test());
  scattered.wait();  // waiting again, or out of order, is fine
  gathered.wait();
  averaged.wait();
  CHECK(test_support::same_bits(full, summed));

  // Across a split: the parent's all-reduce feeds the child's all-gather with no wait in between.
  auto child = comm.split(0, rank);
  std::vector<float> value{static_cast<float>(rank + 1)};
  auto parent_op = comm.all_reduce(std::span<const float>(value), std::span<float>(value), reduce_op::sum);
  std::vector<float> all(n);
  auto child_op = child.all_gather(std::span<const float>(value), std::span<float>(all));
  child_op.wait();
  CHECK(parent_op.test());
  const float total = static_cast<float>(size * (size + 1) / 2);
  CHECK(std::all_of(all.begin(), all.end(), [&](float x) { return x == total; }));
}

/// split(color, key): the ranks of one color, ordered by (key, rank); collectives on the parts work and keep to
/// their part; the parent keeps working.
template <class Comm>
void check_split(Comm& comm) {
  const int size = comm.size(), rank = comm.rank();
  // Two colors, the key reversing the order inside each.
  const int color = rank % 2;
  auto half = comm.split(color, -rank);
  std::vector<int> members;
  for (int q = size - 1; q >= 0; --q)
    if (q % 2 == color) members.push_back(q);  // by key -q: descending rank
  CHECK(half.size() == static_cast<int>(members.size()));
  CHECK(half.rank() == static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin()));
  std::vector<std::int32_t> me{rank}, seen(members.size(), -1);
  half.all_gather(std::span<const std::int32_t>(me), std::span<std::int32_t>(seen)).wait();
  for (std::size_t i = 0; i < members.size(); ++i) CHECK(seen[i] == members[i]);
  test_support::check_all_collectives<float>(half, 33);

  // Equal keys: rank order. One color for all: the same ranks as the parent.
  auto same = comm.split(7, 0);
  CHECK(same.size() == size);
  CHECK(same.rank() == rank);
  test_support::check_all_collectives<bf16>(same, 5);

  // A color of its own: a world of one.
  auto alone = comm.split(rank, 0);
  CHECK(alone.size() == 1);
  CHECK(alone.rank() == 0);
  test_support::check_all_collectives<fp16>(alone, 9);

  expect_error([&] { (void)comm.split(-1, 0); }, error_code::invalid_argument, {"-1"});
  comm.barrier().wait();  // the parent still works after its parts did
}

/// Buffers that break the conventions: chunkwise::error(invalid_argument) on the calling thread, before any rank
/// waits for a peer (every rank makes the same mistakes, so a rank that went ahead would hang or fail the group);
/// the message says what was needed and what was given. The communicator stays usable.
template <class Comm>
void check_bad_buffers(Comm& comm) {
  const int size = comm.size();
  const auto n = static_cast<std::size_t>(size);
  std::vector<float> a(10), b(10 * n + 1), c(11);
  const std::string needed = std::to_string(10 * n), given = std::to_string(10 * n + 1);
  expect_error([&] { (void)comm.all_gather(std::span<const float>(a), std::span<float>(b)); },
               error_code::invalid_argument, {"all_gather", needed, given});
  expect_error(
      [&] { (void)comm.reduce_scatter(std::span<const float>(b), std::span<float>(a), reduce_op::sum); },
      error_code::invalid_argument, {"reduce_scatter", needed, given});
  expect_error(
      [&] { (void)comm.all_reduce(std::span<const float>(a), std::span<float>(c), reduce_op::average); },
      error_code::invalid_argument, {"all_reduce", "10", "11"});
  // Overlaps other than the in-place forms.
  expect_error([&] {
    (void)comm.all_reduce(std::span<const float>(c.data(), 8), std::span<float>(c.data() + 1, 8), reduce_op::sum);
  }, error_code::invalid_argument, {"overlap"});
  std::vector<float> gather_buffer(4 * n + 1);
  const std::size_t off_by_one = static_cast<std::size_t>(comm.rank()) * 4 + 1;  // in place would be rank * 4
  expect_error([&] {
    (void)comm.all_gather(std::span<const float>(gather_buffer.data() + off_by_one, 4),
                          std::span<float>(gather_buffer.data(), 4 * n));
  }, error_code::invalid_argument, {"overlap"});
  expect_error([&] { (void)comm.broadcast(std::span<float>(a), size); }, error_code::invalid_argument,
               {std::to_string(size)});
  expect_error([&] { (void)comm.broadcast(std::span<float>(a), -1); }, error_code::invalid_argument, {"-1"});
  // Nothing was issued: the next collective matches on every rank.
  std::vector<float> one{1.0f};
  comm.all_reduce(std::span<const float>(one), std::span<float>(one), reduce_op::sum).wait();
  CHECK(one[0] == static_cast<float>(size));
}

}  // namespace chunkwise::test::comm_contract

TEST_CASE_TEMPLATE_DEFINE("communicator contract: collectives equal the rank-order reference, order and errors hold",
                          Harness, communicator_contract) {
  using namespace chunkwise;
  using comm_type = typename Harness::comm_type;
  namespace contract = chunkwise::test::comm_contract;
  static_assert(communicator<comm_type>);
  static_assert(completion_handle<typename comm_type::request>);

  SUBCASE("a default request is complete") {
    typename comm_type::request request;
    CHECK(request.test());
    request.wait();
    request.wait();
    CHECK(request.test());
  }
  SUBCASE("ranks, and every collective bit for bit against the reference") {
    Harness::run([](comm_type& comm) {
      contract::check_ranks(comm);
      for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}}) {
        CAPTURE(count);
        test_support::check_all_collectives<float>(comm, count);
        test_support::check_all_collectives<bf16>(comm, count);
        test_support::check_all_collectives<fp16>(comm, count);
        contract::check_byte_moves(comm, count);
      }
      contract::check_special_values<float>(comm);
      contract::check_special_values<bf16>(comm);
      contract::check_special_values<fp16>(comm);
    });
  }
  SUBCASE("barrier waits for every rank") {
    Harness::run([](comm_type& comm) { contract::check_barrier(comm); });
  }
  SUBCASE("operations take effect in issue order, also across a split") {
    Harness::run([](comm_type& comm) { contract::check_issue_order(comm); });
  }
  SUBCASE("split orders ranks by key and its parts work") {
    Harness::run([](comm_type& comm) { contract::check_split(comm); });
  }
  SUBCASE("buffers that break the conventions are rejected before anything is issued") {
    Harness::run([](comm_type& comm) { contract::check_bad_buffers(comm); });
  }
}
