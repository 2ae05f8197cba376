// choose() over the 8 default plans: the DESIGN goal is < 50 ms for a 1,000-tensor model. Also the GPT-2 sizes.
#include <chunkwise/plan.hpp>
#include <chunkwise/profile.hpp>

#include <benchmark/benchmark.h>

#include <random>

using namespace chunkwise;

namespace {

/// A transformer-like model of `tensors` parameters: blocks of 12 tensors (4 matrices, 8 vectors), one pass per block
/// forward and backward, activations growing through forward.
model_profile synthetic_model(std::size_t tensors) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<std::uint64_t> matrix(1u << 20, 16u << 20), vector(256, 16384);
  model_profile model;
  model.name = "synthetic";
  for (std::uint32_t i = 0; i < tensors; ++i)
    model.tensors.push_back({"t", i % 3 == 0 ? matrix(rng) : vector(rng), dtype::bf16, tensor_role::parameter, i == 0});
  std::vector<profile_pass> forward;
  for (std::uint32_t first = 0; first < tensors; first += 12) {
    profile_pass pass{"block", pass_kind::forward, {}, 0, 1'000'000'000'000};
    for (std::uint32_t i = first; i < std::min<std::uint32_t>(first + 12, static_cast<std::uint32_t>(tensors)); ++i)
      pass.tensors.push_back(i);
    pass.activation_bytes = (forward.size() + 1) * 64 * MiB;
    forward.push_back(pass);
  }
  model.passes = forward;
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    auto pass = *it;
    pass.kind = pass_kind::backward;
    pass.flops *= 2;
    model.passes.push_back(pass);
  }
  return model;
}

const machine_profile machine = describe_machine({.gpus = 4, .gpu_memory = 24 * GiB, .host_memory = 256 * GiB});

void choose_synthetic(benchmark::State& state) {
  const auto model = synthetic_model(static_cast<std::size_t>(state.range(0)));
  std::size_t index = 0;
  for (auto _ : state) {
    const auto plans = evaluate<default_plans>(model, machine);
    benchmark::DoNotOptimize(plans);
    index = plans[0].feasible ? 0 : 1;
  }
  state.counters["plans"] = default_plans::size;
  benchmark::DoNotOptimize(index);
}
BENCHMARK(choose_synthetic)->Arg(100)->Arg(1000)->Unit(benchmark::kMillisecond);

void choose_gpt2(benchmark::State& state) {
  const auto model = gpt2_profile(gpt2_configs[static_cast<std::size_t>(state.range(0))]);
  state.SetLabel(model.name.str());
  for (auto _ : state) benchmark::DoNotOptimize(evaluate<default_plans>(model, machine));
}
BENCHMARK(choose_gpt2)->DenseRange(0, 6)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
