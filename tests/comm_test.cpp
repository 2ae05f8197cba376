#include <chunkwise/comm.hpp>

#include <doctest/doctest.h>

#include "comm_support.hpp"

#include <atomic>
#include <bit>
#include <chrono>
#include <csignal>
#include <exception>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace chunkwise;
using namespace std::chrono_literals;
using test_support::run_ranks;
using test_support::cview;
using test_support::same_bits;

static_assert(communicator<thread_comm>);
static_assert(completion_handle<thread_comm::request>);
static_assert(reducible_element<bf16> && !reducible_element<double>);
static_assert(!communicator<int>);


TEST_CASE_TEMPLATE("thread_comm collectives equal the rank-order reference bit for bit for 1 to 4 ranks", T, float,
                   bf16, fp16) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    CAPTURE(ranks);
    thread_world world(ranks, 5000ms);
    run_ranks(ranks, [&](int rank) {
      auto comm = world.comm(rank);
      test_support::check_all_collectives<T>(comm, 1001);  // not a multiple of 2, 3, 4: uneven all_reduce segments
      test_support::check_all_collectives<T>(comm, 2);     // fewer elements than ranks: empty segments
    });
  }
}

TEST_CASE("16-bit reductions add in fp32 and round once") {
  // In fp16, 2048 + 1 rounds back to 2048 (ulp 2, tie to even), so pairwise fp16 adds give 2048; fp32 gives 2050.
  thread_world world(3, 5000ms);
  run_ranks(3, [&](int rank) {
    auto comm = world.comm(rank);
    std::vector<fp16> value{to_fp16(rank == 0 ? 2048.0f : 1.0f)};
    comm.all_reduce(std::span<const fp16>(value), std::span<fp16>(value), reduce_op::sum).wait();
    CHECK(to_float(value[0]) == 2050.0f);
    std::vector<bf16> big{to_bf16(rank == 0 ? 256.0f : 1.0f)};  // bf16 ulp at 256 is 2: same story
    comm.all_reduce(std::span<const bf16>(big), std::span<bf16>(big), reduce_op::sum).wait();
    CHECK(to_float(big[0]) == 258.0f);
  });
}

TEST_CASE_TEMPLATE("a one-rank reduction hands its input on bit for bit, signalling NaNs and signed zeros included", T,
                   float, bf16) {
  // A one-rank sum is the input: the streamed plans reduce every gradient this way at one rank, so it is one copy.
  // A signalling NaN went through an fp32 division (average) or a bf16 rounding before and came out quiet.
  std::vector<T> input;
  if constexpr (std::same_as<T, float>) {
    for (std::uint32_t bits : {0x7f800001u, 0xffc01234u, 0x80000000u, 0x00000001u, 0x7f800000u, 0x3f800000u})
      input.push_back(std::bit_cast<float>(bits));
  } else {
    for (int bits : {0x7f81, 0xffc3, 0x8000, 0x0001, 0x7f80, 0x3f80})
      input.push_back(bf16{static_cast<std::uint16_t>(bits)});
  }
  thread_world world(1, 5000ms);
  auto comm = world.comm(0);
  for (const reduce_op op : {reduce_op::sum, reduce_op::average}) {
    CAPTURE(to_string(op));
    std::vector<T> out(input.size());
    comm.all_reduce(cview(input), std::span<T>(out), op).wait();
    CHECK(same_bits(out, input));
    std::vector<T> in_place = input;
    comm.all_reduce(cview(in_place), std::span<T>(in_place), op).wait();
    CHECK(same_bits(in_place, input));
    std::vector<T> shard(input.size());
    comm.reduce_scatter(cview(input), std::span<T>(shard), op).wait();
    CHECK(same_bits(shard, input));
  }
}

TEST_CASE("integer sums are exact and identical on every rank whatever the order of arrival") {
  constexpr int ranks = 4;
  constexpr std::size_t count = 4099;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < ranks; ++r) inputs.push_back(test_support::random_integers(count, 7u + static_cast<unsigned>(r)));
  std::vector<float> exact(count, 0.0f);
  for (std::size_t i = 0; i < count; ++i)
    for (int r = 0; r < ranks; ++r) exact[i] += inputs[static_cast<std::size_t>(r)][i];
  thread_world world(ranks, 5000ms);
  for (unsigned trial = 0; trial < 4; ++trial) {
    run_ranks(ranks, [&](int rank) {
      std::mt19937 delay(trial * 31 + static_cast<unsigned>(rank));
      std::this_thread::sleep_for(std::chrono::microseconds(delay() % 2000));  // shuffle the arrival order
      auto comm = world.comm(rank);
      std::vector<float> result(count);
      comm.all_reduce(std::span<const float>(inputs[static_cast<std::size_t>(rank)]), std::span<float>(result),
                      reduce_op::sum)
          .wait();
      CHECK(same_bits(result, exact));
    });
  }
}

TEST_CASE("a rank's operations run in issue order without waits in between") {
  // reduce_scatter into a shard, scale nothing, then all_gather that shard: only the last request is waited for.
  constexpr int ranks = 3;
  constexpr std::size_t shard = 1000;
  thread_world world(ranks, 5000ms);
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < ranks; ++r) grads.push_back(test_support::random_integers(shard * ranks, 40u + unsigned(r)));
  run_ranks(ranks, [&](int rank) {
    auto comm = world.comm(rank);
    std::vector<float> mine(shard), full(shard * ranks);
    auto first = comm.reduce_scatter(std::span<const float>(grads[static_cast<std::size_t>(rank)]),
                                     std::span<float>(mine), reduce_op::sum);
    auto second = comm.all_gather(std::span<const float>(mine), std::span<float>(full));
    auto third = comm.barrier();
    third.wait();
    CHECK(first.test());
    CHECK(second.test());
    first.wait();
    second.wait();
    CHECK(same_bits(full, test_support::rank_order_reduce(grads, 0, shard * ranks, reduce_op::sum)));
  });
}

TEST_CASE("a rank that never arrives makes the others fail with its rank named, never hang") {
  constexpr int ranks = 3;
  thread_world world(ranks, 150ms);
  std::atomic<int> failures{0};
  const auto start = std::chrono::steady_clock::now();
  run_ranks(ranks, [&](int rank) {
    if (rank == 2) return;  // stuck: never calls
    auto comm = world.comm(rank);
    std::vector<float> data(16, 1.0f);
    try {
      comm.all_reduce(std::span<const float>(data), std::span<float>(data), reduce_op::sum).wait();
    } catch (const error& e) {
      CHECK(e.code() == error_code::comm_error);
      CHECK(std::string(e.what()).find("rank 2") != std::string::npos);
      CHECK(std::string(e.what()).find("all_reduce #1") != std::string::npos);
      ++failures;
    }
  });
  CHECK(failures == 2);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  // The group is failed from now on: even the late rank fails at once, naming the first failure.
  auto late = world.comm(2);
  const auto late_start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(late.barrier().wait(), doctest::Contains("rank 2"), error);
  CHECK(std::chrono::steady_clock::now() - late_start < 100ms);
}

TEST_CASE("ranks that call different collectives at the same point fail with both calls named") {
  thread_world world(2, 5000ms);
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int rank) {
    auto comm = world.comm(rank);
    std::vector<float> data(8, 1.0f), out(16);
    try {
      if (rank == 0) comm.all_reduce(std::span<const float>(data), std::span<float>(data), reduce_op::sum).wait();
      else comm.all_gather(std::span<const float>(data), std::span<float>(out)).wait();
    } catch (const error& e) {
      messages[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  for (const auto& message : messages) {
    CHECK(message.find("all_reduce of 32 bytes of fp32") != std::string::npos);
    CHECK(message.find("all_gather of 32 bytes of fp32") != std::string::npos);
  }
}

TEST_CASE("buffers that break the conventions are rejected on the calling thread") {
  thread_world world(2);
  auto comm = world.comm(0);
  std::vector<float> a(10), b(10);
  CHECK_THROWS_WITH_AS(comm.all_gather(std::span<const float>(a), std::span<float>(b)),
                       doctest::Contains("needs an output of 20 elements; it has 10"), error);
  CHECK_THROWS_WITH_AS(comm.reduce_scatter(std::span<const float>(a), std::span<float>(b), reduce_op::sum),
                       doctest::Contains("needs an input of 20 elements"), error);
  CHECK_THROWS_AS(comm.all_reduce(std::span<const float>(a.data(), 8), std::span<float>(a.data() + 1, 8),
                                  reduce_op::sum),
                  error);
  CHECK_THROWS_WITH_AS(comm.broadcast(std::span<float>(a), 2), doctest::Contains("ranks are 0..1"), error);
  CHECK_THROWS_AS(thread_world(0), error);
  CHECK_THROWS_AS((void)world.comm(2), error);
}

TEST_CASE("split makes communicators of the ranks that share a color, ordered by key") {
  constexpr int ranks = 4;
  thread_world world(ranks, 5000ms);
  run_ranks(ranks, [&](int rank) {
    auto comm = world.comm(rank);
    auto half = comm.split(rank % 2, -rank);  // evens {0, 2}, odds {1, 3}; the key reverses the order
    CHECK(half.size() == 2);
    CHECK(half.rank() == (rank < 2 ? 1 : 0));
    std::vector<float> value{static_cast<float>(rank + 1)}, both(2);
    half.all_reduce(std::span<const float>(value), std::span<float>(value), reduce_op::sum).wait();
    CHECK(value[0] == (rank % 2 == 0 ? 1.0f + 3.0f : 2.0f + 4.0f));
    std::vector<float> me{static_cast<float>(rank)};
    half.all_gather(std::span<const float>(me), std::span<float>(both)).wait();
    CHECK(both[0] == static_cast<float>(rank % 2 + 2));  // the higher rank is new rank 0
    CHECK(both[1] == static_cast<float>(rank % 2));
    // The parent still works, and interleaves with the child in issue order.
    auto parent = comm.barrier();
    parent.wait();
  });
}

TEST_CASE("a bootstrap file written by rank 0 reaches the ranks that wait for it, or they time out naming it") {
  const auto directory = std::filesystem::temp_directory_path() / ("chunkwise_comm_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  const auto path = directory / "nccl_id";
  std::vector<std::byte> id(128);
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::byte>(i ^ 0x5a);
  std::vector<std::vector<std::byte>> seen(3);
  run_ranks(3, [&](int rank) {
    if (rank == 0) {
      std::this_thread::sleep_for(30ms);  // the others are already polling
      publish_bootstrap_file(path, id);
    } else {
      seen[static_cast<std::size_t>(rank)] = await_bootstrap_file(path, id.size(), 5000ms, 1ms);
    }
  });
  CHECK(seen[1] == id);
  CHECK(seen[2] == id);
  CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp." + std::to_string(::getpid())));
  CHECK_THROWS_WITH_AS(await_bootstrap_file(path, 64, 1000ms), doctest::Contains("holds more than 64 bytes"), error);
  CHECK_THROWS_WITH_AS(await_bootstrap_file(directory / "missing", 128, 50ms),
                       doctest::Contains("waited 50 ms for rank 0 to write the bootstrap file"), error);
  CHECK_THROWS_AS(publish_bootstrap_file(directory / "no" / "such" / "dir", id), error);
  std::filesystem::remove_all(directory);
}

namespace {
/// A TCP port nothing listens on now (the kernel's pick for a socket bound to port 0, released).
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(s, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  socklen_t length = sizeof address;
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  ::close(s);
  return ntohs(address.sin_port);
}
}  // namespace

TEST_CASE("a TCP rendezvous hands rank 0's bytes to every rank, or names the ranks that never came") {
  std::vector<std::byte> id(128);
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::byte>(i * 3 + 1);
  const int port = free_port();
  std::vector<std::vector<std::byte>> seen(4);
  run_ranks(4, [&](int rank) {
    if (rank == 0) {
      std::this_thread::sleep_for(50ms);  // the others are already retrying
      serve_bootstrap_tcp(port, id, 4, 5000ms);
    } else {
      seen[static_cast<std::size_t>(rank)] = fetch_bootstrap_tcp("localhost", port, rank, id.size(), 5000ms, 5ms);
    }
  });
  for (int r = 1; r < 4; ++r) CHECK(seen[static_cast<std::size_t>(r)] == id);
  // "localhost" is the loopback address without the resolver (a root without /etc/hosts resolves none); other names
  // go to the resolver as given.
  CHECK(detail::loopback_if_localhost("LocalHost.") == "127.0.0.1");
  CHECK(detail::loopback_if_localhost("localhost.example") == "localhost.example");
  // Rank 0 alone: ranks 1 and 2 never come.
  const int lonely = free_port();
  CHECK_THROWS_WITH_AS(serve_bootstrap_tcp(lonely, id, 3, 100ms),
                       doctest::Contains(("waited 100 ms on port " + std::to_string(lonely) +
                                          " for 2 rank(s); ranks 1, 2 never connected").c_str()),
                       error);
  // No rank 0: the rank names where it looked.
  CHECK_THROWS_WITH_AS(fetch_bootstrap_tcp("127.0.0.1", lonely, 1, 128, 100ms, 5ms),
                       doctest::Contains(
                           ("rank 1 waited 100 ms for rank 0 at 127.0.0.1:" + std::to_string(lonely)).c_str()),
                       error);
  // A rank 0 that sends another size: refused, not misread.
  const int other = free_port();
  std::exception_ptr server_error;
  std::thread server([&] {
    try {
      serve_bootstrap_tcp(other, std::span(id).first(64), 2, 2000ms);  // it sends; the rank refuses what it got
    } catch (...) {
      server_error = std::current_exception();
    }
  });
  CHECK_THROWS_WITH_AS(fetch_bootstrap_tcp("127.0.0.1", other, 1, 128, 2000ms, 5ms),
                       doctest::Contains("sends 64 bytes; expected 128"), error);
  server.join();
  CHECK_FALSE(server_error);
  CHECK_THROWS_WITH_AS(fetch_bootstrap_tcp("no-such-host.invalid", other, 1, 128, 100ms),
                       doctest::Contains("cannot resolve MASTER_ADDR 'no-such-host.invalid'"), error);
}

TEST_CASE("the launcher's variables give the rank, the size, the machine's share and the rendezvous") {
  using variables = std::map<std::string, std::string>;
  const auto read = [](const variables& set) {
    return launcher_environment([&set](const char* name) -> const char* {
      const auto found = set.find(name);
      return found == set.end() ? nullptr : found->second.c_str();
    });
  };
  const auto alone = read({});
  CHECK(alone.launcher == "none");
  CHECK((alone.rank == 0 && alone.size == 1 && alone.local_size == 1));
  const auto torchrun = read({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                              {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}, {"SLURM_PROCID", "1"},
                              {"SLURM_NTASKS", "2"}});
  CHECK(torchrun.launcher == "torchrun");  // torchrun inside a Slurm allocation: the process is torchrun's
  CHECK((torchrun.rank == 5 && torchrun.size == 8 && torchrun.local_rank == 1 && torchrun.local_size == 4));
  CHECK((torchrun.master_address == "node0" && torchrun.master_port == 29500));
  const auto slurm = read({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                           {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.7"}});
  CHECK(slurm.launcher == "slurm");
  CHECK((slurm.rank == 3 && slurm.size == 4 && slurm.local_rank == 1 && slurm.local_size == 2));
  CHECK((slurm.master_address == "10.0.0.7" && slurm.master_port == 0));
  const auto mpirun = read({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK((mpirun.launcher == "openmpi" && mpirun.size == 2 && mpirun.local_size == 2));
  CHECK_THROWS_WITH_AS(read({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
                       doctest::Contains("RANK=4 is not a rank of WORLD_SIZE=4"), error);
  CHECK_THROWS_WITH_AS(read({{"RANK", "one"}, {"WORLD_SIZE", "4"}}),
                       doctest::Contains("RANK='one' is not a count or rank"), error);
  CHECK_THROWS_WITH_AS(read({{"MASTER_PORT", "70000"}}), doctest::Contains("MASTER_PORT=70000 is not a TCP port"),
                       error);
  CHECK_THROWS_WITH_AS(read({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
                       doctest::Contains("local rank 2 is not below the 2 processes on this machine"), error);
}

TEST_CASE("a rank that waited too long tells which peers on its machine are stopped or gone") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  CHECK(detail::process_state(child) == "runs");
  ::kill(child, SIGSTOP);
  for (int i = 0; i < 200 && detail::process_state(child) == "runs"; ++i) std::this_thread::sleep_for(5ms);
  CHECK(detail::process_state(child).rfind("is stopped", 0) == 0);
  detail::peer_watch watch;
  watch.rank = 0;
  watch.pids = {::getpid(), child, 1, child};
  watch.hosts = {"here", "here", "here", "elsewhere"};
  CHECK(watch.describe_peers() == "rank 1 (pid " + std::to_string(child) +
                                      ") is stopped (SIGSTOP, a debugger or job control); 1 rank(s) on other machines "
                                      "cannot be checked from here");
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  CHECK(detail::process_state(child).rfind("is gone", 0) == 0);
  watch.pids[1] = ::getpid();  // a peer that runs
  CHECK(watch.describe_peers().rfind("every peer on this machine runs (2)", 0) == 0);
}

TEST_CASE("random sequences of collectives with random delays give the reference on every rank") {
  // The same seeded sequence of operations on 4 ranks; each rank sleeps a random time before each issue, and
  // issues up to 3 operations before waiting: results must not depend on the interleaving.
  constexpr int ranks = 4;
  constexpr int operations = 60;
  thread_world world(ranks, 5000ms);
  std::atomic<int> mismatches{0};
  run_ranks(ranks, [&](int rank) {
    auto comm = world.comm(rank);
    std::mt19937 plan(1234);                                       // the same on every rank
    std::mt19937 jitter(99u + static_cast<unsigned>(rank));        // different on every rank
    std::vector<std::vector<float>> outputs;
    std::vector<std::vector<float>> expected;
    std::vector<std::vector<float>> inputs;
    std::vector<thread_comm::request> in_flight;
    outputs.reserve(operations);
    inputs.reserve(operations);
    for (int i = 0; i < operations; ++i) {
      const std::size_t count = 1 + plan() % 300;
      const unsigned kind = plan() % 4;
      std::vector<std::vector<float>> all;
      for (int r = 0; r < ranks; ++r)
        all.push_back(test_support::random_integers(kind == 1 ? count * ranks : count,
                                                    static_cast<std::uint32_t>(i * 10 + r)));
      inputs.push_back(all[static_cast<std::size_t>(rank)]);
      std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 300));
      const std::span<const float> in(inputs.back());
      switch (kind) {
        case 0: {  // all_gather
          outputs.emplace_back(count * ranks);
          std::vector<float> e;
          for (const auto& part : all) e.insert(e.end(), part.begin(), part.end());
          expected.push_back(std::move(e));
          in_flight.push_back(comm.all_gather(in, std::span<float>(outputs.back())));
          break;
        }
        case 1:  // reduce_scatter
          outputs.emplace_back(count);
          expected.push_back(test_support::rank_order_reduce(all, static_cast<std::size_t>(rank) * count, count,
                                                             reduce_op::sum));
          in_flight.push_back(comm.reduce_scatter(in, std::span<float>(outputs.back()), reduce_op::sum));
          break;
        case 2:  // all_reduce
          outputs.emplace_back(count);
          expected.push_back(test_support::rank_order_reduce(all, 0, count, reduce_op::average));
          in_flight.push_back(comm.all_reduce(in, std::span<float>(outputs.back()), reduce_op::average));
          break;
        default: {  // broadcast from a planned root
          const int root = static_cast<int>(plan() % ranks);
          outputs.push_back(inputs.back());
          expected.push_back(all[static_cast<std::size_t>(root)]);
          in_flight.push_back(comm.broadcast(std::span<float>(outputs.back()), root));
        }
      }
      if (in_flight.size() == 3 || i + 1 == operations) {
        for (auto& request : in_flight) request.wait();
        in_flight.clear();
      }
    }
    for (std::size_t i = 0; i < outputs.size(); ++i)
      if (!same_bits(outputs[i], expected[i])) ++mismatches;
  });
  CHECK(mismatches == 0);
}

// ---- the communicator contract (tests/contracts/communicator_contract.hpp) on 1, 2 and 3 thread ranks ----
#include "contracts/communicator_contract.hpp"

namespace {
template <int Ranks>
struct thread_ranks {
  using comm_type = thread_comm;
  template <class Body>
  static void run(Body body) {
    thread_world world(Ranks, 5000ms);
    run_ranks(Ranks, [&](int rank) {
      auto comm = world.comm(rank);
      body(comm);
    });
  }
};
}  // namespace

TEST_CASE_TEMPLATE_APPLY(communicator_contract, std::tuple<thread_ranks<1>, thread_ranks<2>, thread_ranks<3>>);
