#pragma once
// The runtime tests' model: a chain of Linear+ReLU layers with a squared-error loss, small enough that every plan,
// rank count and option trains in milliseconds, with several chunks per model. Nothing here is GPT-2. The passes:
// forward 0 .. layers-1 (layer l), backward layers .. 2*layers-1 (layer layers-1 down to 0); layer l's weight is
// tensor 2l, its bias 2l + 1.
#include <chunkwise/optim/cpu_adam.hpp>
#include <chunkwise/profile/tracer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace toy {

constexpr std::size_t widths[] = {12, 40, 40, 40, 40, 6}, layers = 5, outputs = 6;
constexpr std::size_t batch = 8;  // rows of a global batch: divisible by 1, 2, 4 ranks and 2 micro-batches

inline std::size_t elements(std::uint32_t t) { return t % 2 == 0 ? widths[t / 2] * widths[t / 2 + 1] : widths[t / 2 + 1]; }

/// A small deterministic pseudo-random value in [-1, 1) from two integers.
inline float noise(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<double>(x >> 11) / 4503599627370496.0 - 1.0);
}

inline void initialize(std::uint32_t t, std::span<float> values) {
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = t % 2 == 0 ? noise(t, i) / std::sqrt(static_cast<float>(widths[t / 2])) : 0.01f * noise(t, i);
}

/// Step s's global batch: inputs (batch x widths[0]) and targets (batch x outputs).
inline void make_batch(std::uint64_t step, std::vector<float>& x, std::vector<float>& y) {
  x.resize(batch * widths[0]);
  y.resize(batch * outputs);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = noise(1000 + step, i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = noise(2000 + step, i);
}

/// The profile as one rank runs it on `rows` rows per forward and backward, with parameters of `type`: a dry run
/// against the tracer.
inline chunkwise::model_profile profile(std::size_t rows, chunkwise::dtype type = chunkwise::dtype::fp32) {
  using namespace chunkwise;
  tracer trace("toy-chain");
  std::vector<tensor_handle> tensors;
  for (std::uint32_t t = 0; t < 2 * layers; ++t)
    tensors.push_back(
        trace.register_tensor((t % 2 == 0 ? "w" : "b") + std::to_string(t / 2), elements(t), {.type = type}));
  std::vector<activation_handle> kept(layers);
  const auto pass = [&](std::size_t l, pass_kind kind) {
    trace.begin_pass("layer" + std::to_string(l), kind);
    trace.touch(tensors[2 * l]);
    trace.touch(tensors[2 * l + 1]);
    if (kind == pass_kind::forward) kept[l] = trace.allocate_activation(rows * widths[l + 1] * sizeof(float));
    else trace.free_activation(kept[l]);
    trace.add_flops((kind == pass_kind::forward ? 2 : 4) * rows * widths[l] * widths[l + 1]);
    trace.end_pass();
  };
  for (std::size_t l = 0; l < layers; ++l) pass(l, pass_kind::forward);
  for (std::size_t l = layers; l-- > 0;) pass(l, pass_kind::backward);
  return trace.profile();
}

/// Forward passes only (an evaluation): the loss of `rows` rows. use(pass) holds the pass's tensors.
template <class Use, class Param>
std::vector<std::vector<float>> forward(const float* x, std::size_t rows, Use&& use, Param&& param) {
  std::vector<std::vector<float>> acts(layers + 1);  // acts[l]: layer l's input
  acts[0].assign(x, x + rows * widths[0]);
  for (std::size_t l = 0; l < layers; ++l) {
    [[maybe_unused]] const auto in_use = use(l);
    const float *W = param(2 * l), *b = param(2 * l + 1);
    const std::size_t in = widths[l], out = widths[l + 1];
    acts[l + 1].resize(rows * out);
    for (std::size_t n = 0; n < rows; ++n)
      for (std::size_t o = 0; o < out; ++o) {
        float s = b[o];
        for (std::size_t i = 0; i < in; ++i) s += acts[l][n * in + i] * W[o * in + i];
        acts[l + 1][n * out + o] = l + 1 < layers ? std::max(s, 0.0f) : s;
      }
  }
  return acts;
}

/// One forward and backward over `rows` rows; the gradient of 0.5 * scale * sum((z - y)^2) is added to grad(t).
template <class Use, class Param, class Grad>
void forward_backward(const float* x, const float* y, std::size_t rows, float scale, Use&& use, Param&& param,
                      Grad&& grad) {
  const auto acts = forward(x, rows, use, param);
  std::vector<float> dy(rows * outputs), dx;
  for (std::size_t k = 0; k < dy.size(); ++k) dy[k] = scale * (acts[layers][k] - y[k]);
  for (std::size_t l = layers; l-- > 0;) {
    [[maybe_unused]] const auto in_use = use(2 * layers - 1 - l);
    const float* W = param(2 * l);
    float *dW = grad(2 * l), *db = grad(2 * l + 1);
    const std::size_t in = widths[l], out = widths[l + 1];
    dx.assign(rows * in, 0.0f);
    for (std::size_t n = 0; n < rows; ++n)
      for (std::size_t o = 0; o < out; ++o) {
        const float g = dy[n * out + o];
        db[o] += g;
        for (std::size_t i = 0; i < in; ++i) {
          dW[o * in + i] += g * acts[l][n * in + i];
          dx[n * in + i] += g * W[o * in + i];
        }
      }
    for (std::size_t k = 0; k < dx.size(); ++k) dx[k] = acts[l][k] > 0.0f ? dx[k] : 0.0f;
    dy.swap(dx);
  }
}

/// What the plain reference trains with.
struct reference_options {
  std::size_t steps = 3;
  float (*lr)(std::uint64_t) = nullptr;
  float clip_norm = 0.0f;
  chunkwise::optim::adam_config adam = chunkwise::optim::adamw_config();
  /// bf16 / fp16: the model computes with working copies rounded from fp32 master weights and its gradients are
  /// rounded to this type (once per step: each tensor is in one backward pass).
  chunkwise::dtype type = chunkwise::dtype::fp32;
  float loss_scale = 1.0f;    // the loss is multiplied by it; the update divides it out
  std::size_t skipped = 0;    // the first steps change nothing (overflowed under loss scaling) and are not counted:
                              // the next one is Adam's step 1 at the schedule's step 1
  /// 16-bit types: the batch is cut over this many ranks as the runtime's data parallelism cuts it; each rank's
  /// gradient is rounded, and their average is summed in fp32 in rank order and rounded once (comm/detail/reduce.hpp).
  std::size_t ranks = 1;
};

struct reference_result {
  std::vector<std::vector<float>> parameters;
  std::vector<double> grad_norms;  // per step, before clipping
};

/// The reference: whole batches on plain vectors, one thread, the same Adam kernel per tensor; clipping as
/// torch.nn.utils.clip_grad_norm_ (factor clip / (norm + 1e-6) when below 1).
inline reference_result train_plain(const reference_options& o) {
  using namespace chunkwise;
  std::vector<std::vector<float>> p(2 * layers), g(p.size()), m(p.size()), v(p.size()), w(p.size());
  std::vector<std::vector<std::uint16_t>> working16(p.size()), grad16(p.size());
  const bool mixed = o.type != dtype::fp32;
  for (std::uint32_t t = 0; t < p.size(); ++t) {
    p[t] = g[t] = m[t] = v[t] = std::vector<float>(elements(t), 0.0f);
    initialize(t, p[t]);
    working16[t] = grad16[t] = std::vector<std::uint16_t>(elements(t), 0);
  }
  // The values the model computes with, and 16-bit copies to and from the float arrays.
  const auto round_into = [&](const std::vector<float>& from, std::vector<std::uint16_t>& to) {
    visit_element(o.type, "toy", [&]<class T>(T) {
      if constexpr (!std::is_same_v<T, float>)
        for (std::size_t i = 0; i < from.size(); ++i) to[i] = from_float<T>(from[i]).bits;
    });
  };
  const auto widen = [&](const std::vector<std::uint16_t>& from, std::vector<float>& to) {
    visit_element(o.type, "toy", [&]<class T>(T) {
      if constexpr (!std::is_same_v<T, float>)
        for (std::size_t i = 0; i < from.size(); ++i) to[i] = to_float(T{from[i]});
    });
  };
  for (std::uint32_t t = 0; t < p.size() && mixed; ++t) {
    round_into(p[t], working16[t]);
    w[t].resize(p[t].size());
    widen(working16[t], w[t]);
  }
  chunkwise::optim::cpu_adam adam(o.adam);
  reference_result result;
  std::vector<float> x, y;
  for (std::uint64_t step = 1; step <= o.steps; ++step) {
    make_batch(step, x, y);
    for (auto& gradient : g) std::fill(gradient.begin(), gradient.end(), 0.0f);
    if (!mixed) {
      forward_backward(x.data(), y.data(), batch, o.loss_scale / batch, [](std::size_t) { return 0; },
                       [&](std::size_t t) { return p[t].data(); }, [&](std::size_t t) { return g[t].data(); });
    } else {
      const std::size_t rows = batch / o.ranks;
      std::vector<std::vector<float>> share(p.size()), rounded(p.size());
      for (std::size_t r = 0; r < o.ranks; ++r) {
        for (std::size_t t = 0; t < p.size(); ++t) share[t].assign(p[t].size(), 0.0f);
        forward_backward(x.data() + r * rows * widths[0], y.data() + r * rows * outputs, rows,
                         o.loss_scale / static_cast<float>(rows), [](std::size_t) { return 0; },
                         [&](std::size_t t) { return w[t].data(); }, [&](std::size_t t) { return share[t].data(); });
        for (std::size_t t = 0; t < p.size(); ++t) {
          rounded[t].resize(p[t].size());
          round_into(share[t], grad16[t]);
          widen(grad16[t], rounded[t]);
          for (std::size_t i = 0; i < p[t].size(); ++i) g[t][i] += rounded[t][i];
        }
      }
      for (std::size_t t = 0; t < p.size(); ++t) {
        for (auto& e : g[t]) e /= static_cast<float>(o.ranks);
        round_into(g[t], grad16[t]);
        widen(grad16[t], g[t]);
      }
    }
    if (step <= o.skipped) continue;
    double squares = 0.0;
    for (const auto& gradient : g)
      for (const float e : gradient) squares += static_cast<double>(e) * e;
    const double norm = std::sqrt(squares);
    result.grad_norms.push_back(norm);
    float scale = 1.0f;
    if (o.clip_norm > 0.0f && o.clip_norm / (norm + 1e-6) < 1.0) scale = static_cast<float>(o.clip_norm / (norm + 1e-6));
    for (std::size_t t = 0; t < p.size(); ++t) {
      if (mixed)
        adam.step({.master = p[t].data(), .grad = grad16[t].data(), .grad_type = o.type, .moment1 = m[t].data(),
                   .moment2 = v[t].data(), .working = working16[t].data(), .working_type = o.type,
                   .count = p[t].size()},
                  {.lr = o.lr(step - o.skipped), .step = step - o.skipped, .grad_scale = scale / o.loss_scale});
      else
        adam.step({.master = p[t].data(), .grad = g[t].data(), .moment1 = m[t].data(), .moment2 = v[t].data(),
                   .count = p[t].size()},
                  {.lr = o.lr(step), .step = step, .grad_scale = scale});
      if (mixed) widen(working16[t], w[t]);
    }
  }
  if (mixed) p = w;  // what the runtime's read_parameters gives: the working copies
  result.parameters = std::move(p);
  return result;
}

/// The largest relative difference |a - b| / |b| of a tensor (Euclidean norms).
inline double worst_relative_difference(const std::vector<std::vector<float>>& a,
                                        const std::vector<std::vector<float>>& b) {
  double worst = 0.0;
  for (std::size_t t = 0; t < b.size(); ++t) {
    double difference = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < b[t].size(); ++i) {
      difference += (static_cast<double>(a[t][i]) - b[t][i]) * (static_cast<double>(a[t][i]) - b[t][i]);
      norm += static_cast<double>(b[t][i]) * b[t][i];
    }
    worst = std::max(worst, std::sqrt(difference / norm));
  }
  return worst;
}

}  // namespace toy
