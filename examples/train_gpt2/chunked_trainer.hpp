#pragma once
// What the chunkwise trainer adds to the model maths: its dry run against chunkwise's tracer (the model profile),
// one profiled pass on chunk memory (the same pass functions the reference trainer calls), and the plans it can run.
#include <chunkwise/collective.hpp>
#include <chunkwise/layout.hpp>
#include <chunkwise/placement.hpp>
#include <chunkwise/plan/optimizer_execution.hpp>
#include <chunkwise/plan/plan.hpp>
#include <chunkwise/profile/tracer.hpp>
#include <chunkwise/runtime/fp32_compute.hpp>

#include "gpt2_model.hpp"
#include "rank_cores.hpp"
#include "reference_trainer.hpp"
#include "schedule.hpp"
#include "timing.hpp"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace gpt2 {

/// The plans the example trains under: resident chunks (data parallel, ZeRO-2, ZeRO-3; optimizer states on the device,
/// partly or wholly offloaded to pinned host memory) and chunks streamed through a device cache from pinned host
/// memory (Gemini-style, and with a resident prefix) or from NVMe files (ZeRO-Infinity-style); Elixir's private chunks
/// (the tied embedding alone and resident, the rest streamed in chunks of at most 64 MiB); and, for processes on
/// several machines, hybrid<G> (ZeRO-3 inside groups of G ranks, replicated across them: G the processes per
/// machine keeps gathers and reduce-scatters off the link between machines), last so that sharded wins a tie.
namespace plans {
using chunks = chunkwise::layout::min_waste<1 * chunkwise::MiB, 0>;
using private_chunks = chunkwise::layout::private_chunks<>;  // shared chunks of 32 to 64 MiB: a pass spans two
using chunkwise::cached, chunkwise::split, chunkwise::resident;
using chunkwise::replicated, chunkwise::shard_grads, chunkwise::sharded, chunkwise::hybrid;
using chunkwise::optimizer_follows_home, chunkwise::optimizer_auto, chunkwise::optimizer_offload;
using pinned = chunkwise::space::pinned_host;
using nvme = chunkwise::space::nvme;
}  // namespace plans

using trainable_plans = chunkwise::plan_set<
    chunkwise::plan<plans::chunks, plans::resident, plans::replicated, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::resident, plans::shard_grads, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::resident, plans::sharded, plans::optimizer_follows_home>,
    chunkwise::plan<chunkwise::layout::per_tensor, plans::resident, plans::sharded, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::resident, plans::sharded, plans::optimizer_auto<plans::pinned>>,
    chunkwise::plan<plans::chunks, plans::resident, plans::shard_grads, plans::optimizer_offload<plans::pinned>>,
    chunkwise::plan<plans::chunks, plans::cached<plans::pinned>, plans::sharded, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::split<plans::pinned>, plans::sharded, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::cached<plans::nvme>, plans::sharded, plans::optimizer_follows_home>,
    chunkwise::plan<plans::private_chunks, plans::split<plans::pinned>, plans::sharded, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::resident, plans::hybrid<2>, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::resident, plans::hybrid<4>, plans::optimizer_follows_home>,
    chunkwise::plan<plans::chunks, plans::resident, plans::hybrid<8>, plans::optimizer_follows_home>>;

namespace detail {

/// Runs the schedule's passes on a reference trainer and sums the time spent in the blocks' (labels "h.<l>").
struct block_timing_executor {
  reference_trainer& trainer;
  double block_seconds = 0;

  template <class Body>
  void pass(const pass_info& info, Body&& body) {
    if (!info.label.starts_with("h.")) return trainer.pass(info, body);
    const auto start = std::chrono::steady_clock::now();
    trainer.pass(info, body);
    block_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

}  // namespace detail

/// The FLOP/s the model's pass functions reach on this machine with `ranks` thread ranks computing at once: the
/// cost model's compute rate for this trainer (a generic GEMM benchmark overstates naive loops several times, and a
/// FLOP count misses the element-wise passes).
///
/// Each rank runs forward and backward (one warm-up round, then rounds as below) on its own batch of the model cut
/// to at most 2 blocks, whatever its size (a whole copy of a 48-layer model would not fit beside the run; 9 blocks of
/// 12x768 took 7 s to time). The time of a round is from all ranks starting an iteration together (a barrier) to
/// the last one finishing it: ranks outnumbering the cores take turns, and a rank's iteration timed alone while the
/// others waited measured a core's rate where a step gets a share of it (3 ranks on 2 cores: predicted 10 ms,
/// measured 19). Rank 0 also times its block passes: the whole model's round is the cut model's with the blocks'
/// share scaled to `layers` blocks, each from the same iteration, so noise between runs cancels (timing 1 and 2
/// blocks separately and taking the difference missed by 30%). Medians, so a burst of other work on the machine sets
/// neither. With 16-bit chunks each iteration also pays fp32_compute's conversions, on as many elements as the cut
/// model has parameters (its parameters widened for forward and again for backward, its gradients added into 16-bit
/// accumulators), scaled with the parameters to the whole model's.
inline double measure_pass_flops(const model_config& config, int ranks, chunkwise::dtype type = chunkwise::dtype::fp32,
                                 int iterations = 7, double min_seconds = 1.0) {
  auto cut = config;
  cut.layers = std::min<std::size_t>(config.layers, 2);
  const double block_scale = static_cast<double>(config.layers) / static_cast<double>(cut.layers);
  const double parameter_scale =
      static_cast<double>(config.parameter_count()) / static_cast<double>(cut.parameter_count());
  // The barrier's completion (one thread, all others waiting) times the rounds and decides whether to go on: at
  // least `iterations` rounds after the warm-up one, more until `min_seconds` have passed (a small model's 6 ms
  // rounds: 7 of them varied by 20% between runs), at most 200.
  using clock = std::chrono::steady_clock;
  std::vector<double> rounds, scales;  // scales: rank 0's whole-model iteration over its cut-model one
  clock::time_point round_start, first_start;
  bool in_round = false, more = true;
  std::barrier round(ranks, [&]() noexcept {
    const auto now = clock::now();
    in_round = !in_round;
    if (in_round) {
      round_start = now;
      if (rounds.empty()) first_start = now;
      return;
    }
    rounds.push_back(std::chrono::duration<double>(now - round_start).count());
    const auto timed = static_cast<int>(rounds.size()) - 1;  // the first round warms up
    more = timed < iterations ||
           (std::chrono::duration<double>(now - first_start).count() < min_seconds && timed < 200);
  });
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      compute_on_rank_cores(ranks);
      reference_trainer trainer(cut, 1);
      detail::block_timing_executor run{trainer};
      std::vector<int> tokens(cut.batch * cut.context), targets(tokens.size());
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<int>((i * 7 + static_cast<std::size_t>(r)) % cut.vocab);
        targets[i] = static_cast<int>((i * 11 + 3) % cut.vocab);
      }
      const std::size_t elements = cut.parameter_count();
      std::function<void()> convert = [] {};
      chunkwise::visit_element(type, "measure_pass_flops", [&]<class T>(T) {
        if constexpr (!std::is_same_v<T, float>) {
          auto working = std::make_shared<std::vector<T>>(elements, chunkwise::from_float<T>(1.0f));
          auto accumulator = std::make_shared<std::vector<T>>(elements, chunkwise::from_float<T>(0.0f));
          auto widened = std::make_shared<std::vector<float>>(elements);
          auto gradient = std::make_shared<std::vector<float>>(elements, 1e-3f);
          convert = [=] {
            for (int pass = 0; pass < 2; ++pass) chunkwise::optim::widen<T>(*working, *widened);
            chunkwise::optim::accumulate_scaled<T>(*accumulator, *gradient, 1.0f);
          };
        }
      });
      do {
        round.arrive_and_wait();  // all start together
        const auto start = clock::now();
        run.block_seconds = 0;
        trainer.zero_gradients();
        forward(run, cut, tokens.data(), targets.data());
        backward(run, cut, tokens.data(), targets.data());
        const auto computed = clock::now();
        convert();
        const auto end = clock::now();
        if (r == 0) {
          const double iteration = std::chrono::duration<double>(end - start).count();
          const double conversions = std::chrono::duration<double>(end - computed).count();
          const double rest = iteration - run.block_seconds - conversions;
          scales.push_back((rest + run.block_seconds * block_scale + conversions * parameter_scale) / iteration);
        }
        round.arrive_and_wait();  // the last one is done
      } while (more);
    });
  for (auto& t : threads) t.join();
  const auto median_after_warm_up = [](std::vector<double> values) {
    values.erase(values.begin());
    return median_of(std::move(values));
  };
  return static_cast<double>(trace_profile(config).total_flops()) /
         (median_after_warm_up(rounds) * median_after_warm_up(scales));
}

/// The runtime's tensor initializer: tensor t (in profile order) gets the reference trainer's initial values.
inline std::function<void(std::uint32_t, std::span<float>)> initializer(const model_config& config,
                                                                         std::uint64_t seed) {
  return [config, seed, tensors = parameter_tensors(config)](std::uint32_t t, std::span<float> values) {
    init_parameter(config, tensors[t].name, values, seed);
  };
}

/// Runs the schedule on the runtime's chunk memory: each pass acquires its chunks (rt.use, passes numbered in the
/// profile's order from the step's first forward pass) and computes in fp32 through fp32_compute (copies when the
/// chunks hold bf16 or fp16; the pass's gradients go into the chunks before its chunks are released).
template <class Runtime>
class chunk_executor {
 public:
  chunk_executor(Runtime& rt, chunkwise::fp32_compute<Runtime>& compute, activations<float>& acts)
      : rt_(&rt), compute_(&compute), acts_(&acts) {}

  /// The next forward() starts at the profile's first pass (each step, and each evaluation).
  void restart() noexcept { next_ = 0; }

  template <class Body>
  void pass(const pass_info&, Body&& body) {
    const auto in_use = rt_->use(next_++);
    const auto flushing = compute_->flush_at_exit();  // destroyed first: the gradients go in before the release
    body(*this);
  }
  float* param(std::size_t t) { return compute_->parameter(static_cast<std::uint32_t>(t)); }
  float* grad(std::size_t t) { return compute_->gradient(static_cast<std::uint32_t>(t)); }
  activations<float>& acts() noexcept { return *acts_; }

 private:
  Runtime* rt_;
  chunkwise::fp32_compute<Runtime>* compute_;
  activations<float>* acts_;
  std::size_t next_ = 0;
};

}  // namespace gpt2
