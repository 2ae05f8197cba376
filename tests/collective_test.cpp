#include <chunkwise/collective.hpp>
#include <chunkwise/comm/thread_comm.hpp>

#include <doctest/doctest.h>

#include "collective_workload.hpp"

#include <chrono>

using namespace chunkwise;
using namespace std::chrono_literals;

// ---- cost-model side, at compile time ----
static_assert(collective_strategy<replicated> && collective_strategy<shard_grads> && collective_strategy<sharded> &&
              collective_strategy<hybrid<4>>);
static_assert(hybrid<4>::name == "hybrid<4>" && hybrid<16>::name == "hybrid<16>");
static_assert(hybrid<4>::supports(8) && !hybrid<4>::supports(6) && !hybrid<4>::supports(0));

// Shards: ceil(c / n) rounded up to 128 bytes; the padded chunk is n shards.
static_assert(shard_bytes(1000, 3) == 384 && padded_chunk_bytes(1000, 3) == 1152);
static_assert(shard_bytes(64_MiB, 4) == 16_MiB && padded_chunk_bytes(64_MiB, 4) == 64_MiB);
static_assert(shard_of(250, 4, 2, 3) == shard_range{192, 96, 58});  // 1000 bytes of fp32: 384-byte shards
static_assert(shard_of(37, 4, 1, 4) == shard_range{32, 32, 5});      // 37 fp32 over 4 ranks: 128-byte shards
static_assert(shard_of(37, 4, 3, 4) == shard_range{96, 32, 0});      // all padding

// Bytes per rank: 10 chunks of 64 MiB over 4 ranks.
static_assert(replicated::bytes_per_rank(tensor_role::optimizer_state, 64_MiB, 10, 4) == 640_MiB);
static_assert(shard_grads::bytes_per_rank(tensor_role::parameter, 64_MiB, 10, 4) == 640_MiB);
static_assert(shard_grads::bytes_per_rank(tensor_role::gradient, 64_MiB, 10, 4) == 160_MiB);
static_assert(shard_grads::bytes_per_rank(tensor_role::optimizer_state, 64_MiB, 10, 4) == 160_MiB);
static_assert(sharded::bytes_per_rank(tensor_role::parameter, 64_MiB, 10, 4) == 160_MiB);
static_assert(hybrid<2>::bytes_per_rank(tensor_role::parameter, 64_MiB, 10, 8) == 320_MiB);
static_assert(sharded::working_bytes(tensor_role::parameter, 64_MiB, 4) == 64_MiB);
static_assert(replicated::working_bytes(tensor_role::gradient, 64_MiB, 4) == 0);
// Padding counts: 3 chunks of 1000 bytes over 3 ranks hold 384 bytes each per rank, not 333.
static_assert(sharded::bytes_per_rank(tensor_role::gradient, 1000, 3, 3) == 3 * 384);

// Traffic: ring factors. All-reduce of 64 MiB over 4 ranks sends 2 * 3/4 * 64 MiB = 96 MiB per rank.
static_assert(replicated::traffic(64_MiB, 64_MiB, 1, 4) == step_traffic{.all_reduce = 96_MiB});
static_assert(replicated::traffic(64_MiB, 64_MiB, 5, 1).total() == 0);
// ZeRO-2 moves what replicated does (reduce-scatter + all-gather = all-reduce), ZeRO-3 half as much again.
static_assert(shard_grads::traffic(64_MiB, 64_MiB, 3, 4).total() == replicated::traffic(64_MiB, 64_MiB, 3, 4).total());
static_assert(shard_grads::traffic(64_MiB, 64_MiB, 1, 4) == step_traffic{.all_gather = 48_MiB, .reduce_scatter = 48_MiB});
static_assert(sharded::traffic(64_MiB, 64_MiB, 1, 4) == step_traffic{.all_gather = 96_MiB, .reduce_scatter = 48_MiB});
// bf16 parameters and gradients are half the bytes of fp32.
static_assert(sharded::traffic(32_MiB, 32_MiB, 1, 4).total() * 2 == sharded::traffic(64_MiB, 64_MiB, 1, 4).total());
// hybrid<4> over 8 ranks: ZeRO-3 within 4, then the 16 MiB gradient shard all-reduced across 2 groups.
static_assert(hybrid<4>::traffic(64_MiB, 64_MiB, 1, 8) ==
              step_traffic{.all_gather = 96_MiB, .reduce_scatter = 48_MiB, .cross_group_all_reduce = 16_MiB});
// The extremes: hybrid<n> is sharded, hybrid<1> moves what replicated moves.
static_assert(hybrid<4>::traffic(64_MiB, 64_MiB, 2, 4) == sharded::traffic(64_MiB, 64_MiB, 2, 4));
static_assert(hybrid<1>::traffic(64_MiB, 64_MiB, 2, 4).total() == replicated::traffic(64_MiB, 64_MiB, 2, 4).total());

static_assert(collective_strategy_for<replicated, thread_comm> && collective_strategy_for<shard_grads, thread_comm> &&
              collective_strategy_for<sharded, thread_comm> && collective_strategy_for<hybrid<2>, thread_comm>);
static_assert(!collective_strategy_for<sharded, int>);

TEST_CASE("every element of a chunk has exactly one owner, whatever the rank count") {
  for (std::size_t elements : {1ul, 31ul, 32ul, 33ul, 1000ul, 4097ul})
    for (int ranks = 1; ranks <= 8; ++ranks)
      for (std::size_t element_bytes : {2ul, 4ul}) {
        std::vector<int> owners(elements, 0);
        std::size_t padded = 0;
        for (int r = 0; r < ranks; ++r) {
          const auto shard = shard_of(elements, element_bytes, r, ranks);
          CHECK(shard.offset == padded);
          CHECK(shard.elements * element_bytes % shard_alignment == 0);
          for (std::size_t i = 0; i < shard.valid; ++i) ++owners[shard.offset + i];
          padded += shard.elements;
        }
        CHECK(padded * element_bytes == padded_chunk_bytes(elements * element_bytes, ranks));
        CHECK(std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; }));
      }
}

TEST_CASE("the cost functions refuse a world that a hybrid group does not divide") {
  CHECK_THROWS_WITH_AS((void)hybrid<4>::traffic(1_MiB, 1_MiB, 1, 6), doctest::Contains("multiple of the group size 4"),
                       error);
  CHECK_THROWS_AS((void)shard_bytes(1_MiB, 0), error);
}

namespace {

/// The cost model's bytes equal the run-time buffers: home = parameter bytes per rank, owned range = gradient and
/// optimizer-state bytes per rank, full buffers = working bytes (where the home does not serve).
template <class Strategy, class T, class Ops>
std::string geometry_mismatch(const Ops& ops, std::size_t n, int ranks) {
  const byte_count chunk = n * sizeof(T);
  const auto bytes = [](std::size_t elements) { return static_cast<byte_count>(elements * sizeof(T)); };
  const std::size_t owned = ops.template owned<T>(n).elements;
  if (bytes(ops.template home_elements<T>(n)) != Strategy::bytes_per_rank(tensor_role::parameter, chunk, 1, ranks))
    return "parameter bytes";
  if (bytes(owned) != Strategy::bytes_per_rank(tensor_role::gradient, chunk, 1, ranks)) return "gradient bytes";
  if (bytes(owned) != Strategy::bytes_per_rank(tensor_role::optimizer_state, chunk, 1, ranks))
    return "optimizer state bytes";
  const byte_count working = Strategy::working_bytes(tensor_role::gradient, chunk, ranks);
  if (working != 0 && bytes(ops.template full_elements<T>(n)) != working) return "gradient working bytes";
  if (Strategy::shards_parameters &&
      bytes(ops.template full_elements<T>(n)) != Strategy::working_bytes(tensor_role::parameter, chunk, ranks))
    return "parameter working bytes";
  return {};
}

/// Runs the workload on `ranks` thread ranks and compares each rank's view with the reference.
template <class Strategy, class T>
void check_strategy(int ranks, const test_support::workload& w) {
  if (!Strategy::supports(ranks)) return;
  CAPTURE(ranks);
  const auto reference = test_support::run_reference<T>(w, ranks);
  // The hybrid reduction adds group sums, in another order than the reference: exact only for integer sums.
  const bool exact = w.integer_gradients || Strategy::group_size == 0;
  const double tolerance = std::is_same_v<T, float> ? 1e-6 : 1.0 / 64;  // bf16: 2 ulps (2^-7 relative each)
  std::vector<std::string> mismatches(static_cast<std::size_t>(ranks));
  thread_world world(ranks, 5000ms);
  test_support::run_ranks(ranks, [&](int rank) {
    auto comm = world.comm(rank);
    const auto run = test_support::run_workload<Strategy, T>(comm, w);
    auto& mismatch = mismatches[static_cast<std::size_t>(rank)];
    mismatch = test_support::compare_with_reference(run, reference, exact, tolerance);
    const auto ops = Strategy::bind(comm);
    for (const std::size_t n : w.chunk_elements)
      if (mismatch.empty()) mismatch = geometry_mismatch<Strategy, T>(ops, n, ranks);
  });
  for (int rank = 0; rank < ranks; ++rank) {
    CAPTURE(rank);
    CHECK(mismatches[static_cast<std::size_t>(rank)] == "");
  }
}

template <class Strategy>
void check_strategy_all(const test_support::workload& w) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    check_strategy<Strategy, float>(ranks, w);
    check_strategy<Strategy, bf16>(ranks, w);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("each strategy trains to the single-rank reference bit for bit on integer gradients", Strategy,
                   replicated, shard_grads, sharded, hybrid<1>, hybrid<2>, hybrid<3>) {
  test_support::workload w;
  check_strategy_all<Strategy>(w);
  w.op = reduce_op::average;  // averages of small integers over 1..4 ranks: exact for 1, 2, 4; rank-order for 3
  check_strategy_all<Strategy>(w);
}

TEST_CASE_TEMPLATE("each strategy trains to the single-rank reference on random real gradients", Strategy, replicated,
                   shard_grads, sharded, hybrid<2>) {
  test_support::workload w;
  w.integer_gradients = false;
  w.op = reduce_op::average;
  check_strategy_all<Strategy>(w);
}

TEST_CASE("a strategy that keeps whole parameters computes on the home buffer") {
  thread_world world(1);
  auto comm = world.comm(0);
  auto ops = replicated::bind(comm);
  std::vector<float> home(10), other(10);
  CHECK_THROWS_WITH_AS(ops.gather_params(std::span<const float>(home), std::span<float>(other)),
                       doctest::Contains("compute on the home buffer"), error);
  ops.gather_params(std::span<const float>(home), std::span<float>(home)).wait();
  CHECK(ops.owned<float>(10) == shard_range{0, 10, 10});
}

TEST_CASE("binding hybrid to a world its group does not divide says so") {
  thread_world world(3, 2000ms);
  test_support::run_ranks(3, [&](int rank) {
    auto comm = world.comm(rank);
    CHECK_THROWS_WITH_AS(hybrid<2>::bind(comm), doctest::Contains("world of 3 ranks into groups of 2"), error);
  });
}

// ---- the collective_strategy contract (tests/contracts/collective_strategy_contract.hpp), 1, 2 and 4 thread ranks ----
#include "contracts/collective_strategy_contract.hpp"

TEST_CASE_TEMPLATE_APPLY(collective_strategy_contract,
                         std::tuple<replicated, shard_grads, sharded, hybrid<1>, hybrid<2>, hybrid<4>>);
