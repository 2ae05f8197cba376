// The GPT-2 device passes on Thrust's OpenMP device system (the GPU's source, run by the CPU): against the CPU
// loops (tests/gpt2_device_cases.hpp, the same cases the GPU runs in tests/cuda/gpt2_device_test.cu), and under the
// runtime: train_gpt2 --backend cuda's executor trains resident and streamed plans to the CPU executor's parameters,
// bit for bit.
#include <doctest/doctest.h>

#if CHUNKWISE_GPT2_DEVICE_TEST
#include "device_model_impl.hpp"
// On the host system the functors do the CPU loops' arithmetic in the loops' order: bit for bit.
#define GPT2_DEVICE_TOLERANCE 0.0
#include "gpt2_device_cases.hpp"

#include "chunked_trainer.hpp"
#include "tier_test_support.hpp"

#include <chunkwise/comm/thread_comm.hpp>
#include <chunkwise/runtime/isolated_comm.hpp>
#include <chunkwise/runtime/isolated_device.hpp>
#include <chunkwise/runtime/runtime.hpp>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

namespace {

using namespace chunkwise;

// split<>'s device blocks, as train_gpt2's plan search sets them: its 3 resident chunks and the 4 streamed ones the
// head's pass holds at once (the runtime's default, half the chunks and 2 blocks, is too few for this small model).
template <class Plan>
std::optional<std::size_t> device_blocks() {
  if constexpr (requires { Plan::placement::stream_blocks; }) return 7;
  return std::nullopt;
}

// The NVMe plans' store: a directory of this process's, made at the first use and removed at exit.
const std::filesystem::path& nvme_directory() {
  static const test::temp_dir directory;
  return directory.path();
}

// Both sides' runtime options: fp16 scales its loss (train_gpt2 does), and the passes add gradients times the scale.
template <class Plan>
runtime_options run_options(byte_count device_budget, dtype type) {
  runtime_options options;
  options.device_budget = device_budget;
  options.nvme_directory = nvme_directory();
  options.device_blocks = device_blocks<Plan>();
  if (type == dtype::fp16) options.loss_scaling = optim::loss_scaler_config{};
  return options;
}

/// Parameters after 3 steps under Plan on one rank, with the passes on the CPU loops (chunk_executor) or on the
/// device passes (device_executor).
template <class Plan>
std::vector<std::vector<float>> train(bool on_device, byte_count device_budget, byte_count* streamed = nullptr,
                                     dtype type = dtype::fp32) {
  auto config = gpt2_device_cases::small_config();
  const auto model = gpt2::trace_profile(config, type);
  thread_world world(1);
  auto comm = world.comm(0);
  runtime<Plan, host_backend, thread_comm> rt(model, comm, gpt2::initializer(config, 9),
                                              run_options<Plan>(device_budget, type));
  fp32_compute compute(rt);
  gpt2::activations<float> acts(config);
  gpt2::chunk_executor cpu(rt, compute, acts);
  gpt2::device_workspace workspace(config);
  gpt2::chunk_tensors chunks(rt, compute);
  gpt2::device_executor device(chunks, workspace, config);
  std::vector<int> tokens, targets;
  for (unsigned step = 0; step < 3; ++step) {
    gpt2_device_cases::batch_of(config, step, tokens, targets);
    rt.zero_grad();
    cpu.restart();
    chunks.restart();
    if (on_device) {
      gpt2::forward(device, config, tokens.data(), targets.data());
      gpt2::backward(device, config, tokens.data(), targets.data());
    } else {
      gpt2::forward(cpu, config, tokens.data(), targets.data());
      gpt2::backward(cpu, config, tokens.data(), targets.data());
    }
    rt.step(1e-3f);
  }
  if (on_device) {  // nothing lent, so all its own: the activations, the scratch, the mirror, the gradient staging
    const std::size_t scratch = (gpt2::device_workspace::scratch_bytes(config) + 3) / 4 * 4;
    CHECK(workspace.own_device_bytes() == gpt2::activations<float>::total_bytes(config) + scratch +
                                              model.tensor_bytes() + gpt2::device_workspace::staging_bytes(config) / 2);
  }
  std::vector<std::vector<float>> parameters;
  for (std::uint32_t t = 0; t < model.tensors.size(); ++t) parameters.push_back(rt.read_parameters(t));
  if (streamed != nullptr) *streamed = rt.traffic().fetched;
  return parameters;
}

// The isolated device's "kernels" run on the host aliases of its memory, on the calling thread: done at once.
struct host_aliases {
  template <class T>
  T* address(T* device) const {
    return static_cast<T*>(host_alias(device));
  }
  [[nodiscard]] host_event computed() const { return {}; }
};

/// Parameters after 3 steps under Plan on `ranks` thread ranks (each its rows of the same batch) with the chunks in
/// Backend's memory: the host's, where the CPU executor computes on them (through fp32_compute), or memory the host
/// cannot address (runtime<Plan, isolated_backend, isolated_comm>), where train_gpt2 --backend cuda's
/// device_chunk_executor hands the device passes the runtime's own parameter and gradient memory, as on a GPU, and
/// the activations live in the runtime's device tier (device_budget must hold them beside the chunks).
template <class Plan, class Backend, class Comm>
std::vector<std::vector<float>> train_ranks(int ranks, byte_count device_budget, dtype type) {
  auto config = gpt2_device_cases::small_config();
  config.batch /= static_cast<std::size_t>(ranks);
  const auto model = gpt2::trace_profile(config, type);
  thread_world world(ranks);
  std::vector<std::vector<float>> parameters(model.tensors.size());
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        Comm comm(world.comm(r));
        using runtime_type = runtime<Plan, Backend, Comm>;
        runtime_type rt(model, comm, gpt2::initializer(config, 9), run_options<Plan>(device_budget, type));
        std::vector<int> tokens, targets;
        const auto steps = [&](auto& executor) {
          for (unsigned step = 0; step < 3; ++step) {
            gpt2_device_cases::batch_of(gpt2_device_cases::small_config(), step, tokens, targets);
            const std::size_t first = static_cast<std::size_t>(r) * config.batch * config.context;
            rt.zero_grad();
            executor.restart();
            gpt2::forward(executor, config, tokens.data() + first, targets.data() + first);
            gpt2::backward(executor, config, tokens.data() + first, targets.data() + first);
            rt.step(1e-3f);
          }
        };
        if constexpr (runtime_type::chunks_on_host) {
          fp32_compute compute(rt);
          gpt2::activations<float> acts(config);
          gpt2::chunk_executor cpu(rt, compute, acts);
          steps(cpu);
        } else {
          // The activations, the scratch, and for bf16 chunks the staging areas, in the runtime's device tier, as
          // train_gpt2 --backend cuda takes them (the kernels here write the isolated device's host aliases).
          const byte_count bytes = gpt2::activations<float>::total_bytes(config);
          const bool staged = type != dtype::fp32;
          const byte_count staging_bytes = staged ? gpt2::device_workspace::staging_bytes(config) : 0;
          const byte_count scratch_bytes = gpt2::device_workspace::scratch_bytes(config);
          const byte_count in_use = rt.device_stats().in_use;
          auto activation_memory = rt.device_workspace(bytes);
          auto scratch_memory = rt.device_workspace(scratch_bytes);
          auto staging_memory = staged ? rt.device_workspace(staging_bytes) : typename runtime_type::workspace{};
          CHECK(rt.device_stats().in_use == in_use + bytes + scratch_bytes + staging_bytes);
          float* lent = host_aliases{}.address(activation_memory.data());
          std::fill_n(lent, bytes / sizeof(float), -1e30f);  // the workspace zeroes it
          float* lent_scratch = host_aliases{}.address(scratch_memory.data());
          std::fill_n(lent_scratch, scratch_bytes / sizeof(float), -1e30f);  // nothing reads it before writing it
          float* lent_staging = staged ? host_aliases{}.address(staging_memory.data()) : nullptr;
          gpt2::device_workspace workspace(config, false, {lent, lent_staging, lent_scratch});
          const auto& held = workspace.buffers();
          CHECK(held.encoded.data() == lent);  // the block's first buffer; dfcproj ends it
          CHECK(held.dfcproj.data() + held.dfcproj.size() == lent + bytes / sizeof(float));
          gpt2::device_chunk_executor device(rt, workspace, config, host_aliases{});
          steps(device);
          // Nothing outside the tier: fp32 chunks are computed on in place, with no staging area (each as large as
          // the largest pass's parameters); bf16 chunks are widened into the lent one and accumulated from the
          // other; the token arrays and row sums are in the lent scratch.
          CHECK(held.mirror.empty());
          CHECK(held.staged_parameters.owned.empty());
          CHECK(held.staged_gradients.owned.empty());
          CHECK(held.staged_parameters.lent == lent_staging);
          CHECK(held.scratch.tokens == reinterpret_cast<int*>(lent_scratch));
          CHECK(reinterpret_cast<char*>(held.scratch.row_stats + held.scratch.layout.row_stats_elements) <=
                reinterpret_cast<char*>(lent_scratch) + scratch_bytes);
          CHECK(workspace.own_device_bytes() == 0);
        }
        if (type == dtype::fp16) {  // the loss was scaled, and at least one step updated
          CHECK(rt.loss_scale() > 1.0f);
          CHECK(rt.steps() >= 1);
        }
        for (std::uint32_t t = 0; t < model.tensors.size(); ++t) {
          auto values = rt.read_parameters(t);
          if (r == 0) parameters[t] = std::move(values);
        }
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return parameters;
}
template <class Plan>
std::vector<std::vector<float>> train_on_device_chunks(int ranks, byte_count device_budget, dtype type) {
  return train_ranks<Plan, isolated_backend, isolated_comm>(ranks, device_budget, type);
}
template <class Plan>
std::vector<std::vector<float>> train_on_host_ranks(int ranks, dtype type) {
  return train_ranks<Plan, host_backend, thread_comm>(ranks, 1 * GiB, type);
}

using resident_plan = plan<gpt2::plans::chunks, resident, sharded, optimizer_follows_home>;
using streamed_plan = plan<gpt2::plans::chunks, cached<space::pinned_host>, sharded, optimizer_follows_home>;
using split_plan = plan<gpt2::plans::chunks, split<space::pinned_host>, sharded, optimizer_follows_home>;
using nvme_plan = plan<gpt2::plans::chunks, cached<space::nvme>, sharded, optimizer_follows_home>;
// A device budget of a few chunks for the streamed plans, so the cache fetches and evicts inside the step (split's
// 7 blocks beside its resident chunks' gradients and states: 16 MiB).
template <class Plan>
constexpr byte_count chunk_budget =
    std::is_same_v<Plan, split_plan> ? 16 * MiB : Plan::placement::uses_device_cache ? 6 * MiB : 1 * GiB;

// The largest relative difference of any tensor's parameters (the same tensors on both sides).
double worst_difference(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& expected) {
  REQUIRE(got.size() == expected.size());
  double worst = 0;
  for (std::size_t t = 0; t < got.size(); ++t)
    worst = std::max(worst, gpt2_device_cases::relative_difference(got[t], expected[t]));
  return worst;
}

}  // namespace

TEST_CASE_TEMPLATE("the device executor trains on chunk memory to the CPU executor's parameters", Plan, resident_plan,
                   streamed_plan) {
  const byte_count budget = chunk_budget<Plan>;
  byte_count streamed = 0;
  const auto cpu = train<Plan>(false, budget), device = train<Plan>(true, budget, &streamed);
  CHECK((streamed > 0) == std::is_same_v<Plan, streamed_plan>);  // the cache moved chunks while the GPU passes ran
  CHECK(worst_difference(device, cpu) == 0.0);
}

TEST_CASE_TEMPLATE("the device passes train on chunks in device memory, without copies, to the CPU's parameters", Plan,
                   resident_plan, streamed_plan, split_plan, nvme_plan) {
  // bf16 and fp16 chunks: widened on the device, the gradients added into the 16-bit accumulators there, times
  // fp16's loss scale (fp32_compute's maths on the CPU side). Every home: the device, pinned host memory (all
  // streamed, or split), the NVMe store.
  const byte_count budget = chunk_budget<Plan>;
  const auto config = gpt2_device_cases::small_config();
  const byte_count activations = gpt2::activations<float>::total_bytes(config);
  const byte_count scratch = gpt2::device_workspace::scratch_bytes(config);
  for (const dtype type : {dtype::fp32, dtype::bf16, dtype::fp16}) {
    CAPTURE(type);
    const byte_count staging = type != dtype::fp32 ? gpt2::device_workspace::staging_bytes(config) : 0;
    const auto cpu = train<Plan>(false, budget, nullptr, type);
    const byte_count device_budget = budget + activations + scratch + staging;
    CHECK(worst_difference(train_on_device_chunks<Plan>(1, device_budget, type), cpu) == 0.0);
  }
}

TEST_CASE("the device passes on chunks in device memory at 2 ranks over device collectives: the host backend's bits") {
  // Two thread ranks whose collectives refuse host memory (as NCCL's): the same parameters as the CPU executor on
  // the host backend at 2 ranks.
  using zero2 = plan<gpt2::plans::chunks, resident, shard_grads, optimizer_follows_home>;
  for (const dtype type : {dtype::fp32, dtype::bf16, dtype::fp16}) {
    CAPTURE(type);
    CHECK(worst_difference(train_on_device_chunks<zero2>(2, 1 * GiB, type), train_on_host_ranks<zero2>(2, type)) ==
          0.0);
  }
}
TEST_CASE("a checkpoint loaded under the device executor reaches the device mirror, at a step count it has seen") {
  // --gpu-chunks off: the passes compute on a device copy of the host chunks, taken again where the parameters'
  // version changed. Run A's checkpoint, saved after its step 1, loaded after run B's step 1 (at another learning
  // rate): the step count is 1 before and after, the parameters are A's, and B's next forward must see them.
  using Plan = resident_plan;
  const auto config = gpt2_device_cases::small_config();
  const auto model = gpt2::trace_profile(config);
  const test::temp_dir saved;
  thread_world world(1);
  auto comm = world.comm(0);
  using runtime_type = runtime<Plan, host_backend, thread_comm>;
  const auto make_runtime = [&] {
    return std::make_unique<runtime_type>(model, comm, gpt2::initializer(config, 9),
                                          run_options<Plan>(1 * GiB, dtype::fp32));
  };
  std::vector<int> tokens, targets;
  const auto step = [&](runtime_type& rt, auto& executor, auto& restart, float lr) {
    gpt2_device_cases::batch_of(config, 0, tokens, targets);
    rt.zero_grad();
    restart();
    gpt2::forward(executor, config, tokens.data(), targets.data());
    gpt2::backward(executor, config, tokens.data(), targets.data());
    rt.step(lr);
    gpt2_device_cases::batch_of(config, 1, tokens, targets);  // the evaluations' batch
    restart();
  };
  double expected = 0;  // run A's loss after its step, on the CPU executor
  {
    const auto rt = make_runtime();
    fp32_compute compute(*rt);
    gpt2::activations<float> acts(config);
    gpt2::chunk_executor cpu(*rt, compute, acts);
    const auto restart = [&] { cpu.restart(); };
    step(*rt, cpu, restart, 1e-3f);
    rt->save_checkpoint(saved.path());
    expected = gpt2::forward(cpu, config, tokens.data(), targets.data());
  }
  const auto rt = make_runtime();
  fp32_compute compute(*rt);
  gpt2::device_workspace workspace(config);
  gpt2::chunk_tensors chunks(*rt, compute);
  gpt2::device_executor device(chunks, workspace, config);
  const auto restart = [&] { chunks.restart(); };
  step(*rt, device, restart, 1e-2f);
  const double own = gpt2::forward(device, config, tokens.data(), targets.data());  // the mirror takes B's step 1
  rt->load_checkpoint(saved.path());
  REQUIRE(rt->steps() == 1);
  restart();
  const double loaded = gpt2::forward(device, config, tokens.data(), targets.data());
  CHECK(own != expected);  // the runs' parameters differ
  CHECK(loaded == expected);
}

TEST_CASE("the embedding's backward on the device adds each token's positions in the CPU's order, bit for bit") {
  // Five tokens over the batch, each at many positions: the buckets' order is what makes the bits the CPU's.
  const auto config = gpt2_device_cases::small_config();
  gpt2::device_workspace workspace(config, /*bf16_products=*/false);
  auto& s = workspace.buffers();
  const std::size_t B = config.batch, T = config.context, C = config.channels, BT = B * T;
  std::vector<int> tokens(BT);
  for (std::size_t i = 0; i < BT; ++i) tokens[i] = static_cast<int>((i * 7) % 5);
  float* dresidual = gpt2::device_detail::raw(s.dresidual) + s.dresidual_offset(0);
  for (std::size_t i = 0; i < BT * C; ++i) dresidual[i] = std::sin(static_cast<float>(i) * 0.61f) * 2.0f;
  std::vector<float> dwte(config.vocab_rows() * C, 0.5f), dwpe(T * C, 0.25f);
  auto cpu_wte = dwte, cpu_wpe = dwpe;
  gpt2::embed_backward(dwte.data(), dwpe.data(), tokens.data(), workspace);
  gpt2::kernels::encoder_backward(cpu_wte.data(), cpu_wpe.data(), dresidual, tokens.data(), B, T, C);
  CHECK(s.token_buckets == 5);
  CHECK(dwte == cpu_wte);
  CHECK(dwpe == cpu_wpe);
}

TEST_CASE("the device executor leaves the gradients on the device where its sink says so (the device chunks' rate)") {
  // measure_device_pass_flops for passes on device chunks: nothing copied down, the host's gradients untouched.
  const auto config = gpt2_device_cases::small_config();
  std::vector<int> tokens, targets;
  gpt2_device_cases::batch_of(config, 0, tokens, targets);
  for (const auto sink : {gpt2::gradient_sink::host, gpt2::gradient_sink::device}) {
    gpt2::reference_trainer trainer(config, 3);
    trainer.zero_gradients();
    gpt2::device_workspace workspace(config);
    gpt2::trainer_tensors host{&trainer};
    gpt2::device_executor run(host, workspace, config, sink);
    gpt2::forward(run, config, tokens.data(), targets.data());
    gpt2::backward(run, config, tokens.data(), targets.data());
    const auto dwpe = trainer.gradient(gpt2::wpe_index);
    const bool touched = std::any_of(dwpe.begin(), dwpe.end(), [](float g) { return g != 0.0f; });
    CHECK(touched == (sink == gpt2::gradient_sink::host));
  }
  CHECK(gpt2::measure_device_pass_flops(config, false, gpt2::gradient_sink::device, 1) > 0);
}

TEST_CASE("a product's bias added by the pass after it gives add_bias's bits (the GPU's projections and MLP, GELU's "
          "backward)") {
  // The GPU's products leave their bias out; residual_bias_forward and bias_gelu_forward add it where they read the
  // product: the same two roundings as add_bias and then the residual or GELU. The host build's products add their
  // own (null bias here), which the whole-model tests cover.
  using namespace gpt2::device_kernels;
  using index = gpt2::device_kernels::index;  // not POSIX's index()
  const index rows = 9, OC = 37, n = rows * OC;
  std::vector<float> product(n), residual(n), bias(OC);
  for (index i = 0; i < n; ++i) {
    product[i] = std::sin(static_cast<float>(i) * 0.71f) * 3.0f;
    residual[i] = std::cos(static_cast<float>(i) * 0.23f) * 1e3f;
  }
  for (index o = 0; o < OC; ++o) bias[o] = 0.1f * static_cast<float>(o) - 1.7f;
  auto biased = product;
  for (index i = 0; i < n; ++i) add_bias{biased.data(), bias.data(), OC}(i);
  std::vector<float> expected(n), got(n), staged_gelu(n), fused_gelu(n), pre = product;
  for (index i = 0; i < n; ++i) {
    expected[i] = residual[i] + biased[i];
    residual_bias_forward{got.data(), residual.data(), product.data(), bias.data(), OC}(i);
    staged_gelu[i] = gelu(biased[i]);
    bias_gelu_forward{fused_gelu.data(), pre.data(), bias.data(), OC}(i);
  }
  CHECK(got == expected);
  CHECK(fused_gelu == staged_gelu);
  CHECK(pre == product);  // not written back: backward adds the bias again
  for (index i = 0; i < n; ++i) residual_bias_forward{got.data(), residual.data(), biased.data(), nullptr, OC}(i);
  CHECK(got == expected);  // null: the product added its bias itself
  // GELU's backward from the product and the bias equals it from the biased pre-activation, bit for bit.
  std::vector<float> dout(n), from_sum(n), from_product(n);
  for (index i = 0; i < n; ++i) dout[i] = std::cos(static_cast<float>(i) * 0.41f);
  for (index i = 0; i < n; ++i) {
    gelu_backward{from_sum.data(), biased.data(), nullptr, OC, dout.data()}(i);
    gelu_backward{from_product.data(), product.data(), bias.data(), OC, dout.data()}(i);
  }
  CHECK(from_product == from_sum);
  CHECK(from_sum != dout);
}

TEST_CASE("the host's lanes add in the butterfly's order, as a warp's shuffles do") {
  // Lane 0 holds 1e8, lane 16 -1e8, the others 1: the butterfly's first step cancels the pair (lanes 0 and 16), so
  // the ones all count (30); the row's order adds them to 1e8 first, where they round away (15).
  using gpt2::warp_lanes::host_lanes;
  host_lanes::values v;
  v.fill(1.0f);
  v[0] = 1e8f;
  v[16] = -1e8f;
  CHECK(host_lanes::sum(v) == 30.0f);
  float sequential = 0;
  for (const float x : v) sequential += x;
  CHECK(sequential == 15.0f);
  v[5] = 2e8f;
  CHECK(host_lanes::max(v) == 2e8f);
}

TEST_CASE("a softmax's max and sum of exponentials in one pass (exp_sum) equal two passes', lanes with none included") {
  using gpt2::warp_lanes::host_lanes;
  for (const std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{32}, std::size_t{77}, std::size_t{1000}}) {
    std::vector<float> row(n);
    for (std::size_t i = 0; i < n; ++i) row[i] = 8.0f * std::sin(0.37f * static_cast<float>(i * i % 101));
    const auto stats = host_lanes{}.max_and_exp_sum(n, [&](std::size_t i) { return row[i]; });
    const float max = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (const float x : row) sum += std::exp(static_cast<double>(x) - max);
    CHECK(stats.max == max);
    CHECK(stats.sum == doctest::Approx(sum).epsilon(1e-6));
  }
  CHECK(host_lanes{}.max_and_exp_sum(0, [](std::size_t) { return 0.0f; }).sum == 0.0f);  // no lane saw a value
}

TEST_CASE("backward's bias sums on the device, by segments of rows, give the CPU's column sums bit for bit") {
  // The GPU's bias backward (matmul_context::backward); the host build's products leave it to the CPU loops, so it is
  // checked here alone: 150 rows (two whole segments and a partial one) of 37 columns, onto a nonzero dbias.
  using namespace gpt2::device_kernels;
  using index = gpt2::device_kernels::index;  // not POSIX's index()
  const index rows = 150, OC = 37;
  std::vector<float> dout(rows * OC), dbias(OC), expected;
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = std::sin(static_cast<float>(i) * 0.37f) * 3.0f;
  for (std::size_t o = 0; o < dbias.size(); ++o) dbias[o] = 0.25f * static_cast<float>(o);
  expected = dbias;
  gpt2::add_column_sums(expected.data(), dout.data(), rows, OC);
  const column_segments segments{rows, OC};
  REQUIRE(segments.count() == 3);
  std::vector<float> parts(segments.count() * OC);
  for (index i = 0; i < parts.size(); ++i) bias_backward_partials{parts.data(), dout.data(), segments}(i);
  for (index o = 0; o < OC; ++o) bias_backward{dbias.data(), parts.data(), segments}(o);
  CHECK(dbias == expected);
  // The plain order, row after row, gives other bits: the test tells the orders apart.
  std::vector<float> sequential(OC);
  for (index o = 0; o < OC; ++o) sequential[o] = 0.25f * static_cast<float>(o);
  for (index r = 0; r < rows; ++r)
    for (index o = 0; o < OC; ++o) sequential[o] += dout[r * OC + o];
  CHECK(sequential != expected);
}

TEST_CASE("attention's batched products (the GPU's cuBLAS calls) compute the per-element stages' values") {
  // The descriptors the GPU hands cuBLAS, each one call over every head of every sequence, run by reference_gemm
  // (cuBLAS's definition in loops, over the matrices batch_pointers gives the GPU) against the stages the host build
  // runs: B = 2 sequences of T = 5 positions, 2 heads of 4 channels. Differences are fp32 rounding (alpha scales the
  // sum, the stage each term); a wrong stride or leading dimension reads another head, position or sequence.
  using namespace gpt2::device_kernels;
  using index = gpt2::device_kernels::index;  // not POSIX's index()
  namespace products = gpt2::attention_products;
  const attention_geometry g{5, 8, 2};
  const index B = 2, T = g.T, C = g.C, NH = g.NH, blocks = B * NH * T * T, channels = B * T * C;
  std::vector<float> qkv(B * T * 3 * C), dout(channels), dqkv_start(qkv.size());
  std::uint32_t seed = 7;
  const auto random = [&] {
    seed = seed * 1664525u + 1013904223u;
    return static_cast<float>(seed >> 8) / static_cast<float>(1u << 24) - 0.5f;
  };
  for (auto* v : {&qkv, &dout, &dqkv_start}) std::generate(v->begin(), v->end(), random);
  const auto for_all = [](index n, const auto& stage) {
    for (index i = 0; i < n; ++i) stage(i);
  };
  const auto close = [](const std::vector<float>& got, const std::vector<float>& expected, auto used) {
    for (std::size_t i = 0; i < got.size(); ++i)
      if (used(i)) REQUIRE(got[i] == doctest::Approx(expected[i]).epsilon(1e-5).scale(1.0));
  };
  const auto causal = [&](std::size_t i) { return i % T <= (i / T) % T; };  // t2 <= t in (B, NH, T, T)
  const auto every = [](std::size_t) { return true; };

  std::vector<float> preatt(blocks, 0.0f), preatt_products(blocks, 0.0f);
  for_all(blocks, attention_scores{preatt.data(), qkv.data(), g});
  products::reference_gemm(products::scores(g, qkv.data(), preatt_products.data(), B));
  close(preatt_products, preatt, causal);

  std::vector<float> att(preatt);  // past t the softmax must write zeros: the products add every position
  for (std::size_t i = 0; i < att.size(); ++i)
    if (!causal(i)) att[i] = 1e3f;
  for_all(B * NH * T, attention_softmax{att.data(), T});
  for (std::size_t i = 0; i < att.size(); ++i)
    if (!causal(i)) REQUIRE(att[i] == 0.0f);
  std::vector<float> out(channels), out_products(channels);
  for_all(channels, attention_values{out.data(), att.data(), qkv.data(), g});
  products::reference_gemm(products::values(g, att.data(), qkv.data(), out_products.data(), B));
  close(out_products, out, every);

  // The GPU's datt is not zeroed first: the product overwrites it whole, and the softmax's backward writes the
  // scores' gradients over it, zeros past t, which the products below then read over whole rows.
  std::vector<float> datt(blocks, -1e3f), datt_products(blocks, 1e3f);
  for_all(blocks, attention_backward_weights{datt.data(), dout.data(), qkv.data(), g});
  products::reference_gemm(products::attention_weights_backward(g, dout.data(), qkv.data(), datt_products.data(), B));
  close(datt_products, datt, causal);
  const std::vector<float> weights_gradients = datt;
  for_all(B * NH * T, attention_backward_softmax{datt.data(), att.data(), T});
  for_all(B * NH * T, attention_backward_softmax{datt_products.data(), att.data(), T});
  for (std::size_t i = 0; i < blocks; ++i)
    if (!causal(i)) REQUIRE(datt_products[i] == 0.0f);
  close(datt_products, datt, every);
  CHECK(datt != weights_gradients);
  const auto& dpreatt = datt;
  const auto& dpreatt_products = datt_products;

  // Both write dqkv whole: the stages and the products start from different values there, and agree.
  std::vector<float> dqkv = dqkv_start, dqkv_products(dqkv_start.size(), 1e3f);
  for_all(channels, attention_backward_queries{dqkv.data(), dpreatt.data(), qkv.data(), g});
  for_all(channels,
          attention_backward_keys_values{dqkv.data(), dpreatt.data(), att.data(), dout.data(), qkv.data(), g});
  float* dq = dqkv_products.data();
  products::reference_gemm(products::queries_backward(g, dpreatt_products.data(), qkv.data(), dq, B));
  products::reference_gemm(products::keys_backward(g, dpreatt_products.data(), qkv.data(), dq, B));
  products::reference_gemm(products::values_backward(g, att.data(), dout.data(), dq, B));
  close(dqkv_products, dqkv, every);
  CHECK(dqkv != dqkv_start);
}
#else
TEST_CASE("GPT-2's device passes: not built (no Thrust headers: the CUDA toolkit's CCCL or Debian's libthrust-dev)") {
  MESSAGE("skipped: Thrust not found at configure time");
}
#endif
