#pragma once
// The GPT-2 device passes (examples/train_gpt2/device_model.hpp) against the CPU loops: the same test source runs on
// the CPU through Thrust's OpenMP device system (tests/gpt2_device_test.cpp, in CI) and on the GPU through CUDA
// (tests/cuda/gpt2_device_test.cu, where a GPU exists). Include after device_model_impl.hpp and doctest.
#include "device_executor.hpp"
#include "reference_trainer.hpp"

#include <thrust/device_vector.h>
#include <thrust/host_vector.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace gpt2_device_cases {

using gpt2::trainer_tensors;

inline gpt2::model_config small_config() {
  gpt2::model_config config;
  config.vocab = 600;          // three softmax segments, the last one partial
  config.padded_vocab = 640;  // llm.c's padding: the padded rows get no gradient
  config.context = 24;
  config.channels = 144;       // three layer-norm segments, the last one partial
  config.heads = 4;
  config.layers = 2;
  config.batch = 3;
  return config;
}

inline void batch_of(const gpt2::model_config& config, unsigned salt, std::vector<int>& tokens,
                     std::vector<int>& targets) {
  tokens.resize(config.batch * config.context);
  targets.resize(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int>((i * 37 + salt * 11 + 5) % config.vocab);
    targets[i] = static_cast<int>((i * 53 + salt * 7 + 1) % config.vocab);
  }
}

/// The largest |device - reference| of a tensor, relative to the reference's largest magnitude.
inline double relative_difference(std::span<const float> device, std::span<const float> reference) {
  double worst = 0, scale = 1e-30;
  for (std::size_t i = 0; i < device.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(device[i]) - reference[i]));
    scale = std::max(scale, std::abs(static_cast<double>(reference[i])));
  }
  return worst / scale;
}

/// Two training steps, CPU loops against device passes from the same weights (the device's copy takes the CPU's
/// after each update, so Adam does not amplify what it compares): the losses and every gradient agree to the
/// device's rounding (exp, tanh, fused multiply-adds, cuBLAS's summation order).
inline void check_against_cpu(const gpt2::model_config& config, double tolerance) {
  gpt2::reference_trainer cpu(config, 42), device(config, 42);
  gpt2::device_workspace workspace(config);
  trainer_tensors host{&device};
  gpt2::device_executor run(host, workspace, config);
  MESSAGE("device passes on " << std::string(workspace.device_name()));
  std::vector<int> tokens, targets;
  for (unsigned step = 0; step < 2; ++step) {
    batch_of(config, step, tokens, targets);
    cpu.zero_gradients();
    device.zero_gradients();
    const float cpu_loss = cpu.forward(tokens.data(), targets.data());
    cpu.backward(tokens.data(), targets.data());
    const auto device_loss = static_cast<float>(gpt2::forward(run, config, tokens.data(), targets.data()));
    gpt2::backward(run, config, tokens.data(), targets.data());
    CAPTURE(step);
    CHECK(std::abs(device_loss - cpu_loss) <= tolerance * std::abs(cpu_loss));
    double worst = 0;
    std::size_t worst_tensor = 0;
    for (std::size_t t = 0; t < cpu.tensors().size(); ++t) {
      const double d = relative_difference(device.gradient(t), cpu.gradient(t));
      if (d > worst) worst = d, worst_tensor = t;
    }
    CAPTURE(cpu.tensors()[worst_tensor].name);
    CAPTURE(worst);
    CHECK(worst <= tolerance);
    // the padded rows of wte are never a target: no gradient reaches them
    const auto dwte = device.gradient(gpt2::wte_index);
    CHECK(std::all_of(dwte.begin() + static_cast<std::ptrdiff_t>(config.vocab * config.channels), dwte.end(),
                      [](float g) { return g == 0.0f; }));
    cpu.update(1e-3f);
    device.update(1e-3f);  // advances its step count: the workspace's mirror takes the weights below
    for (std::size_t t = 0; t < cpu.tensors().size(); ++t)
      std::copy(cpu.parameter(t).begin(), cpu.parameter(t).end(), device.parameter(t).begin());
  }
}

/// Attention's softmax and its backward in the GPU's form, one warp per row (device_kernels::for_each_row: the kernel
/// on the GPU, its lanes emulated on the host), against the per-row stages of the CPU's order: rows of T = 45, so a
/// row's lanes hold 0, 1 or 2 elements, and past t garbage the softmax must overwrite with zeros. The sums' order is
/// the lanes' butterfly, not the row's: equal to rounding.
inline void check_softmax_rows() {
  using namespace gpt2::device_kernels;
  using index = gpt2::device_kernels::index;  // not POSIX's index()
  const index T = 45, rows = 2 * 3 * T, n = rows * T;
  std::vector<float> scores(n), gradients(n);
  for (std::size_t i = 0; i < n; ++i) {
    const bool causal = i % T <= (i / T) % T;
    scores[i] = causal ? std::sin(static_cast<float>(i) * 0.37f) * 6.0f : 1e30f;
    gradients[i] = causal ? std::cos(static_cast<float>(i) * 0.11f) : -1e30f;
  }
  thrust::device_vector<float> d_att(scores.begin(), scores.end()), d_datt(gradients.begin(), gradients.end());
  for_each_row(rows, attention_softmax_lanes{thrust::raw_pointer_cast(d_att.data()), T});
  std::vector<float> att = scores;
  for (index row = 0; row < rows; ++row) attention_softmax{att.data(), T}(row);
  const thrust::host_vector<float> lanes_att = d_att;
  for_each_row(rows, attention_backward_softmax_lanes{thrust::raw_pointer_cast(d_datt.data()),
                                                      thrust::raw_pointer_cast(d_att.data()), T});
  std::vector<float> datt = gradients;
  for (index row = 0; row < rows; ++row) attention_backward_softmax{datt.data(), att.data(), T}(row);
  const thrust::host_vector<float> lanes_datt = d_datt;
  std::size_t differing = 0, masked_nonzero = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % T > (i / T) % T) {
      masked_nonzero += lanes_att[i] != 0.0f || lanes_datt[i] != 0.0f;
      continue;
    }
    differing += std::abs(lanes_att[i] - att[i]) > 1e-5f * std::abs(att[i]) + 1e-12f;
    differing += std::abs(lanes_datt[i] - datt[i]) > 1e-5f * (std::abs(datt[i]) + std::abs(att[i]));
  }
  CHECK(differing == 0);
  CHECK(masked_nonzero == 0);
}

/// Layer norm's forward and its input's gradient, and the head's loss with its gradient, in the GPU's form (one warp
/// per row, as check_softmax_rows) against the CPU order's stages: rows of C = 100 channels (3 or 4 per lane) and of
/// V = 600 tokens (Vp = 640: dlogits 0 in the padded columns).
inline void check_row_kernels() {
  using namespace gpt2::device_kernels;
  using index = gpt2::device_kernels::index;  // not POSIX's index()
  const index rows = 37, C = 100, V = 600, Vp = 640;  // 5 blocks of 8 warps, the last partly idle
  std::vector<float> x(rows * C), dout(rows * C), weight(C), bias(C), dinp(rows * C), logits(rows * Vp);
  std::vector<int> targets(rows);
  for (index row = 0; row < rows; ++row) targets[row] = static_cast<int>((row * 97 + 13) % V);
  const float dloss = 1.0f;  // dlogits are then the probabilities less the target's 1: checked to 1e-5 of each
  const auto fill = [](std::vector<float>& v, float step, float scale, float offset) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * step) * scale + offset;
  };
  fill(x, 0.29f, 2.0f, 0.5f);
  fill(dout, 0.13f, 1.0f, 0.0f);
  fill(weight, 0.7f, 0.5f, 1.0f);
  fill(bias, 0.3f, 0.1f, 0.0f);
  fill(dinp, 0.05f, 0.2f, 0.0f);
  fill(logits, 0.011f, 9.0f, 1.0f);
  const auto device = [](const std::vector<float>& v) { return thrust::device_vector<float>(v.begin(), v.end()); };
  const auto raw = [](thrust::device_vector<float>& v) { return thrust::raw_pointer_cast(v.data()); };
  // The input's gradient is written over what dinp held (x here) as base (the residual stream's gradient) plus its own.
  auto d_x = device(x), d_dout = device(dout), d_weight = device(weight), d_bias = device(bias),
       d_base = device(dinp), d_dinp = device(x), d_logits = device(logits);
  thrust::device_vector<float> d_out(rows * C), d_mean(rows), d_rstd(rows), d_losses(rows);
  const thrust::device_vector<int> d_targets(targets.begin(), targets.end());
  for_each_row(rows, layernorm_forward_lanes{raw(d_out), raw(d_mean), raw(d_rstd), raw(d_x), raw(d_weight),
                                             raw(d_bias), C});
  for_each_row(rows, layernorm_backward_input_lanes{raw(d_dinp), raw(d_base), raw(d_dout), raw(d_x), raw(d_weight),
                                                    raw(d_mean), raw(d_rstd), C});
  for_each_row(rows, crossentropy_lanes{raw(d_logits), raw(d_losses), thrust::raw_pointer_cast(d_targets.data()),
                                        dloss, V, Vp});

  // The CPU order's stages, on the host.
  const auto each = [](index n, const auto& stage) {
    for (index i = 0; i < n; ++i) stage(i);
  };
  const row_segments norm_segments{C, gpt2::kernels::layernorm_segment};
  std::vector<float> parts(2 * rows * norm_segments.per_row()), out(rows * C), mean(rows), rstd(rows),
      means(2 * rows), sum(rows), losses(rows);
  each(rows * norm_segments.per_row(), layernorm_partial_sums{parts.data(), x.data(), nullptr, norm_segments});
  each(rows, layernorm_mean{mean.data(), parts.data(), norm_segments});
  each(rows * norm_segments.per_row(), layernorm_partial_sums{parts.data(), x.data(), mean.data(), norm_segments});
  each(rows, layernorm_rstd{rstd.data(), parts.data(), norm_segments});
  each(rows * C, layernorm_normalize{out.data(), x.data(), mean.data(), rstd.data(), weight.data(), bias.data(), C});
  each(rows * norm_segments.per_row(), layernorm_backward_partials{parts.data(), dout.data(), x.data(), weight.data(),
                                                                   mean.data(), rstd.data(), norm_segments, rows});
  each(rows, layernorm_backward_means{means.data(), parts.data(), norm_segments, rows});
  each(rows * C, layernorm_backward_input{dinp.data(), dinp.data(), dout.data(), x.data(), weight.data(), mean.data(),
                                          rstd.data(), means.data(), rows, C});  // in place
  const row_segments vocab_segments{V, gpt2::kernels::softmax_segment};
  std::vector<float> maxima(rows * vocab_segments.per_row()), row_max(rows), sums(maxima.size());
  each(maxima.size(), softmax_segment_max{maxima.data(), logits.data(), vocab_segments, Vp});
  each(rows, softmax_row_max{row_max.data(), maxima.data(), vocab_segments});
  each(maxima.size(), softmax_segment_exp{logits.data(), sums.data(), row_max.data(), vocab_segments, Vp});
  each(rows, softmax_row_sum{sum.data(), sums.data(), vocab_segments});
  each(rows, crossentropy_forward{losses.data(), logits.data(), sum.data(), targets.data(), Vp});
  each(rows * Vp, crossentropy_softmax_backward{logits.data(), sum.data(), targets.data(), dloss, V, Vp});

  const auto differing = [](const thrust::device_vector<float>& got, const std::vector<float>& expected) {
    const thrust::host_vector<float> values = got;
    std::size_t count = 0;
    for (std::size_t i = 0; i < expected.size(); ++i)
      count += std::abs(values[i] - expected[i]) > 1e-5f * std::abs(expected[i]) + 1e-6f;
    return count;
  };
  CHECK(differing(d_out, out) == 0);
  CHECK(differing(d_mean, mean) == 0);
  CHECK(differing(d_rstd, rstd) == 0);
  CHECK(differing(d_dinp, dinp) == 0);
  CHECK(differing(d_losses, losses) == 0);
  const thrust::host_vector<float> dlogits = d_logits;
  std::size_t differing_dlogits = 0;
  for (std::size_t i = 0; i < logits.size(); ++i)
    differing_dlogits += std::abs(dlogits[i] - logits[i]) > 1e-5f * std::abs(logits[i]) + 1e-12f;
  CHECK(differing_dlogits == 0);
  for (index row = 0; row < rows; ++row)
    for (index c = V; c < Vp; ++c) REQUIRE(dlogits[row * Vp + c] == 0.0f);
}

}  // namespace gpt2_device_cases

TEST_CASE("attention's softmax and its backward, one warp per row, give the per-row stages' values") {
  gpt2_device_cases::check_softmax_rows();
}

TEST_CASE("layer norm and the head's softmax, one warp per row, give the CPU order's stages' values") {
  gpt2_device_cases::check_row_kernels();
}

TEST_CASE("GPT-2's device passes give the CPU loops' loss and gradients") {
  gpt2_device_cases::check_against_cpu(gpt2_device_cases::small_config(), GPT2_DEVICE_TOLERANCE);
}

TEST_CASE("GPT-2's device passes under activation checkpointing give the CPU loops' loss and gradients") {
  auto config = gpt2_device_cases::small_config();
  config.recompute = true;
  config.layers = 3;
  gpt2_device_cases::check_against_cpu(config, GPT2_DEVICE_TOLERANCE);
}

TEST_CASE("a token outside the vocabulary is refused before it reaches the device") {
  const auto config = gpt2_device_cases::small_config();
  gpt2::reference_trainer trainer(config, 1);
  gpt2::device_workspace workspace(config);
  gpt2_device_cases::trainer_tensors host{&trainer};
  gpt2::device_executor run(host, workspace, config);
  std::vector<int> tokens, targets;
  gpt2_device_cases::batch_of(config, 0, tokens, targets);
  tokens[5] = static_cast<int>(config.vocab);  // a padded row: a row of wte, but no token
  CHECK_THROWS_WITH(gpt2::forward(run, config, tokens.data(), targets.data()),
                    doctest::Contains("tokens[5] = 600 is not a token of the vocabulary [0, 600)"));
}
