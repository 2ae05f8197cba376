// The GEMM rate of the BLAS the example trainer uses (OpenBLAS sgemm through blas_matmul.hpp's engine), at the
// products of GPT-2's blocks: rows = batch * context tokens, C channels, OC outputs (c_attn 3C, attn c_proj C, c_fc
// 4C, mlp c_proj C from 4C). bench/compare/trainer.sh takes the fastest as "the GEMM peak of the same BLAS".
// Without OpenBLAS (CHUNKWISE_GPT2_BLAS unset) the model's own loops are timed instead, labelled so.
#include <benchmark/benchmark.h>

#include "gpt2_model.hpp"
#if CHUNKWISE_GPT2_BLAS
#include "blas_matmul.hpp"
#endif

#include <cmath>
#include <cstddef>
#include <vector>

namespace {

void forward_product(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0)), C = static_cast<std::size_t>(state.range(1)),
             OC = static_cast<std::size_t>(state.range(2));
#if CHUNKWISE_GPT2_BLAS
  gpt2::installed_matmul_engine() = &gpt2::blas_matmul_engine(static_cast<int>(state.range(3)));
  state.SetLabel("OpenBLAS sgemm");
#else
  state.SetLabel("the model's loops (no OpenBLAS in this build)");
#endif
  std::vector<float> inp(rows * C), weight(OC * C), bias(OC), out(rows * OC);
  for (std::size_t i = 0; i < inp.size(); ++i) inp[i] = std::sin(static_cast<float>(i));
  for (std::size_t i = 0; i < weight.size(); ++i) weight[i] = 0.02f * std::cos(static_cast<float>(i));
  for (auto _ : state) {
    gpt2::kernels::matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), 1, rows, C, OC);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(rows * C * OC) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  gpt2::installed_matmul_engine() = nullptr;
}

// rows, C, OC, threads: GPT-2 124M's channels at batch 4 x context 64 (256 tokens), and 4x the tokens.
BENCHMARK(forward_product)
    ->ArgNames({"rows", "C", "OC", "threads"})
    ->Args({256, 768, 2304, 2})
    ->Args({256, 768, 768, 2})
    ->Args({256, 768, 3072, 2})
    ->Args({256, 3072, 768, 2})
    ->Args({1024, 768, 3072, 2})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
