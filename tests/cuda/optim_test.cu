// The fused CUDA Adam against the CPU kernel: bit-identical for the same coefficients (host-driven path), and the
// device-driven mixed-precision step, captured in a CUDA graph, against mixed_precision_step on the CPU.
#include "gpu_test_main.hpp"

#include <chunkwise/optim/cpu_adam.hpp>  // only what the test needs: nvcc compiles it slowly
#include <chunkwise/optim/cuda/adam.cuh>
#include <chunkwise/optim/mixed_precision.hpp>

#include <thrust/copy.h>
#include <thrust/device_vector.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace chunkwise;
using namespace chunkwise::optim;

namespace {

/// One chunk in host and device copies; `offset` elements in front (1: arrays misaligned, scalar path on the GPU).
struct mirrored_chunk {
  std::size_t count, offset;
  dtype grad_type;
  bool with_working;
  std::vector<float> master, m1, m2, grad32;
  std::vector<std::uint16_t> grad16, working;
  thrust::device_vector<float> d_master, d_m1, d_m2, d_grad32;
  thrust::device_vector<std::uint16_t> d_grad16, d_working;

  mirrored_chunk(std::size_t n, std::size_t pad, dtype grads, bool copy, std::uint32_t seed, float grad_size = 1.0f)
      : count(n), offset(pad), grad_type(grads), with_working(copy), master(n + pad), m1(n + pad), m2(n + pad),
        grad32(n + pad), grad16(n + pad), working(n + pad, 0) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = 0; i < n + pad; ++i) {
      master[i] = normal(rng);
      m1[i] = 0.1f * normal(rng);
      m2[i] = 0.01f * std::abs(normal(rng));
      grad32[i] = grad_size * normal(rng);
      grad16[i] = grads == dtype::fp16 ? to_fp16(grad32[i]).bits : to_bf16(grad32[i]).bits;
    }
    upload();
  }
  void upload() {
    d_master = master;
    d_m1 = m1;
    d_m2 = m2;
    d_grad32 = grad32;
    d_grad16 = grad16;
    d_working = working;
  }
  void set_device_grad(std::size_t i, float g) {
    d_grad32[offset + i] = g;
    d_grad16[offset + i] = grad_type == dtype::fp16 ? to_fp16(g).bits : to_bf16(g).bits;
  }
  chunk_arrays view(bool device) {
    auto ptr = [&](auto& host, auto& dev) { return device ? thrust::raw_pointer_cast(dev.data()) + offset : host.data() + offset; };
    chunk_arrays c;
    c.master = ptr(master, d_master);
    c.moment1 = ptr(m1, d_m1);
    c.moment2 = ptr(m2, d_m2);
    c.grad_type = grad_type;
    c.grad = grad_type == dtype::fp32 ? static_cast<const void*>(ptr(grad32, d_grad32))
                                      : static_cast<const void*>(ptr(grad16, d_grad16));
    c.working = with_working ? static_cast<void*>(ptr(working, d_working)) : nullptr;
    c.working_type = grad_type == dtype::fp16 ? dtype::fp16 : dtype::bf16;
    c.count = count;
    return c;
  }
  /// Largest relative difference between device and host arrays; -1 when a device working copy differs from the
  /// host's (`exact_working`) or from the rounding of the device's own master weights (otherwise).
  double device_vs_host(bool exact_working = true) const {
    std::vector<float> p(d_master.size()), a(d_m1.size()), b(d_m2.size());
    std::vector<std::uint16_t> w(d_working.size());
    thrust::copy(d_master.begin(), d_master.end(), p.begin());
    thrust::copy(d_m1.begin(), d_m1.end(), a.begin());
    thrust::copy(d_m2.begin(), d_m2.end(), b.begin());
    thrust::copy(d_working.begin(), d_working.end(), w.begin());
    double worst = 0.0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(p[i]) - master[i]) / (std::abs(master[i]) + 1.0));
      worst = std::max(worst, std::abs(static_cast<double>(a[i]) - m1[i]) / (std::abs(m1[i]) + 1e-3));
      worst = std::max(worst, std::abs(static_cast<double>(b[i]) - m2[i]) / (std::abs(m2[i]) + 1e-6));
      if (!with_working) continue;
      const std::uint16_t own = grad_type == dtype::fp16 ? to_fp16(p[i]).bits : to_bf16(p[i]).bits;
      if (w[i] != (exact_working ? working[i] : own)) return -1.0;
    }
    return worst;
  }
};

}  // namespace

TEST_CASE("the CUDA Adam equals the CPU kernel bit for bit on a table of mixed chunks") {
  std::vector<mirrored_chunk> chunks;
  chunks.emplace_back(100003, 0, dtype::fp32, false, 1);
  chunks.emplace_back(4099, 0, dtype::bf16, true, 2);
  chunks.emplace_back(77, 1, dtype::fp16, true, 3);  // misaligned: the scalar path
  chunks.emplace_back(1 << 16, 0, dtype::fp16, true, 4);
  std::vector<chunk_arrays> host_views, device_views;
  for (auto& c : chunks) {
    host_views.push_back(c.view(false));
    device_views.push_back(c.view(true));
  }
  cpu_adam cpu(adamw_config(0.1f));
  cuda_adam gpu(adamw_config(0.1f));
  for (std::uint64_t t = 1; t <= 3; ++t) {
    const step_args args{1e-2f / static_cast<float>(t), t, 0.5f};
    cpu.step(host_views, args);
    gpu.step(device_views, args);
  }
  for (const auto& c : chunks) CHECK(c.device_vs_host() == 0.0);
  const double cpu_sum = cpu.grad_sum_of_squares(host_views), gpu_sum = gpu.grad_sum_of_squares(device_views);
  CHECK(gpu_sum == doctest::Approx(cpu_sum).epsilon(1e-12));
}

TEST_CASE("the device-driven step in a CUDA graph matches mixed_precision_step and skips on overflow") {
  const loss_scaler_config scaling{1024.0f, 2.0f, 0.5f, 2, 1.0f, 65536.0f};
  const precision_options options{2.0f, scaling};  // clipping active: the unscaled gradients' norm is about 24
  const std::vector<float> schedule = {1e-2f, 5e-3f, 2e-3f};
  std::vector<mirrored_chunk> chunks;
  chunks.emplace_back(8192, 0, dtype::fp16, true, 5, 256.0f);
  chunks.emplace_back(1001, 0, dtype::fp16, true, 6, 256.0f);
  std::vector<chunk_arrays> host_views, device_views;
  for (auto& c : chunks) {
    host_views.push_back(c.view(false));
    device_views.push_back(c.view(true));
  }
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  cuda_adam gpu(adamw_config(), stream);
  gpu.bind(device_views, options, schedule);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  gpu.enqueue_step();
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

  cpu_adam cpu(adamw_config());
  mixed_precision_step driver(cpu, options);
  for (int step = 0; step < 3; ++step) {
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    const step_report expected = driver.step(host_views, schedule[static_cast<std::size_t>(step)]);
    const step_report got = gpu.read_report();
    CHECK_FALSE(got.skipped);
    CHECK(got.grad_norm == doctest::Approx(expected.grad_norm).epsilon(1e-9));
    CHECK(got.loss_scale == driver.loss_scale());
    CHECK(got.step == expected.step);
  }
  for (const auto& c : chunks) {
    // The clip coefficients agree to an ulp or so (the norms are summed in different orders), so the weights are
    // compared with a tolerance and each working copy with the rounding of its own master weights.
    const double worst = c.device_vs_host(false);
    CHECK(worst >= 0.0);
    CHECK(worst < 1e-6);
  }
  // An overflow: the replayed graph skips, leaves the weights and halves the scale.
  const float scale_before = gpu.read_report().loss_scale;
  chunks[1].set_device_grad(10, std::numeric_limits<float>::infinity());
  std::vector<float> before(chunks[0].d_master.size()), after(before.size());
  thrust::copy(chunks[0].d_master.begin(), chunks[0].d_master.end(), before.begin());
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  const step_report skipped = gpu.read_report();
  CHECK(skipped.skipped);
  CHECK(skipped.step == 3);
  CHECK(skipped.loss_scale == scale_before / 2.0f);
  thrust::copy(chunks[0].d_master.begin(), chunks[0].d_master.end(), after.begin());
  CHECK(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)) == 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("a device-driven step without loss scaling scales by 1, and a bound optimizer refuses host-driven steps") {
  std::vector<mirrored_chunk> chunks;
  chunks.emplace_back(1000, 0, dtype::fp32, false, 7);
  std::vector<chunk_arrays> device_views{chunks[0].view(true)};
  const std::vector<float> schedule = {1e-3f};
  cuda_adam gpu(adamw_config());
  gpu.bind(device_views, precision_options{1.0f, std::nullopt}, schedule);
  float scale = 0.0f;
  REQUIRE(cudaMemcpy(&scale, gpu.device_loss_scale(), sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(scale == 1.0f);  // a trainer multiplying its loss by it gets the loss itself
  gpu.enqueue_step();
  CHECK(gpu.read_report().loss_scale == 1.0f);
  try {
    gpu.step(device_views, step_args{1e-3f, 1, 1.0f});
    FAIL("step after bind() must throw");
  } catch (const chunkwise::error& e) {
    CHECK(e.code() == chunkwise::error_code::illegal_state);
    CHECK(std::string(e.what()).find("after bind()") != std::string::npos);
  }
}
