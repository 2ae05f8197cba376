// The runtime with its chunks in the GPU's own memory (runtime<Plan, cuda_backend, thread_comm>, one rank): the toy
// chain model of tests/runtime/toy_model.hpp trains to the host backend's parameters. Resident chunks' states are
// updated by the fused CUDA Adam (bit-identical to the CPU kernel), offloaded and streamed chunks' by the CPU Adam;
// the trainer computes on the CPU through fp32_compute's copies. CI compiles it; the same runs on the host in
// tests/runtime_pipeline_test.cpp over the isolated device (memory the host cannot address), bit for bit.
#include "gpu_test_main.hpp"

#include <chunkwise/backend/host.hpp>
#include <chunkwise/comm/thread_comm.hpp>
#if CHUNKWISE_HAS_NCCL
#include <chunkwise/comm/cuda/nccl_comm.cuh>
#endif
#include <chunkwise/layout/fixed.hpp>
#include <chunkwise/plan/default_plans.hpp>
#include <chunkwise/runtime/cuda/backend_parts.cuh>
#include <chunkwise/runtime/fp32_compute.hpp>
#include <chunkwise/runtime/runtime.hpp>

#include "../runtime/toy_model.hpp"

#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace chunkwise;

namespace {

using toy_layout = layout::fixed<8 * KiB>;  // four chunks, as in runtime_pipeline_test
template <class P>
using on_toy = plan<toy_layout, typename P::placement, typename P::collective, typename P::optimizer_execution>;

float warmup_lr(std::uint64_t step) { return 2e-2f * static_cast<float>(step) / 3.0f; }

template <class Guard, class Bridge>
struct flushing_use {
  Guard guard;
  typename Bridge::flush_guard flushing;  // destroyed first: the flush comes before the release
};

struct toy_result {
  std::vector<std::vector<float>> parameters;
  tier_stats device;
  std::size_t streamed = 0;
};

// One rank of thread_comm, or (nccl) one rank of NCCL on the backend's device: the runtime's device collectives.
template <class Comm>
Comm one_rank() {
  if constexpr (std::is_same_v<Comm, thread_comm>) return thread_world(1).comm(0);
#if CHUNKWISE_HAS_NCCL
  else return nccl_comm(nccl_comm::make_unique_id(), 0, 1, nullptr);
#endif
}

template <class Plan, class Backend, class Comm = thread_comm>
toy_result train(dtype type, bool overlap) {
  const auto model = toy::profile(toy::batch, type);
  auto comm = one_rank<Comm>();
  runtime_options o;
  o.adam = optim::adamw_config();
  if (overlap) o.learning_rate = warmup_lr;
  if (Plan::placement::uses_device_cache) o.device_blocks = 3;
  o.nvme_directory = std::filesystem::temp_directory_path();
  using runtime_type = runtime<Plan, Backend, Comm>;
  runtime_type rt(model, comm, toy::initialize, o);
  fp32_compute<runtime_type> bridge(rt);
  std::vector<float> x, y;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    toy::make_batch(step, x, y);
    const auto use = [&](std::size_t pass) {
      return flushing_use<typename runtime_type::pass_guard, decltype(bridge)>{rt.use(pass), bridge.flush_at_exit()};
    };
    toy::forward_backward(
        x.data(), y.data(), toy::batch, 1.0f / static_cast<float>(toy::batch), use,
        [&](std::size_t t) { return bridge.parameter(static_cast<std::uint32_t>(t)); },
        [&](std::size_t t) { return bridge.gradient(static_cast<std::uint32_t>(t)); });
    if (overlap) rt.step();
    else rt.step(warmup_lr(step));
  }
  toy_result result;
  for (std::uint32_t t = 0; t < model.tensors.size(); ++t) result.parameters.push_back(rt.read_parameters(t));
  result.device = rt.device_stats();
  result.streamed = rt.streamed_chunks();
  return result;
}

template <std::size_t... I>
void for_each_plan(std::index_sequence<I...>, auto&& f) {
  (f(std::type_identity<on_toy<typename default_plans::template at<I>>>{}), ...);
}

}  // namespace

TEST_CASE("chunks in GPU memory: every one-rank default plan trains the toy to the host backend's bits") {
  for_each_plan(std::make_index_sequence<default_plans::size>{}, [&]<class Plan>(std::type_identity<Plan>) {
    if (!Plan::collective::supports(1)) return;
    CAPTURE(Plan::name());
    for (const dtype type : {dtype::fp32, dtype::bf16})
      for (const bool overlap : {false, true}) {
        CAPTURE(type);
        CAPTURE(overlap);
        const auto on_gpu = train<Plan, cuda_backend>(type, overlap);
        const auto on_host = train<Plan, host_backend>(type, overlap);
        CHECK(on_gpu.device.peak > 0);
        CHECK(on_gpu.streamed == on_host.streamed);
        CHECK(toy::worst_relative_difference(on_gpu.parameters, on_host.parameters) == 0.0);
      }
  });
}

#if CHUNKWISE_HAS_NCCL
TEST_CASE("chunks in GPU memory over NCCL (one rank): every one-rank plan, the host backend's bits") {
  // The runtime's device-collective path (plan agreement and norms through device buffers, ZeRO-2's publication in
  // place on the device); several ranks need several GPUs, and run on the host over isolated_comm
  // (runtime_pipeline_test).
  for_each_plan(std::make_index_sequence<default_plans::size>{}, [&]<class Plan>(std::type_identity<Plan>) {
    if (!Plan::collective::supports(1)) return;
    CAPTURE(Plan::name());
    for (const dtype type : {dtype::fp32, dtype::bf16}) {
      CAPTURE(type);
      const auto over_nccl = train<Plan, cuda_backend, nccl_comm>(type, /*overlap=*/true);
      const auto on_host = train<Plan, host_backend>(type, /*overlap=*/true);
      CHECK(toy::worst_relative_difference(over_nccl.parameters, on_host.parameters) == 0.0);
    }
  });
}
#endif

TEST_CASE("chunks in GPU memory: a host communicator over two ranks is refused") {
  using replicated = on_toy<default_plans::at<0>>;
  const auto model = toy::profile(toy::batch / 2);
  thread_world world(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      auto comm = world.comm(r);
      try {
        runtime<replicated, cuda_backend, thread_comm> rt(model, comm, toy::initialize, {});
      } catch (const error& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) CHECK(e.find("cannot read the device's memory; run one rank") != std::string::npos);
}
