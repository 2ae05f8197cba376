// Runs as 2 processes under mpirun (ctest: comm_mpi; any process count works): mpi_comm's collectives against the rank-order reference, and
// every collective strategy on the synthetic workload against the single-rank reference. Both processes run the
// same test cases; the exit status is non-zero when any test failed on any process.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chunkwise/collective.hpp>
#include <chunkwise/comm/mpi_comm.hpp>

#include "collective_workload.hpp"
#include "comm_support.hpp"

#include <cstdio>

using namespace chunkwise;

static_assert(communicator<mpi_comm>);
static_assert(collective_strategy_for<sharded, mpi_comm> && collective_strategy_for<hybrid<2>, mpi_comm>);

TEST_CASE_TEMPLATE("mpi_comm collectives equal the rank-order reference bit for bit", T, float, bf16, fp16) {
  mpi_comm comm;
  test_support::check_all_collectives<T>(comm, 1001);
  test_support::check_all_collectives<T>(comm, 1);  // fewer elements than ranks: an empty all_reduce segment
}

TEST_CASE("mpi_comm keeps issue order: a reduce-scatter feeds an all-gather without a wait in between") {
  mpi_comm comm;
  const int ranks = comm.size();
  constexpr std::size_t shard = 777;
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < ranks; ++r) grads.push_back(test_support::random_integers(shard * static_cast<std::size_t>(ranks), 40u + unsigned(r)));
  const auto n = static_cast<std::size_t>(ranks);
  std::vector<float> mine(shard), full(shard * n);
  auto first = comm.reduce_scatter(std::span<const float>(grads[static_cast<std::size_t>(comm.rank())]),
                                   std::span<float>(mine), reduce_op::sum);
  auto second = comm.all_gather(std::span<const float>(mine), std::span<float>(full));
  second.wait();
  first.wait();
  CHECK(test_support::same_bits(full, test_support::rank_order_reduce(grads, 0, shard * n, reduce_op::sum)));
}

TEST_CASE("mpi_comm split and broadcast of raw bytes (the NCCL bootstrap path)") {
  mpi_comm comm;
  auto alone = comm.split(comm.rank(), 0);
  CHECK(alone.size() == 1);
  CHECK(alone.rank() == 0);
  std::array<std::byte, 128> id{};  // as an ncclUniqueId: rank 0's bytes reach every rank
  if (comm.rank() == 0)
    for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::byte>(i * 7 + 1);
  comm.broadcast(std::span<std::byte>(id), 0).wait();
  for (std::size_t i = 0; i < id.size(); ++i) CHECK(id[i] == static_cast<std::byte>(i * 7 + 1));
}

namespace {
template <class Strategy, class T>
void check_strategy(const test_support::workload& w) {
  mpi_comm comm;
  if (!Strategy::supports(comm.size())) return;
  const auto reference = test_support::run_reference<T>(w, comm.size());
  const bool exact = w.integer_gradients || Strategy::group_size == 0;
  const double tolerance = std::is_same_v<T, float> ? 1e-6 : 1.0 / 64;
  const auto run = test_support::run_workload<Strategy, T>(comm, w);
  CHECK(test_support::compare_with_reference(run, reference, exact, tolerance) == "");
}
}  // namespace

TEST_CASE_TEMPLATE("each strategy over 2 MPI processes trains to the single-rank reference", Strategy, replicated,
                   shard_grads, sharded, hybrid<1>, hybrid<2>) {
  test_support::workload w;
  check_strategy<Strategy, float>(w);
  check_strategy<Strategy, bf16>(w);
  w.integer_gradients = false;
  w.op = reduce_op::average;
  check_strategy<Strategy, float>(w);
  check_strategy<Strategy, bf16>(w);
}

// ---- the communicator contract (tests/contracts/communicator_contract.hpp): over every process of the job, and
// over a world of one (each process split off alone) ----
#include "contracts/communicator_contract.hpp"

namespace {
struct mpi_world {
  using comm_type = mpi_comm;
  template <class Body>
  static void run(Body body) {
    mpi_comm comm;
    body(comm);
  }
};
struct mpi_alone {
  using comm_type = mpi_comm;
  template <class Body>
  static void run(Body body) {
    mpi_comm world;
    auto alone = world.split(world.rank(), 0);
    body(alone);
  }
};
}  // namespace

TEST_CASE_TEMPLATE_APPLY(communicator_contract, std::tuple<mpi_world, mpi_alone>);

int main(int argc, char** argv) {
  mpi_environment mpi(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  if (rank != 0) context.setOption("out", "/dev/null");  // one report; failures still count through the reduction
  int failed = context.run() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed && !failed) std::printf("rank %d passed; another rank failed\n", rank);
  return any_failed;
}
