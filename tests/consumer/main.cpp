// A user's program: plans a small GPT-2 over a constant (described) machine, then trains it one step under the chosen
// plan with the runtime on one thread rank; with the json component it also round-trips the profile through JSON and
// prints the plans as JSON. Prints "consumer ok: ..." for the driver (tests/consumer/run_consumer_test.cmake).
//
// Only the headers it uses, never <nlohmann/json.hpp> without CHUNKWISE_HAS_JSON: the no-JSON configuration builds it
// against a <nlohmann/json.hpp> that stops the compile.
#include <chunkwise/comm/thread_comm.hpp>
#include <chunkwise/layout/min_waste.hpp>
#include <chunkwise/plan.hpp>
#include <chunkwise/profile.hpp>
#include <chunkwise/backend/host.hpp>
#include <chunkwise/runtime/runtime.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace {

using namespace chunkwise;

// A GPT-2 of a few kilobytes, known at compile time.
constexpr gpt2_config tiny{"consumer-gpt2", 1, 32, 2, 64, 16, 1};
// Two plans the program carries (chunks of up to a few hundred KiB): parameters replicated or sharded.
using chunks = layout::min_waste<256 * KiB, 0>;
using consumer_plans = plan_set<plan<chunks, resident, replicated, optimizer_follows_home>,
                                plan<chunks, resident, sharded, optimizer_follows_home>>;

// One step under Plan on one thread rank: every pass acquires its chunks, the backward passes write a constant
// gradient, and AdamW moves every parameter. Returns the number of parameters that moved.
template <class Plan>
std::size_t train_one_step(const model_profile& model, const prediction& chosen) {
  thread_world world(1);
  auto comm = world.comm(0);
  runtime_options settings;  // the chunk size the search chose
  settings.chunk_bytes = chosen.knobs.chunk_bytes;
  const auto initialize = [](std::uint32_t, std::span<float> values) {
    for (auto& v : values) v = 0.5f;
  };
  runtime<Plan, host_backend, thread_comm> rt(model, comm, initialize, settings);
  rt.zero_grad();
  for (std::size_t pass = 0; pass < model.passes.size(); ++pass) {
    const auto in_use = rt.use(pass);
    if (model.passes[pass].kind == pass_kind::backward)
      for (const auto t : model.passes[pass].tensors)
        for (auto& g : rt.gradient(t)) g = 1.0f;
  }
  rt.step(1e-2f);
  std::size_t moved = 0;
  for (std::uint32_t t = 0; t < model.tensors.size(); ++t)
    for (const float v : rt.read_parameters(t)) moved += v != 0.5f ? 1 : 0;
  return moved;
}

}  // namespace

int main() {
  try {
    const model_profile model = gpt2_profile(tiny);
    const machine_profile machine = describe_machine({.gpus = 1, .gpu_memory = 64 * MiB, .host_memory = 1 * GiB});
    const auto choice = choose<consumer_plans>(model, machine);
    std::printf("%s", explain_table<consumer_plans>(choice.plans, choice.index).c_str());
    const std::size_t moved = dispatch<consumer_plans>(
        choice.index,
        [&]<class Plan>(std::type_identity<Plan>) { return train_one_step<Plan>(model, choice.predicted); });
    if (moved != model.parameter_count()) {
      std::printf("consumer: %zu of %llu parameters moved\n", moved,
                  static_cast<unsigned long long>(model.parameter_count()));
      return 1;
    }
#if CHUNKWISE_HAS_JSON
    // The json component: the profile survives JSON, and the plans print as JSON.
    if (model_profile_from_json(to_json(model)).parameter_count() != model.parameter_count()) return 1;
    const auto plans = explain_json<consumer_plans>(choice.plans, choice.index);
    std::printf("json: %zu plans, chosen %s\n", plans.size(), consumer_plans::names()[choice.index].c_str());
#endif
    std::printf("consumer ok: %s trained one step under %s, %zu parameters updated\n", model.name.str().c_str(),
                consumer_plans::names()[choice.index].c_str(), moved);
    return 0;
  } catch (const error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
