// CPU optimizer throughput in parameters/s and bytes/s (28 bytes per fp32 AdamW parameter: read grad, read+write
// master, exp_avg, exp_avg_sq; 30 with a bf16 working copy), beside the in-place read-modify-write bandwidth
// (x += s * y, 12 bytes per element) that bounds it, and the STREAM triad (a = b + s * c, 12 bytes per element).
// Arguments: parameters, threads. Sizes: 1M, 16M, 256M parameters by default; CHUNKWISE_BENCH_PARAMS=67108864,...
// and CHUNKWISE_BENCH_THREADS=1,2 replace them (bench/compare/cpu_adam.sh uses that).
//   chunkwise_optim_bench --benchmark_filter='adamw_fp32/params:268435456'   (one size)
#include <chunkwise/optim.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

using namespace chunkwise;
using namespace chunkwise::optim;

namespace {

template <class T>
struct aligned_array {
  struct deleter {
    void operator()(T* p) const noexcept { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<T[], deleter> data;
  explicit aligned_array(std::size_t n, T value)
      : data(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{64}))) {
    for (std::size_t i = 0; i < n; ++i) data[i] = value;  // touch every page before timing
  }
  T* get() const noexcept { return data.get(); }
};

void adamw(benchmark::State& state, bool bf16_copy, cpu_isa isa) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto threads = static_cast<unsigned>(state.range(1));
  aligned_array<float> master(n, 0.5f), grad(n, 1e-3f), m1(n, 0.0f), m2(n, 0.0f);
  aligned_array<bf16> working(bf16_copy ? n : 1, bf16{0});
  chunk_arrays chunk{master.get(), grad.get(), dtype::fp32, m1.get(), m2.get(), bf16_copy ? working.get() : nullptr,
                    dtype::bf16, n};
  cpu_adam adam(adamw_config(), {.threads = threads, .isa = isa, .tile_elements = std::size_t{1} << 15});
  std::uint64_t step = 0;
  for (auto _ : state) {
    adam.step(chunk, {1e-3f, ++step, 1.0f});
    benchmark::ClobberMemory();
  }
  const auto items = static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n);
  state.SetItemsProcessed(items);
  state.SetBytesProcessed(items * (bf16_copy ? 30 : 28));
}

void adamw_fp32(benchmark::State& state) { adamw(state, false, cpu_isa::best); }
void adamw_bf16_copy(benchmark::State& state) { adamw(state, true, cpu_isa::best); }
void adamw_fp32_avx2(benchmark::State& state) {
  if (!cpu_supports(cpu_isa::avx2)) {
    state.SkipWithError("no AVX2 on this CPU");
    return;
  }
  adamw(state, false, cpu_isa::avx2);
}

void grad_norm(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  aligned_array<float> grad(n, 1e-3f);
  chunk_arrays chunk{nullptr, grad.get(), dtype::fp32, nullptr, nullptr, nullptr, dtype::bf16, n};
  cpu_adam adam(adamw_config(), {.threads = static_cast<unsigned>(state.range(1))});
  for (auto _ : state) benchmark::DoNotOptimize(adam.grad_sum_of_squares(std::span(&chunk, 1)));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n) * 4);
}

// The roofline loops, compiled for the widest vectors the CPU has (resolved at load time).
#if CHUNKWISE_OPTIM_X86
#define CHUNKWISE_BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CHUNKWISE_BENCH_CLONES
#endif

CHUNKWISE_BENCH_CLONES void rmw_kernel(float* x, const float* y, float s, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) x[i] += s * y[i];
}

/// The roofline: in-place read-modify-write x += s * y, 12 bytes per element, on the same tiles and threads.
void rmw_bandwidth(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto threads = static_cast<unsigned>(state.range(1));
  aligned_array<float> x(n, 1.0f), y(n, 1e-7f);
  worker_threads pool(threads - 1);  // and the caller
  const std::size_t tile = std::size_t{1} << 15;
  for (auto _ : state) {
    pool.parallel_for((n + tile - 1) / tile, [&](std::size_t t) noexcept {
      const std::size_t begin = t * tile;
      rmw_kernel(x.get() + begin, y.get() + begin, 1e-3f, std::min(tile, n - begin));
    });
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n) * 12);
}

CHUNKWISE_BENCH_CLONES void triad_kernel(float* a, const float* b, const float* c, float s, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

/// STREAM's triad a = b + s * c, counted as STREAM counts it: 12 bytes per element.
void triad_bandwidth(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  aligned_array<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  worker_threads pool(static_cast<std::size_t>(state.range(1)) - 1);  // and the caller
  const std::size_t tile = std::size_t{1} << 15;
  for (auto _ : state) {
    pool.parallel_for((n + tile - 1) / tile, [&](std::size_t t) noexcept {
      const std::size_t begin = t * tile;
      triad_kernel(a.get() + begin, b.get() + begin, c.get() + begin, 3.0f, std::min(tile, n - begin));
    });
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n) * 12);
}

std::vector<std::int64_t> list_from_env(const char* name, std::vector<std::int64_t> fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  std::vector<std::int64_t> values;
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    const long long value = std::strtoll(p, &end, 10);
    if (end == p || value <= 0) {
      std::fprintf(stderr, "%s: cannot read '%s' as a comma-separated list of positive integers\n", name, text);
      std::exit(2);
    }
    values.push_back(value);
    p = *end == ',' ? end + 1 : end;
  }
  return values;
}

void sizes_and_threads(benchmark::internal::Benchmark* b) {
  static const auto sizes = list_from_env("CHUNKWISE_BENCH_PARAMS", {1 << 20, 1 << 24, 1 << 28});
  static const auto threads = list_from_env("CHUNKWISE_BENCH_THREADS", {1, 2});
  // CHUNKWISE_BENCH_ITERATIONS=k: exactly k steps per repetition (with --benchmark_repetitions, the best
  // repetition is the best-of statistic the compare script uses for every contender).
  static const auto iterations = list_from_env("CHUNKWISE_BENCH_ITERATIONS", {0});
  for (const std::int64_t n : sizes)
    for (const std::int64_t t : threads) b->Args({n, t});
  b->ArgNames({"params", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
  if (iterations.front() > 0) b->Iterations(iterations.front());
  else b->MinTime(0.3);
}

}  // namespace

BENCHMARK(adamw_fp32)->Apply(sizes_and_threads);
BENCHMARK(adamw_bf16_copy)->Apply(sizes_and_threads);
BENCHMARK(rmw_bandwidth)->Apply(sizes_and_threads);
BENCHMARK(triad_bandwidth)->Apply(sizes_and_threads);
BENCHMARK(grad_norm)
    ->Args({1 << 24, 1})
    ->Args({1 << 24, 2})
    ->ArgNames({"params", "threads"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// The AVX2 path, for machines without AVX-512 (skipped where the CPU lacks AVX2).
BENCHMARK(adamw_fp32_avx2)
    ->Args({1 << 24, 1})
    ->Args({1 << 24, 2})
    ->ArgNames({"params", "threads"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
