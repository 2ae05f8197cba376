// The runtime trains the example GPT-2 under every resident plan on 1, 2 and 4 thread ranks to the same parameters
// as the plain reference trainer on the whole batch (the maths are the same functions; ranks average gradients).
#include <chunkwise/collective.hpp>
#include <chunkwise/comm/thread_comm.hpp>
#include <chunkwise/layout.hpp>
#include <chunkwise/placement.hpp>
#include <chunkwise/plan/default_plans.hpp>
#include <chunkwise/plan/dispatch.hpp>
#include <chunkwise/plan/layout_candidates.hpp>
#include <chunkwise/plan/plan.hpp>
#include <chunkwise/profile/gpt2.hpp>
#include <chunkwise/backend/host.hpp>
#include <chunkwise/runtime/isolated_device.hpp>
#include <chunkwise/runtime/runtime.hpp>

#include <doctest/doctest.h>

#include "chunked_trainer.hpp"
#include "data_loader.hpp"
#include "gpt2_model.hpp"
#include "llmc_files.hpp"
#include "reference_trainer.hpp"

#include <cmath>
#include <optional>
#include <filesystem>
#include <unistd.h>
#include <string>
#include <thread>

using namespace chunkwise;

namespace {

gpt2::model_config tiny(std::size_t batch) {
  gpt2::model_config config;
  config.vocab = 256;
  config.context = 16;
  config.channels = 32;
  config.heads = 4;
  config.layers = 2;
  config.batch = batch;
  return config;
}

constexpr std::uint64_t seed = 11;
constexpr int steps = 3;
constexpr float lr = 1e-3f;

/// What a training run does besides training: resume from a checkpoint first, save one after some step.
struct run_options {
  int steps = ::steps;
  std::string load_from{};     // load this checkpoint before the first step
  int skip_batches = 0;        // batches the checkpoint already trained on
  std::string save_to{};       // save a checkpoint after step `save_after` (0: right after loading)
  int save_after = 0;
  byte_count device_budget = ~byte_count{0};
  std::optional<std::size_t> offloaded_chunks{};
  std::optional<std::size_t> device_blocks{};
  std::string nvme_directory{};
  tier_stats* device_stats = nullptr;  // rank 0's device and host tier statistics at the end
  tier_stats* host_stats = nullptr;
  cache_stats* cache = nullptr;  // rank 0's device cache statistics at the end
  int micro_batches = 0;  // > 0: explicit gradient hand-over after this many accumulated forward+backward passes
  std::size_t* chunks = nullptr;    // rank 0's chunk count and streamed chunks
  std::size_t* streamed = nullptr;
  dtype type = dtype::fp32;  // the chunks' parameters and gradients (bf16: fp32 master weights and moments)
  std::optional<std::size_t> layout_candidate{};  // the search's knob: which of the layout's candidates
  const std::vector<std::vector<float>>* initial = nullptr;  // initial parameters per tensor (else the seed's)
  bool recompute = false;  // activation checkpointing in the trainer's schedule
  bool activations_on_device = false;  // the activations in the runtime's device tier, as train_gpt2 keeps them
};

/// Trains `ranks` thread ranks under Plan; returns rank 0's parameters per tensor and the transition statistics of
/// rank 0.
template <class Plan, class Backend = host_backend>
std::pair<std::vector<std::vector<float>>, chunk_statistics> train(int ranks, const run_options& run = {}) {
  auto config = tiny(1);
  config.recompute = run.recompute;
  auto model = gpt2_profile(gpt2::profile_config(config));
  for (auto& tensor : model.tensors) tensor.type = run.type;
  const int micro = std::max(run.micro_batches, 1);
  gpt2::data_loader loader(gpt2::default_data_file, gpt2::data_split::train, static_cast<std::size_t>(ranks * micro),
                           config.context, seed);
  std::vector<std::vector<int>> tokens, targets;
  for (int s = 0; s < run.skip_batches; ++s) loader.next_batch();
  for (int s = 0; s < run.steps; ++s) {
    loader.next_batch();
    tokens.emplace_back(loader.tokens().begin(), loader.tokens().end());
    targets.emplace_back(loader.targets().begin(), loader.targets().end());
  }
  thread_world world(ranks, std::chrono::milliseconds(20'000));
  std::vector<std::vector<float>> result(model.tensors.size());
  chunk_statistics statistics;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = world.comm(r);
        runtime_options options;
        options.device_budget = run.device_budget;
        options.offloaded_chunks = run.offloaded_chunks;
        options.device_blocks = run.device_blocks;
        options.layout_candidate = run.layout_candidate;
        if (!run.nvme_directory.empty()) options.nvme_directory = run.nvme_directory;
        if (run.micro_batches > 0) options.handover = gradient_handover::explicit_calls;
        const tensor_initializer initialize =
            run.initial == nullptr ? gpt2::initializer(config, seed) : [&run](std::uint32_t t, std::span<float> values) {
              std::copy((*run.initial)[t].begin(), (*run.initial)[t].end(), values.begin());
            };
        runtime<Plan, Backend, thread_comm> rt(model, comm, initialize, options);
        const auto activation_bytes = gpt2::activations<float>::total_bytes(config);
        auto activation_memory = run.activations_on_device ? rt.device_workspace(activation_bytes)
                                                           : typename decltype(rt)::workspace{};
        gpt2::activations<float> acts(config, run.activations_on_device ? activation_memory.data()
                                                                        : nullptr);
        fp32_compute compute(rt);
        gpt2::chunk_executor passes(rt, compute, acts);  // the step's schedule on chunk memory
        if (!run.load_from.empty()) rt.load_checkpoint(run.load_from);
        if (!run.save_to.empty() && run.save_after == 0) rt.save_checkpoint(run.save_to);  // resave what was loaded
        const std::size_t window = config.context;
        for (int s = 0; s < run.steps; ++s) {
          rt.zero_grad();
          for (int m = 0; m < micro; ++m) {
            const std::size_t at = static_cast<std::size_t>(r * micro + m) * window;
            const int* x = tokens[static_cast<std::size_t>(s)].data() + at;
            const int* y = targets[static_cast<std::size_t>(s)].data() + at;
            passes.restart();
            gpt2::forward(passes, config, x, y);
            gpt2::backward(passes, config, x, y);
          }
          if (run.micro_batches > 0)
            for (std::uint32_t t = 0; t < model.tensors.size(); ++t) rt.grad_ready(t);
          rt.step(lr);
          if (!run.save_to.empty() && s + 1 == run.save_after) rt.save_checkpoint(run.save_to);
        }
        for (std::uint32_t t = 0; t < model.tensors.size(); ++t) {
          auto values = rt.read_parameters(t);
          if (r == 0) result[t] = std::move(values);
        }
        if (r == 0) {
          statistics = rt.statistics();
          if (run.device_stats != nullptr) *run.device_stats = rt.device_stats();
          if (run.host_stats != nullptr) *run.host_stats = rt.host_stats();
          if (run.cache != nullptr) *run.cache = rt.cache_stats();
          if (run.chunks != nullptr) *run.chunks = rt.layout().chunks.size();
          if (run.streamed != nullptr) *run.streamed = rt.streamed_chunks();
        }
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  // The error that says why: a rank's own, before another rank's report that it failed.
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const error& failure) {
      if (std::string(failure.what()).find("other rank(s)") == std::string::npos) throw;
    }
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return {result, statistics};
}

/// The plain trainer (no chunkwise): each rank's micro-batches through the same pass functions, accumulating its own
/// gradients, then averaged as the communicator does (fp32 sums in rank order, divided once; hybrid<G>: the mean over groups of
/// the group means), then the same AdamW.
std::vector<std::vector<float>> reference(int ranks, int group = 0, int micro_batches = 1,
                                          const std::vector<std::vector<float>>* initial = nullptr) {
  const auto config = tiny(1);
  gpt2::reference_trainer trainer(config, seed);
  if (initial != nullptr)
    for (std::size_t t = 0; t < initial->size(); ++t)
      std::copy((*initial)[t].begin(), (*initial)[t].end(), trainer.parameter(t).begin());
  gpt2::data_loader loader(gpt2::default_data_file, gpt2::data_split::train,
                           static_cast<std::size_t>(ranks * micro_batches), config.context, seed);
  const std::size_t tensors = trainer.tensors().size();
  const auto average = [](const std::vector<const std::vector<std::vector<float>>*>& parts) {
    std::vector<std::vector<float>> mean = *parts[0];
    for (std::size_t q = 1; q < parts.size(); ++q)
      for (std::size_t t = 0; t < mean.size(); ++t)
        for (std::size_t i = 0; i < mean[t].size(); ++i) mean[t][i] += (*parts[q])[t][i];
    for (auto& tensor : mean)
      for (auto& value : tensor) value /= static_cast<float>(parts.size());
    return mean;
  };
  for (int s = 0; s < steps; ++s) {
    loader.next_batch();
    std::vector<std::vector<std::vector<float>>> grads(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      trainer.zero_gradients();
      for (int m = 0; m < micro_batches; ++m) {  // micro-batches accumulate into the same gradients
        const std::size_t offset = static_cast<std::size_t>(r * micro_batches + m) * config.context;
        trainer.forward(loader.tokens().data() + offset, loader.targets().data() + offset);
        trainer.backward(loader.tokens().data() + offset, loader.targets().data() + offset);
      }
      for (std::size_t t = 0; t < tensors; ++t)
        grads[static_cast<std::size_t>(r)].emplace_back(trainer.gradient(t).begin(), trainer.gradient(t).end());
    }
    std::vector<std::vector<float>> mean;
    if (group == 0 || group == ranks) {
      std::vector<const std::vector<std::vector<float>>*> all;
      for (const auto& g : grads) all.push_back(&g);
      mean = average(all);
    } else {
      std::vector<std::vector<std::vector<float>>> group_means;
      for (int first = 0; first < ranks; first += group) {
        std::vector<const std::vector<std::vector<float>>*> members;
        for (int r = first; r < first + group; ++r) members.push_back(&grads[static_cast<std::size_t>(r)]);
        group_means.push_back(average(members));
      }
      std::vector<const std::vector<std::vector<float>>*> groups;
      for (const auto& g : group_means) groups.push_back(&g);
      mean = average(groups);
    }
    for (std::size_t t = 0; t < tensors; ++t) std::copy(mean[t].begin(), mean[t].end(), trainer.gradient(t).begin());
    trainer.update(lr);
  }
  std::vector<std::vector<float>> result;
  for (std::size_t t = 0; t < tensors; ++t) result.emplace_back(trainer.parameter(t).begin(), trainer.parameter(t).end());
  return result;
}

/// Every parameter within 1e-5 relative of the reference (1e-7 absolute near zero).
void check_equal(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& expected) {
  REQUIRE(got.size() == expected.size());
  double worst = 0;
  for (std::size_t t = 0; t < got.size(); ++t) {
    REQUIRE(got[t].size() == expected[t].size());
    for (std::size_t i = 0; i < got[t].size(); ++i) {
      const double a = got[t][i], b = expected[t][i];
      const double error = std::abs(a - b) / std::max(std::max(std::abs(a), std::abs(b)), 1e-2);
      worst = std::max(worst, error);
    }
  }
  CAPTURE(worst);
  CHECK(worst <= 1e-5);
}

using replicated_plan = plan<layout::min_waste<4 * KiB, 0>, resident, replicated, optimizer_follows_home>;
using zero2_plan = plan<layout::min_waste<4 * KiB, 0>, resident, shard_grads, optimizer_follows_home>;
using zero3_plan = plan<layout::min_waste<4 * KiB, 0>, resident, sharded, optimizer_follows_home>;
using zero3_fixed_plan = plan<layout::fixed<96 * KiB>, resident, sharded, optimizer_follows_home>;
using hybrid_plan = plan<layout::per_tensor, resident, hybrid<2>, optimizer_follows_home>;

}  // namespace

TEST_CASE_TEMPLATE("every resident plan trains GPT-2 to the reference's parameters on 1, 2 and 4 ranks", Plan,
                   replicated_plan, zero2_plan, zero3_plan, zero3_fixed_plan) {
  for (const int ranks : {1, 2, 4}) {
    CAPTURE(ranks);
    CAPTURE(Plan::name());
    const auto [params, statistics] = train<Plan>(ranks);
    check_equal(params, reference(ranks));
    CHECK(statistics.count(chunk_state::in_use, chunk_state::grad_pending) > 0);
  }
}

TEST_CASE("a hybrid plan trains GPT-2 to the reference's parameters on 2 and 4 ranks") {
  for (const int ranks : {2, 4}) {
    CAPTURE(ranks);
    check_equal(train<hybrid_plan>(ranks).first, reference(ranks, 2));
  }
}

TEST_CASE("ZeRO-3 gathers each chunk for forward and again for backward") {
  const auto [params, statistics] = train<zero3_plan>(2);
  const auto fetches = statistics.count(chunk_state::released, chunk_state::fetching);
  const auto evictions = statistics.count(chunk_state::ready, chunk_state::released);
  CHECK(fetches > 0);
  CHECK(evictions > 0);
  CHECK(statistics.count(chunk_state::reduced, chunk_state::released) == statistics.count(chunk_state::grad_pending, chunk_state::reduced));
}

TEST_CASE("the trainer's dry run against the tracer gives the analytic GPT-2 profile") {
  for (const std::size_t batch : {1u, 3u}) {
    auto config = tiny(batch);
    config.recompute = batch == 3;  // activation checkpointing's slot and backward workspace, counted alike
    const auto traced = gpt2::trace_profile(config);
    const auto analytic = gpt2_profile(gpt2::profile_config(config));
    REQUIRE(traced.tensors.size() == analytic.tensors.size());
    for (std::size_t t = 0; t < traced.tensors.size(); ++t) {
      CHECK(traced.tensors[t].name == analytic.tensors[t].name);
      CHECK(traced.tensors[t].elements == analytic.tensors[t].elements);
      CHECK(traced.tensors[t].tied == analytic.tensors[t].tied);
    }
    REQUIRE(traced.passes.size() == analytic.passes.size());
    for (std::size_t s = 0; s < traced.passes.size(); ++s) {
      CHECK(traced.passes[s].tensors == analytic.passes[s].tensors);
      CHECK(traced.passes[s].activation_bytes == analytic.passes[s].activation_bytes);
      CHECK(traced.passes[s].flops == analytic.passes[s].flops);
    }
  }
}

/// The committed rank file `rank` of a checkpoint directory.
std::filesystem::path committed_file(const std::filesystem::path& dir, int rank) {
  const auto commit = read_checkpoint_commit(dir);
  return checkpoint_rank_file(commit.step_directory, static_cast<std::uint64_t>(rank), commit.ranks);
}

TEST_CASE_TEMPLATE("saving at step 2 and resuming gives step 4 bit for bit", Plan, zero2_plan, zero3_plan) {
  const auto dir = std::filesystem::temp_directory_path() / ("chunkwise_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto straight = train<Plan>(2, {.steps = 4, .save_to = dir.string(), .save_after = 2}).first;
  const auto resumed = train<Plan>(2, {.steps = 2, .load_from = dir.string(), .skip_batches = 2}).first;
  REQUIRE(straight.size() == resumed.size());
  for (std::size_t t = 0; t < straight.size(); ++t) CHECK(straight[t] == resumed[t]);
  // One committed step directory; a damaged file fails every rank and restores nothing.
  CHECK(read_file(dir / "LATEST") == "step-000000002 2");
  const auto file = committed_file(dir, 1);
  const std::string good = read_file(file);
  std::string bytes = good;
  bytes[bytes.size() - 100] ^= 0x40;  // in the data: that piece's checksum
  write_file_atomically(file, bytes);
  CHECK_THROWS_WITH_AS(train<Plan>(2, {.steps = 1, .load_from = dir.string()}),
                       doctest::Contains("does not match its checksum"), error);
  bytes = good;
  bytes[20] ^= 0x01;  // in the header
  write_file_atomically(file, bytes);
  CHECK_THROWS_WITH_AS(train<Plan>(2, {.steps = 1, .load_from = dir.string()}),
                       doctest::Contains("is corrupted or truncated"), error);
  write_file_atomically(file, good.substr(0, good.size() / 2));
  CHECK_THROWS_WITH_AS(train<Plan>(2, {.steps = 1, .load_from = dir.string()}),
                       doctest::Contains("is corrupted or truncated"), error);
  std::filesystem::remove(file);
  CHECK_THROWS_WITH_AS(train<Plan>(2, {.steps = 1, .load_from = dir.string()}), doctest::Contains("is missing"), error);
  std::filesystem::remove_all(dir);
  CHECK_THROWS_WITH_AS(train<Plan>(2, {.steps = 1, .load_from = dir.string()}), doctest::Contains("no LATEST file"),
                       error);
}

namespace {
using cached_nvme_resharded_plan = plan<layout::min_waste<4 * KiB, 0>, cached<space::nvme>, sharded, optimizer_follows_home>;
}  // namespace

TEST_CASE("a checkpoint reshards: 4 -> 2 -> 4 ranks and 1 -> 2 -> 1 rank, across plans, bit for bit") {
  const auto base = std::filesystem::temp_directory_path() / ("chunkwise_reshard_" + std::to_string(::getpid()));
  std::filesystem::remove_all(base);
  const auto first = (base / "first").string(), second = (base / "second").string();
  const auto nvme = (base / "nvme").string();
  std::filesystem::create_directories(nvme);
  SUBCASE("4 ranks (ZeRO-2) -> 2 ranks (ZeRO-3 over NVMe homes) -> 4 ranks") {
    const auto straight = train<zero2_plan>(4, {.steps = 4, .save_to = first, .save_after = 2}).first;
    const auto at_two = train<zero2_plan>(4, {.steps = 2}).first;
    // Loaded on 2 ranks under another plan: the same parameters; saved again from there.
    const auto loaded = train<cached_nvme_resharded_plan>(
        2, {.steps = 0, .load_from = first, .save_to = second, .save_after = 0, .device_blocks = 2, .nvme_directory = nvme}).first;
    for (std::size_t t = 0; t < loaded.size(); ++t) CHECK(loaded[t] == at_two[t]);
    // Back on 4 ranks, two more steps: the moments and step count survived the round trip.
    const auto resumed = train<zero2_plan>(4, {.steps = 2, .load_from = second, .skip_batches = 2}).first;
    for (std::size_t t = 0; t < straight.size(); ++t) CHECK(straight[t] == resumed[t]);
  }
  SUBCASE("1 rank (replicated) -> 2 ranks (ZeRO-3) -> 1 rank") {
    const auto straight = train<replicated_plan>(1, {.steps = 4, .save_to = first, .save_after = 2}).first;
    const auto at_two = train<replicated_plan>(1, {.steps = 2}).first;
    const auto loaded = train<zero3_plan>(2, {.steps = 0, .load_from = first, .save_to = second, .save_after = 0}).first;
    for (std::size_t t = 0; t < loaded.size(); ++t) CHECK(loaded[t] == at_two[t]);
    const auto resumed = train<replicated_plan>(1, {.steps = 2, .load_from = second, .skip_batches = 2}).first;
    for (std::size_t t = 0; t < straight.size(); ++t) CHECK(straight[t] == resumed[t]);
  }
  std::filesystem::remove_all(base);
}

TEST_CASE("a checkpoint of another model is rejected with what it was saved for") {
  const auto dir = std::filesystem::temp_directory_path() / ("chunkwise_ckpt_model_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  (void)train<zero2_plan>(1, {.steps = 1, .save_to = dir.string(), .save_after = 1});
  auto config = tiny(1);
  config.layers = 3;
  const auto other = gpt2_profile(gpt2::profile_config(config));
  thread_world world(1);
  auto comm = world.comm(0);
  runtime<zero2_plan, host_backend, thread_comm> rt(other, comm, gpt2::initializer(config, seed));
  CHECK_THROWS_WITH_AS(rt.load_checkpoint(dir), doctest::Contains("was saved for another model"), error);
  std::filesystem::remove_all(dir);
}

namespace {
using replicated_offload_plan = plan<layout::min_waste<4 * KiB, 0>, resident, replicated, optimizer_offload<>>;
using zero3_auto_plan = plan<layout::min_waste<4 * KiB, 0>, resident, sharded, optimizer_auto<>>;
}  // namespace

TEST_CASE("a device budget below parameters + gradients + optimizer states still trains with the states offloaded") {
  // Parameters, gradients and Adam's two moments of every chunk: four times the chunks' bytes.
  const auto map = replicated_plan::layout::build(gpt2_profile(gpt2::profile_config(tiny(1))), {1, 256});
  byte_count chunk_bytes = 0;
  for (const auto& chunk : map.chunks) chunk_bytes += chunk.capacity;
  const byte_count budget = 4 * chunk_bytes - 1;  // everything on the device no longer fits
  CHECK_THROWS_WITH_AS(train<replicated_plan>(1, {.steps = 1, .device_budget = budget}),
                       doctest::Contains("budget"), error);
  for (const int ranks : {1, 2}) {
    CAPTURE(ranks);
    tier_stats device, host;
    const auto params = train<replicated_offload_plan>(ranks, {.device_budget = budget, .device_stats = &device,
                                                               .host_stats = &host}).first;
    check_equal(params, reference(ranks));
    CHECK(device.peak <= budget);
    CHECK(host.peak > 0);  // the moments and owned gradients live in the pinned host tier
  }
  // optimizer_auto with the planner's knob: one chunk's states off the device.
  tier_stats device, host;
  const auto params =
      train<zero3_auto_plan>(2, {.offloaded_chunks = 1, .device_stats = &device, .host_stats = &host}).first;
  check_equal(params, reference(2));
  CHECK(host.peak > 0);
  CHECK_THROWS_WITH_AS(train<replicated_plan>(1, {.steps = 1, .offloaded_chunks = 1}),
                       doctest::Contains("offloaded_chunks must be 0"), error);
}

TEST_CASE("the trainer's activations in the device tier: counted beside the chunks, refused past the budget") {
  // The activations are held for the whole run, so a plan's device peak with them in the tier is its peak without
  // them plus their bytes, and the parameters are the reference's.
  auto config = tiny(1);
  const byte_count activation_bytes = gpt2::activations<float>::total_bytes(config);
  tier_stats outside, inside;
  (void)train<zero3_plan>(1, {.device_stats = &outside});
  check_equal(train<zero3_plan>(1, {.device_stats = &inside, .activations_on_device = true}).first, reference(1));
  CHECK(inside.peak == outside.peak + activation_bytes);
  // One rank's peak is what it needs: a byte less is refused with the tier's numbers, that much trains.
  CHECK_THROWS_WITH_AS(train<zero3_plan>(1, {.steps = 1, .device_budget = inside.peak - 1,
                                             .activations_on_device = true}),
                       doctest::Contains("cannot allocate"), error);
  check_equal(train<zero3_plan>(1, {.device_budget = inside.peak, .activations_on_device = true}).first,
              reference(1));
  // Several ranks gather ahead and keep accumulators while reductions run, in what memory is free: the budget the
  // chunks took without the activations, plus the activations, still trains (prefetched gathers stay within the
  // widest pass plus one and leave the rest to the acquires).
  for (const int ranks : {2, 4}) {
    CAPTURE(ranks);
    tier_stats chunks_only;
    (void)train<zero3_plan>(ranks, {.device_stats = &chunks_only});
    check_equal(train<zero3_plan>(ranks, {.device_budget = chunks_only.peak + activation_bytes,
                                          .activations_on_device = true}).first,
                reference(ranks));
  }
}

namespace {
using cached_pinned_plan = plan<layout::min_waste<4 * KiB, 0>, cached<space::pinned_host>, sharded, optimizer_follows_home>;
using cached_host_zero2_plan = plan<layout::min_waste<4 * KiB, 0>, cached<space::host>, shard_grads, optimizer_follows_home>;
using split_pinned_plan = plan<layout::min_waste<4 * KiB, 0>, split<space::pinned_host>, sharded, optimizer_follows_home>;
using cached_nvme_plan = plan<layout::min_waste<4 * KiB, 0>, cached<space::nvme>, sharded, optimizer_follows_home>;
using cached_nvme_replicated_plan = plan<layout::min_waste<4 * KiB, 0>, cached<space::nvme>, replicated, optimizer_follows_home>;

std::string scratch_directory(const char* what) {
  const auto dir = std::filesystem::temp_directory_path() / (std::string(what) + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}
}  // namespace

TEST_CASE_TEMPLATE("host and NVMe homes stream through the device cache to the reference's parameters", Plan,
                   cached_pinned_plan, cached_host_zero2_plan, split_pinned_plan, cached_nvme_plan,
                   cached_nvme_replicated_plan) {
  const auto nvme = scratch_directory("chunkwise_stream_");
  for (const int ranks : {1, 2, 4}) {
    CAPTURE(ranks);
    CAPTURE(Plan::name());
    cache_stats cache;
    std::size_t chunks = 0, streamed = 0;
    const auto [params, statistics] = train<Plan>(ranks, {.device_blocks = 2, .nvme_directory = nvme, .cache = &cache,
                                                          .chunks = &chunks, .streamed = &streamed});
    check_equal(params, reference(ranks));
    CAPTURE(chunks);
    CHECK(streamed == chunks);  // two blocks hold fewer than all chunks: every chunk streams
    CHECK(cache.misses + cache.prefetches > 0);
    CHECK(cache.invalidations > 0);  // the optimizer updated homes: cached copies were dropped
    CHECK(cache.bytes_home_to_device > 0);
    CHECK(statistics.count(chunk_state::reduced, chunk_state::released) > 0);  // updated at home
  }
  std::filesystem::remove_all(nvme);
}

TEST_CASE("streaming keeps the device tier to the cache's blocks and the working buffers") {
  tier_stats resident_device, streamed_device, host;
  cache_stats cache;
  (void)train<zero3_plan>(1, {.steps = 1, .device_stats = &resident_device});
  const auto params = train<cached_pinned_plan>(1, {.device_blocks = 2, .device_stats = &streamed_device,
                                                    .host_stats = &host, .cache = &cache}).first;
  check_equal(params, reference(1));
  CHECK(streamed_device.peak < resident_device.peak / 2);
  CHECK(host.peak > 0);
  CHECK(cache.prefetches > 0);  // fetched ahead along the profiled order
  // A device budget below the resident plan's need trains when chunks stream from pinned host memory.
  const auto fits = train<cached_pinned_plan>(1, {.device_budget = resident_device.peak / 2, .device_blocks = 2}).first;
  check_equal(fits, reference(1));
  CHECK_THROWS_WITH_AS(train<zero3_plan>(1, {.steps = 1, .device_budget = resident_device.peak / 2}),
                       doctest::Contains("budget"), error);
}

TEST_CASE("split keeps the first chunks resident and streams the rest") {
  cache_stats two, many;
  const auto params = train<split_pinned_plan>(2, {.device_blocks = 5, .cache = &two}).first;
  check_equal(params, reference(2));
  (void)train<split_pinned_plan>(2, {.device_blocks = 3, .cache = &many});
  CHECK(two.bytes_home_to_device < many.bytes_home_to_device);  // more resident chunks, fewer moves
}

TEST_CASE("too few device blocks for a pass's chunks is refused with the count that works") {
  using per_tensor_streamed = plan<layout::per_tensor, cached<space::pinned_host>, sharded, optimizer_follows_home>;
  CHECK_THROWS_WITH_AS(train<per_tensor_streamed>(1, {.steps = 1, .device_blocks = 3}),
                       doctest::Contains("streamed chunks at once; use at least"), error);
}

TEST_CASE_TEMPLATE("a streamed plan resumes from its checkpoint bit for bit, in fp32 and in bf16", Plan, cached_pinned_plan,
                   cached_nvme_plan) {
  const auto nvme = scratch_directory("chunkwise_stream_ckpt_nvme_");
  const auto dir = std::filesystem::temp_directory_path() / ("chunkwise_stream_ckpt_" + std::to_string(::getpid()));
  for (const dtype type : {dtype::fp32, dtype::bf16}) {
    CAPTURE(to_string(type));
    std::filesystem::remove_all(dir);
    const auto straight = train<Plan>(2, {.steps = 4, .save_to = dir.string(), .save_after = 2, .device_blocks = 3,
                                          .nvme_directory = nvme, .type = type})
                              .first;
    // bf16: the checkpoint holds the fp32 master weights; the working copy is rounded from them again on load.
    const auto resumed = train<Plan>(2, {.steps = 2, .load_from = dir.string(), .skip_batches = 2, .device_blocks = 3,
                                         .nvme_directory = nvme, .type = type})
                             .first;
    for (std::size_t t = 0; t < straight.size(); ++t) CHECK(straight[t] == resumed[t]);
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(nvme);
}

TEST_CASE_TEMPLATE("explicit gradient hand-over accumulates micro-batches to the reference's sum", Plan, zero2_plan,
                   zero3_plan, cached_pinned_plan) {
  for (const int ranks : {1, 2}) {
    CAPTURE(ranks);
    // One micro-batch: the same run as the profile's hand-over.
    check_equal(train<Plan>(ranks, {.device_blocks = 2, .micro_batches = 1}).first, reference(ranks));
    // Two micro-batches per rank accumulate before the reduction: the sum over micro-batches, the mean over ranks.
    check_equal(train<Plan>(ranks, {.device_blocks = 2, .micro_batches = 2}).first, reference(ranks, 0, 2));
  }
}

TEST_CASE("grad_ready is refused where it cannot be meant") {
  const auto config = tiny(1);
  const auto model = gpt2_profile(gpt2::profile_config(config));
  thread_world world(1);
  auto comm = world.comm(0);
  runtime<zero2_plan, host_backend, thread_comm> profiled(model, comm, gpt2::initializer(config, seed));
  CHECK_THROWS_WITH_AS(profiled.grad_ready(0), doctest::Contains("gradient_handover::explicit_calls"), error);
  runtime<zero2_plan, host_backend, thread_comm> explicit_rt(model, comm, gpt2::initializer(config, seed),
                                               {.handover = gradient_handover::explicit_calls});
  explicit_rt.grad_ready(1);
  CHECK_THROWS_WITH_AS(explicit_rt.grad_ready(1), doctest::Contains("already handed over"), error);
  CHECK_THROWS_WITH_AS(explicit_rt.gradient(0), doctest::Contains("outside a backward pass"), error);
}

// default_plans' placement, collective and optimizer policies, with the layout scaled to the tiny model (its
// min_waste<> starts at 32 MiB chunks: one chunk, and 100 MiB of buffers per rank, for 140 KiB of parameters);
// private_chunks stays private_chunks, with its range scaled.
template <class Layout>
struct test_scale_layout {
  using type = layout::min_waste<4 * KiB, 0>;
};
template <byte_count SearchRange, byte_count MinChunk, byte_count MaxChunk, unsigned Sigmas>
struct test_scale_layout<layout::private_chunks<SearchRange, MinChunk, MaxChunk, Sigmas>> {
  // the 32 KiB embedding alone; the other 102 KiB in two chunks of unequal sizes, each pass within two
  using type = layout::private_chunks<4 * KiB, 48 * KiB, 0, Sigmas>;
};
template <class Plan>
using at_test_scale = plan<typename test_scale_layout<typename Plan::layout>::type, typename Plan::placement,
                           typename Plan::collective, typename Plan::optimizer_execution>;

TEST_CASE("every plan of default_plans trains GPT-2 to the reference's parameters on 1, 2 and 4 ranks") {
  // private_chunks at test scale: the tied embedding alone in the first chunk, which split keeps resident; the rest
  // in more chunks than the other 2 blocks hold, so they stream
  const auto tiny_model = gpt2_profile(gpt2::profile_config(tiny(1)));
  for (const std::uint32_t ranks : {1u, 2u, 4u}) {
    const auto map = test_scale_layout<layout::private_chunks<>>::type::build(tiny_model, {.ranks = ranks});
    CHECK(map.chunks.size() > 3);
    CHECK(map.chunks[0].slots.size() == 1);
    CHECK(map.chunks[0].tied);
    MESSAGE(map.chunks.size() << " chunks at " << ranks << " ranks");
  }
  const auto nvme = scratch_directory("chunkwise_default_plans_");
  for (std::size_t i = 0; i < default_plans::size; ++i)
    dispatch<default_plans>(i, [&]<class Default>(std::type_identity<Default>) {
      using Plan = at_test_scale<Default>;
      for (const int ranks : {1, 2, 4}) {
        if (!Plan::collective::supports(ranks)) continue;  // hybrid<G> where G does not divide the ranks
        CAPTURE(Plan::name());
        CAPTURE(ranks);
        // private_chunks: 3 blocks keep the embedding's chunk resident and stream the other two through 2
        const std::size_t blocks = Plan::layout::name == "private_chunks" ? 3 : 2;
        check_equal(train<Plan>(ranks, {.device_blocks = blocks, .nvme_directory = nvme}).first,
                    reference(ranks, Plan::collective::group_size));  // hybrid<G>: the mean of the groups' means
      }
    });
  std::filesystem::remove_all(nvme);
}

TEST_CASE("GPT-2 on a device the host cannot address: every one-rank default plan gives the host backend's bits") {
  // The trainer's executor reads parameters and writes gradients only through fp32_compute, which copies them across
  // (runtime/isolated_device.hpp: any host access of the device's memory is SIGSEGV).
  const auto nvme = scratch_directory("chunkwise_isolated_plans_");
  for (std::size_t i = 0; i < default_plans::size; ++i)
    dispatch<default_plans>(i, [&]<class Default>(std::type_identity<Default>) {
      using Plan = at_test_scale<Default>;
      if (!Plan::collective::supports(1)) return;
      CAPTURE(Plan::name());
      const std::size_t blocks = Plan::layout::name == "private_chunks" ? 3 : 2;
      for (const dtype type : {dtype::fp32, dtype::bf16}) {
        CAPTURE(type);
        const run_options run{.device_blocks = blocks, .nvme_directory = nvme, .type = type};
        CHECK(train<Plan, isolated_backend>(1, run).first == train<Plan>(1, run).first);
      }
    });
  std::filesystem::remove_all(nvme);
}

TEST_CASE("the runtime builds the layout candidate the search chose, and names a candidate it does not have") {
  // private_chunks offers its range and half of it (at test scale: shared chunks from 48 KiB up, and from 24 KiB up).
  // The finer candidate has more chunks, trains to the same parameters, and is what the runtime was told to build.
  using Plan = at_test_scale<plan<layout::private_chunks<>, cached<space::pinned_host>, sharded, optimizer_follows_home>>;
  using candidates = layout_candidates<Plan::layout>;
  const auto model = gpt2_profile(gpt2::profile_config(tiny(1)));
  const layout_options options{.ranks = 2};
  REQUIRE(candidates::count == 2);
  REQUIRE(candidates::can_pack(model, options, 1));
  const auto coarse = candidates::build(model, options, 0).chunks.size();
  const auto fine = candidates::build(model, options, 1).chunks.size();
  CHECK(fine > coarse);
  std::size_t chunks = 0;
  check_equal(train<Plan>(2, {.device_blocks = 4, .chunks = &chunks, .layout_candidate = 1}).first, reference(2));
  CHECK(chunks == fine);
  CHECK_THROWS_WITH_AS(train<Plan>(2, {.layout_candidate = 2}), doctest::Contains("has no layout candidate 2"),
                       chunkwise::error);
}

TEST_CASE("training from an imported llm.c checkpoint equals the reference trainer started from the same file") {
  // Parameters unlike the seed's (another seed's initialisation), written as llm.c writes them and read back.
  gpt2::reference_trainer other(tiny(1), 4242);
  std::vector<std::vector<float>> written;
  for (std::size_t t = 0; t < other.tensors().size(); ++t)
    written.emplace_back(other.parameter(t).begin(), other.parameter(t).end());
  const auto file = std::filesystem::temp_directory_path() / ("chunkwise-import-" + std::to_string(::getpid()) + ".bin");
  gpt2::llmc::write_checkpoint(file, tiny(1), written, 3);
  const auto imported = gpt2::llmc::read_checkpoint(file, tiny(1));
  std::filesystem::remove(file);
  REQUIRE(imported == written);
  for (const int ranks : {1, 2}) {
    CAPTURE(ranks);
    const auto expected = reference(ranks, 0, 1, &imported);
    check_equal(train<zero3_plan>(ranks, {.initial = &imported}).first, expected);
    // Not the seed's run: the import took effect.
    CHECK(expected != reference(ranks));
  }
}

TEST_CASE("activation checkpointing on chunk memory trains to the reference's parameters") {
  for (const int ranks : {1, 2}) {
    CAPTURE(ranks);
    check_equal(train<zero3_plan>(ranks, {.recompute = true}).first, reference(ranks));
  }
}
