// thread_comm collective bandwidth, 2 ranks, 1 MiB to 256 MiB, against memcpy of the same bytes in the same run;
// and the fixed cost of one call (bm_call_latency), the figure the cost model charges every collective.
//
// Sizes are nccl-tests' sizes: the all-gather output, the reduce-scatter input, the all-reduce buffer. Counters, in
// bytes/s: alg_bw = size / time; bus_bw = alg_bw * 2(n-1)/n for all-reduce and * (n-1)/n for all-gather and
// reduce-scatter (nccl-tests' definition: the bandwidth each rank's link would need in a ring). The memcpy line
// copies `size` bytes on one thread: the physical limit one rank's copy reaches here. Both ranks' operations are
// issued from the benchmark thread and run on the ranks' worker threads, so time is wall-clock (UseRealTime).
#include <chunkwise/comm/thread_comm.hpp>
#include <chunkwise/measure/host.hpp>

#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <span>
#include <vector>

namespace {

using chunkwise::reduce_op;
using chunkwise::thread_comm;
using chunkwise::thread_world;

constexpr int ranks = 2;

struct rank_buffers {
  std::vector<float> in, out;
};

/// Buffers touched once before timing, so first-touch page faults are not measured.
std::vector<rank_buffers> make_buffers(std::size_t in_elements, std::size_t out_elements) {
  std::vector<rank_buffers> buffers(ranks);
  for (int r = 0; r < ranks; ++r) {
    buffers[static_cast<std::size_t>(r)].in.assign(in_elements, static_cast<float>(r + 1));
    buffers[static_cast<std::size_t>(r)].out.assign(out_elements, 0.0f);
  }
  return buffers;
}

void set_counters(benchmark::State& state, std::size_t bytes, double bus_factor) {
  const double per_iteration = static_cast<double>(bytes);
  state.counters["alg_bw"] = benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1024);
  state.counters["bus_bw"] = benchmark::Counter(per_iteration * bus_factor,
                                                benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1024);
}

template <class Issue>
void run_collective(benchmark::State& state, std::vector<rank_buffers>& buffers, Issue issue) {
  thread_world world(ranks);
  std::vector<thread_comm> comms;
  for (int r = 0; r < ranks; ++r) comms.push_back(world.comm(r));
  for (auto _ : state) {
    std::vector<thread_comm::request> requests;
    for (int r = 0; r < ranks; ++r)
      requests.push_back(issue(comms[static_cast<std::size_t>(r)], buffers[static_cast<std::size_t>(r)]));
    for (auto& request : requests) request.wait();
    benchmark::DoNotOptimize(buffers[0].out.data());
  }
}

void bm_all_gather(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  auto buffers = make_buffers(bytes / sizeof(float) / ranks, bytes / sizeof(float));
  run_collective(state, buffers, [](thread_comm& comm, rank_buffers& b) {
    return comm.all_gather(std::span<const float>(b.in), std::span<float>(b.out));
  });
  set_counters(state, bytes, (ranks - 1.0) / ranks);
}

void bm_reduce_scatter(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  auto buffers = make_buffers(bytes / sizeof(float), bytes / sizeof(float) / ranks);
  run_collective(state, buffers, [](thread_comm& comm, rank_buffers& b) {
    return comm.reduce_scatter(std::span<const float>(b.in), std::span<float>(b.out), reduce_op::sum);
  });
  set_counters(state, bytes, (ranks - 1.0) / ranks);
}

void bm_all_reduce(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  auto buffers = make_buffers(bytes / sizeof(float), bytes / sizeof(float));
  run_collective(state, buffers, [](thread_comm& comm, rank_buffers& b) {
    return comm.all_reduce(std::span<const float>(b.in), std::span<float>(b.out), reduce_op::sum);
  });
  set_counters(state, bytes, 2.0 * (ranks - 1.0) / ranks);
}

/// The physical reference: one thread copying `size` bytes between two buffers.
void bm_memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> source(bytes, 1), target(bytes, 0);
  for (auto _ : state) {
    std::memcpy(target.data(), source.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.counters["copy_bw"] = benchmark::Counter(static_cast<double>(bytes),
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1024);
}

/// The fixed cost of one call among 2 and 4 thread ranks, as the machine profile measures it
/// (measure_thread_collective_latency: one-float all-reduces issued by each rank from its own thread, two in flight,
/// as the runtime's prefetched gathers and pending reductions are; the median of 5 rounds of 100 calls). Where the
/// ranks outnumber the cores they also take turns on them.
void bm_call_latency(benchmark::State& state) {
  const int world_ranks = static_cast<int>(state.range(0));
  double per_call = 0;
  for (auto _ : state) per_call = chunkwise::measure_thread_collective_latency(world_ranks);
  state.counters["per_call_us"] = per_call * 1e6;
}
BENCHMARK(bm_call_latency)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMillisecond);

void sizes(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(4)->Range(1 << 20, 256 << 20)->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(bm_memcpy)->Apply(sizes);
BENCHMARK(bm_all_gather)->Apply(sizes);
BENCHMARK(bm_reduce_scatter)->Apply(sizes);
BENCHMARK(bm_all_reduce)->Apply(sizes);

BENCHMARK_MAIN();
