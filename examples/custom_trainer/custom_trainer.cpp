// custom_trainer: a model of one's own (mlp.hpp, plain loops) trained with chunkwise: profile it with the tracer,
// measure the machine, choose a plan and say why, run it on thread ranks, save a checkpoint and resume from it.
// docs/custom-trainer.md walks through this file. Flags:
//   --steps N (100)  --ranks N (1; thread ranks, dividing the batch of 64)  --plan NAME (force a plan of the set)
//   --checkpoint DIR (save there at the end)  --resume (load DIR's checkpoint first)
//   --measure-cache DIR (~/.cache/chunkwise)  --check (compare the parameters with mlp::train_plain's)
#include <chunkwise/chunkwise.hpp>

#include "mlp.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <vector>

using namespace chunkwise;
using mlp::widths, mlp::layers;

// ---- 1. The model profile: a dry run of mlp::forward_backward's passes against the tracer (byte counts, no memory).
model_profile trace_profile(std::size_t rows) {
  tracer trace("mlp");
  std::vector<tensor_handle> tensors;  // registered in first-use order, so the profile keeps these indices
  for (std::size_t l = 0; l < layers; ++l) {
    tensors.push_back(trace.register_tensor("fc" + std::to_string(l) + ".weight", widths[l] * widths[l + 1]));
    tensors.push_back(trace.register_tensor("fc" + std::to_string(l) + ".bias", widths[l + 1]));
  }
  std::vector<activation_handle> outputs(layers);  // each layer's output, kept from its forward to its backward
  const auto pass = [&](std::size_t l, pass_kind kind) {
    trace.begin_pass("fc" + std::to_string(l), kind);
    trace.touch(tensors[2 * l]);
    trace.touch(tensors[2 * l + 1]);
    if (kind == pass_kind::forward) outputs[l] = trace.allocate_activation(rows * widths[l + 1] * sizeof(float));
    else trace.free_activation(outputs[l]);
    trace.add_flops((kind == pass_kind::forward ? 2 : 4) * rows * widths[l] * widths[l + 1]);
    trace.end_pass();
  };
  for (std::size_t l = 0; l < layers; ++l) pass(l, pass_kind::forward);
  for (std::size_t l = layers; l-- > 0;) pass(l, pass_kind::backward);
  return trace.profile();
}

// ---- 2. The plans this trainer carries: chunk sizes searched from the largest tensor up (min_waste<>'s default
// starts at 32 MiB, for language models); chunks resident on the device, or streamed from pinned host memory.
using small_chunks = layout::min_waste<256 * KiB, 0>;
using mlp_plans = plan_set<plan<small_chunks, resident, replicated, optimizer_follows_home>,
                           plan<small_chunks, resident, shard_grads, optimizer_follows_home>,
                           plan<small_chunks, resident, sharded, optimizer_follows_home>,
                           plan<small_chunks, cached<space::pinned_host>, sharded, optimizer_follows_home>>;

struct options {
  std::size_t steps = 100, ranks = 1;
  std::string plan, checkpoint;
  std::string measure_cache = std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/chunkwise";
  bool resume = false, check = false;
};

// ---- 3. Training under Plan: a thread per rank, each with its runtime; rank r trains on rows [r*rows, (r+1)*rows)
// of every batch and the runtime averages the gradients over ranks. Returns the trained parameters of each tensor.
template <class Plan>
std::vector<std::vector<float>> train(const options& o, const model_profile& model, const machine_profile& machine,
                                      const prediction& chosen) {
  thread_world world(static_cast<int>(o.ranks));
  std::vector<std::vector<float>> trained(model.tensors.size());
  std::vector<std::exception_ptr> errors(o.ranks);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < o.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = world.comm(static_cast<int>(r));
        runtime_options settings;  // the device budget the plan was chosen for, and the knobs the search chose
        settings.device_budget = machine.device_memory;
        settings.chunk_bytes = chosen.knobs.chunk_bytes;
        settings.device_blocks = chosen.knobs.device_blocks;
        runtime<Plan, host_backend, thread_comm> rt(model, comm, mlp::initialize, settings);
        if (o.resume) rt.load_checkpoint(o.checkpoint);  // saved under any plan, with any rank count
        const std::size_t rows = mlp::batch / o.ranks, first = rt.steps() + 1;
        if (o.resume && r == 0) std::printf("resumed from %s after step %zu\n", o.checkpoint.c_str(), first - 1);
        std::vector<float> x;
        std::vector<int> y;
        for (std::size_t step = first; step <= o.steps; ++step) {
          mlp::make_batch(step, x, y);
          float loss = mlp::forward_backward(&x[r * rows * widths[0]], &y[r * rows], rows,
                                             [&](std::size_t pass) { return rt.use(pass); },  // release at its `}`
                                             [&](std::size_t t) { return rt.parameter(std::uint32_t(t)).data(); },
                                             [&](std::size_t t) { return rt.gradient(std::uint32_t(t)).data(); });
          comm.all_reduce(std::span<const float>(&loss, 1), std::span<float>(&loss, 1), reduce_op::average).wait();
          rt.step(mlp::lr);  // waits for the gradients' reductions, then Adam where the optimizer states live
          if (r == 0 && (step == first || step % 10 == 0 || step == o.steps))
            std::printf("step %4zu/%zu  loss %.4f\n", step, o.steps, loss);
        }
        if (!o.checkpoint.empty()) rt.save_checkpoint(o.checkpoint);  // each rank writes its pieces, rank 0 commits
        if (!o.checkpoint.empty() && r == 0) std::printf("saved %s after step %zu\n", o.checkpoint.c_str(), o.steps);
        for (std::uint32_t t = 0; t < model.tensors.size(); ++t) {  // a collective call: every rank asks
          auto values = rt.read_parameters(t);
          if (r == 0) trained[t] = std::move(values);
        }
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return trained;
}

int main(int argc, char** argv) {
  try {
    options o;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--resume") o.resume = true;
      else if (flag == "--check") o.check = true;
      else if (i + 1 == argc) throw_error(error_code::invalid_argument, flag + ": no such flag, or it needs a value");
      else if (flag == "--steps") o.steps = std::stoul(argv[++i]);
      else if (flag == "--ranks") o.ranks = std::stoul(argv[++i]);
      else if (flag == "--plan") o.plan = argv[++i];
      else if (flag == "--checkpoint") o.checkpoint = argv[++i];
      else if (flag == "--measure-cache") o.measure_cache = argv[++i];
      else throw_error(error_code::invalid_argument, "no such flag: " + flag + " (the flags: custom_trainer.cpp, top)");
    }
    if (o.ranks == 0 || mlp::batch % o.ranks != 0) throw_error(error_code::invalid_argument, "--ranks must divide 64");

    const model_profile model = trace_profile(mlp::batch / o.ranks);  // 1. the model as one rank runs it
    std::printf("model: MLP, %llu parameters in %zu tensors, %zu passes, batch %zu per rank\n",
                static_cast<unsigned long long>(model.parameter_count()), model.tensors.size(), model.passes.size(),
                mlp::batch / o.ranks);
    // The machine: measured on the first run (a few seconds), then loaded from the cache; o.ranks ranks share it.
    const machine_profile machine = measure_or_load<host_backend>(o.measure_cache, {.ranks = std::uint32_t(o.ranks)});
    auto choice = choose<mlp_plans>(model, machine);  // 2. the fastest plan that fits, and every plan's prediction
    if (!o.plan.empty()) choice.index = find_plan<mlp_plans>(o.plan);  // forced: it must fit (see the table)
    std::printf("%s", explain_table<mlp_plans>(choice.plans, choice.index).c_str());
    std::printf("training with %s\n", mlp_plans::names()[choice.index].c_str());
    const auto trained = dispatch<mlp_plans>(choice.index, [&]<class Plan>(std::type_identity<Plan>) {  // 3.
      return train<Plan>(o, model, machine, choice.plans[choice.index]);
    });
    if (!o.check) return 0;
    // The largest relative difference |trained - plain| / |plain| of a tensor (Euclidean norms).
    const auto plain = mlp::train_plain(o.steps);
    double worst = 0;
    for (std::size_t t = 0; t < plain.size(); ++t) {
      double difference = 0, norm = 0;
      for (std::size_t i = 0; i < plain[t].size(); ++i) {
        difference += (trained[t][i] - plain[t][i]) * (trained[t][i] - plain[t][i]);
        norm += plain[t][i] * plain[t][i];
      }
      worst = std::max(worst, std::sqrt(difference / norm));
    }
    std::printf("check: the parameters %s the plain loop's (largest relative difference of a tensor %.1e)\n",
                worst < 1e-4 ? "match" : "DIFFER from", worst);
    return worst < 1e-4 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
