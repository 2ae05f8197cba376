#pragma once
// The model of examples/custom_trainer, in plain loops: an MLP (Linear+ReLU layers, softmax cross-entropy) learning
// which of its first 10 inputs is the largest. Nothing here knows chunkwise but train_plain, the reference that
// custom_trainer --check compares with, which updates with chunkwise's CPU Adam (the runtime's update formula).
#include <chunkwise/optim/cpu_adam.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace mlp {

// Layer l maps widths[l] inputs to widths[l + 1] outputs; its weight (outputs x inputs) is tensor 2l, its bias 2l + 1.
constexpr std::size_t widths[] = {32, 256, 256, 256, 256, 10}, layers = 5, classes = 10, batch = 64;
constexpr float lr = 3e-3f;

inline void make_batch(std::uint64_t step, std::vector<float>& x, std::vector<int>& y) {  // the same in every run
  std::mt19937 rng(static_cast<std::uint32_t>(step));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  x.resize(batch * widths[0]);
  y.resize(batch);
  for (auto& v : x) v = u(rng);
  for (std::size_t n = 0; n < batch; ++n)
    y[n] = static_cast<int>(std::max_element(&x[n * widths[0]], &x[n * widths[0] + classes]) - &x[n * widths[0]]);
}

inline void initialize(std::uint32_t t, std::span<float> values) {  // weights uniform in +-1/sqrt(inputs), biases 0
  std::mt19937 rng(t);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : values) v = t % 2 == 0 ? u(rng) / std::sqrt(static_cast<float>(widths[t / 2])) : 0.0f;
}

inline void layer_forward(std::size_t l, const float* W, const float* b, const float* x, float* y, std::size_t rows) {
  const std::size_t in = widths[l], out = widths[l + 1];
  for (std::size_t n = 0; n < rows; ++n)
    for (std::size_t o = 0; o < out; ++o) {
      float s = b[o];
      for (std::size_t i = 0; i < in; ++i) s += x[n * in + i] * W[o * in + i];
      y[n * out + o] = l + 1 < layers ? std::max(s, 0.0f) : s;  // ReLU, but not after the last layer
    }
}

// Adds the weight and bias gradients for the output gradient dy; dx (zeroed) gets the gradient at the input x,
// through x's ReLU.
inline void layer_backward(std::size_t l, const float* W, const float* x, const float* dy, float* dW, float* db,
                           float* dx, std::size_t rows) {
  const std::size_t in = widths[l], out = widths[l + 1];
  for (std::size_t n = 0; n < rows; ++n)
    for (std::size_t o = 0; o < out; ++o) {
      const float g = dy[n * out + o];
      db[o] += g;
      for (std::size_t i = 0; i < in; ++i) {
        dW[o * in + i] += g * x[n * in + i];
        dx[n * in + i] += g * W[o * in + i];
      }
    }
  for (std::size_t k = 0; k < rows * in; ++k) dx[k] = x[k] > 0.0f ? dx[k] : 0.0f;
}

// The mean softmax cross-entropy of the logits z over `rows` rows; dz gets its gradient.
inline float cross_entropy(const float* z, const int* y, float* dz, std::size_t rows) {
  const float per_row = 1.0f / static_cast<float>(rows);
  float loss = 0.0f;
  for (std::size_t n = 0; n < rows; ++n, z += classes, dz += classes) {
    const float top = *std::max_element(z, z + classes);
    float sum = 0.0f;
    for (std::size_t k = 0; k < classes; ++k) sum += dz[k] = std::exp(z[k] - top);
    for (std::size_t k = 0; k < classes; ++k) dz[k] = (dz[k] / sum - (static_cast<int>(k) == y[n])) * per_row;
    loss += std::log(sum) + top - z[y[n]];
  }
  return loss * per_row;
}

// One forward and backward over `rows` rows, pass by pass: forward passes 0 .. layers-1 (layer l), then backward
// passes layers .. 2*layers-1 (layer layers-1 down to 0). use(pass) keeps the pass's tensors available while it runs;
// param(t) and grad(t) point at tensor t's values and gradient. Returns the loss.
template <class Use, class Param, class Grad>
float forward_backward(const float* x, const int* y, std::size_t rows, Use&& use, Param&& param, Grad&& grad) {
  std::vector<std::vector<float>> acts(layers + 1);  // acts[l]: layer l's input
  acts[0].assign(x, x + rows * widths[0]);
  for (std::size_t l = 0; l < layers; ++l) {
    [[maybe_unused]] const auto in_use = use(l);
    acts[l + 1].resize(rows * widths[l + 1]);
    layer_forward(l, param(2 * l), param(2 * l + 1), acts[l].data(), acts[l + 1].data(), rows);
  }
  std::vector<float> dy(rows * classes), dx;
  const float loss = cross_entropy(acts[layers].data(), y, dy.data(), rows);
  for (std::size_t l = layers; l-- > 0;) {
    [[maybe_unused]] const auto in_use = use(2 * layers - 1 - l);
    dx.assign(rows * widths[l], 0.0f);
    layer_backward(l, param(2 * l), acts[l].data(), dy.data(), grad(2 * l), grad(2 * l + 1), dx.data(), rows);
    dy.swap(dx);
  }
  return loss;
}

// The reference: `steps` steps on plain vectors, whole batches, one thread. Returns each tensor's parameters.
inline std::vector<std::vector<float>> train_plain(std::size_t steps) {
  std::vector<std::vector<float>> p(2 * layers), g(p.size()), m(p.size()), v(p.size());
  for (std::uint32_t t = 0; t < p.size(); ++t) {
    const std::size_t elements = t % 2 == 0 ? widths[t / 2] * widths[t / 2 + 1] : widths[t / 2 + 1];
    p[t] = g[t] = m[t] = v[t] = std::vector<float>(elements, 0.0f);
    initialize(t, p[t]);
  }
  chunkwise::optim::cpu_adam adam;  // adam_config{}, as chunkwise::runtime_options' default
  std::vector<float> x;
  std::vector<int> y;
  for (std::size_t step = 1; step <= steps; ++step) {
    make_batch(step, x, y);
    for (auto& gradient : g) std::fill(gradient.begin(), gradient.end(), 0.0f);
    forward_backward(x.data(), y.data(), batch, [](std::size_t) { return 0; },
                     [&](std::size_t t) { return p[t].data(); }, [&](std::size_t t) { return g[t].data(); });
    for (std::size_t t = 0; t < p.size(); ++t)
      adam.step({.master = p[t].data(), .grad = g[t].data(), .moment1 = m[t].data(), .moment2 = v[t].data(),
                 .count = p[t].size()},
                {.lr = lr, .step = step});
  }
  return p;
}

}  // namespace mlp
