// min_waste search time for 100, 1,000 and 10,000 tensors (goal: < 5 ms for 1,000 on the CI machine), and the
// GPT-2 sizes. Tensor lists are transformer-like: per block a few large matrices and many small vectors, so the
// search has hundreds of chunk-count levels to walk, as a real model does.
#include <chunkwise/layout.hpp>
#include <chunkwise/profile.hpp>

#include <benchmark/benchmark.h>

#include <random>

using namespace chunkwise;

namespace {

model_profile transformer_like(std::size_t tensors, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint64_t> matrix(1u << 20, 16u << 20), vector(256, 16384);
  model_profile model;
  model.name = "synthetic";
  profile_pass pass{"all", pass_kind::forward, {}, 0};
  for (std::uint32_t i = 0; i < tensors; ++i) {
    const bool is_matrix = i % 3 == 0;
    model.tensors.push_back({"t", is_matrix ? matrix(rng) : vector(rng), dtype::fp32, tensor_role::parameter, i == 0});
    pass.tensors.push_back(i);
  }
  model.passes.push_back(pass);
  return model;
}

void min_waste_search(benchmark::State& state) {
  const auto model = transformer_like(static_cast<std::size_t>(state.range(0)), 42);
  std::uint64_t chunks = 0;
  for (auto _ : state) {
    const auto result = layout::min_waste<>::search(model, {.ranks = 4});
    chunks = result.chunk_count;
    benchmark::DoNotOptimize(result);
  }
  state.counters["chunks"] = static_cast<double>(chunks);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(min_waste_search)->Arg(100)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);

void min_waste_gpt2(benchmark::State& state) {
  const auto model = gpt2_profile(gpt2_configs[static_cast<std::size_t>(state.range(0))]);
  state.SetLabel(model.name.str());
  for (auto _ : state) benchmark::DoNotOptimize(layout::min_waste<>::search(model, {.ranks = 4}));
}
BENCHMARK(min_waste_gpt2)->DenseRange(0, 6)->Unit(benchmark::kMillisecond);

void gpt2_profile_build(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(gpt2_profile(gpt_20b));
}
BENCHMARK(gpt2_profile_build)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
