#pragma once
// The plain GPT-2 trainer: every parameter, gradient and AdamW moment in ordinary memory, one flat vector each,
// tensors in the profile's order. It is the yardstick the chunkwise trainer is held to: both initialise with
// init_parameter, both run the step's one schedule (schedule.hpp: the pass functions in the profile's order), and
// both update with the same AdamW element formula, so on one rank in fp32 they must agree (DESIGN.md: within 1e-6
// relative).
//
// One training step (train_step):
//   zero the gradients; embed, layers 0..L-1, head forward (the mean loss); head, layers L-1..0, embed backward;
//   AdamW on every parameter.
//
// AdamW, as chunkwise::optim's CPU Adam defines it (chunkwise/optim/hyperparameters.hpp, adam_element), element by
// element in Real (float for the trainer) with the same fused multiply-adds, so a float run rounds exactly as the
// chunkwise kernels do:
//   m = fma(beta1, m, (1 - beta1) g);  v = fma(beta2, v, ((1 - beta2) g) g)
//   p = fma(-lr / (1 - beta1^t), m / fma(sqrt(v), 1 / sqrt(1 - beta2^t), eps), p (1 - lr wd))
// i.e. PyTorch's AdamW (decoupled weight decay, bias-corrected moments, eps added to sqrt(v_hat)).
// Defaults: llm.c's train_gpt2.c, betas 0.9 / 0.999, eps 1e-8, weight decay 0 (chunkwise::optim::adam_config{}).
#include "gpt2_model.hpp"
#include "schedule.hpp"
#include "random.hpp"

#include <chunkwise/core/error.hpp>
#include <chunkwise/optim/hyperparameters.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2 {

/// The standard deviation GPT-2 initialises a tensor with (as llm.c's train_gpt2.py): biases 0, LayerNorm weights
/// constant 1 (returned as 0 here: see init_parameter), the residual projections (attn.c_proj.weight,
/// mlp.c_proj.weight) 0.02 / sqrt(2 L), every other weight (wte, wpe, c_attn, c_fc) 0.02.
inline double init_std(const model_config& config, std::string_view name) {
  const auto ends_with = [&](std::string_view suffix) { return name.ends_with(suffix); };
  if (ends_with(".bias") || ends_with("ln_1.weight") || ends_with("ln_2.weight") || name == "ln_f.weight") return 0.0;
  if (ends_with("c_proj.weight")) return 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers));
  return 0.02;
}

/// Fills the parameter tensor `name` with its initial values: normal(0, init_std) from a stream of its own
/// (seeded by `seed` and the name, so any tensor can be initialised alone and in any order), LayerNorm weights 1,
/// biases 0. Throws chunkwise::error(invalid_argument) for a name the model does not have or a wrong size.
template <class Real>
void init_parameter(const model_config& config, std::string_view name, std::span<Real> values, std::uint64_t seed) {
  bool found = false;
  for (const auto& tensor : parameter_tensors(config))
    if (tensor.name == name) {
      if (tensor.elements != values.size())
        throw chunkwise::error(chunkwise::error_code::invalid_argument,
                               "gpt2 init_parameter: tensor '" + std::string(name) + "' has " +
                                   std::to_string(tensor.elements) + " elements, given a span of " +
                                   std::to_string(values.size()));
      found = true;
    }
  if (!found)
    throw chunkwise::error(chunkwise::error_code::invalid_argument,
                           "gpt2 init_parameter: the model has no tensor '" + std::string(name) +
                               "'; names are wte, wpe, h.<0.." + std::to_string(config.layers - 1) +
                               ">.<suffix>, ln_f.weight, ln_f.bias");
  const bool layernorm_weight = name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") || name == "ln_f.weight";
  const double stddev = init_std(config, name);
  // normal() takes two draws: element i's are draws 2i and 2i + 1 of the tensor's stream, wherever a thread starts
  const std::uint64_t stream = seed ^ name_hash(name);
#pragma omp parallel for
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = layernorm_weight ? Real(1)
                : stddev == 0.0  ? Real(0)
                                 : static_cast<Real>(stddev * splitmix64::after(stream, 2 * i).normal());
}

/// AdamW on n elements with this step's coefficients (chunkwise::optim::make_coefficients): the element update of
/// chunkwise::optim's CPU Adam, in Real. Elementwise, so any split into tensors or chunks gives the same result.
template <class Real>
void adamw_update(const chunkwise::optim::adam_coefficients& c, Real* params, const Real* grads, Real* moment1,
                  Real* moment2, std::size_t n) {
  const Real beta1 = Real(c.beta1), one_minus_beta1 = Real(c.one_minus_beta1), beta2 = Real(c.beta2),
             one_minus_beta2 = Real(c.one_minus_beta2), eps = Real(c.eps), neg_step_size = Real(c.neg_step_size),
             inv_sqrt_bias2 = Real(c.inv_sqrt_bias2), decay = Real(c.decay), l2 = Real(c.l2),
             grad_scale = Real(c.grad_scale);
#pragma omp parallel for
  for (std::size_t i = 0; i < n; ++i) {
    const Real p = params[i];
    const Real g = std::fma(l2, p, grads[i] * grad_scale);
    const Real m = std::fma(beta1, moment1[i], one_minus_beta1 * g);
    const Real v = std::fma(beta2, moment2[i], (one_minus_beta2 * g) * g);
    const Real denom = std::fma(std::sqrt(v), inv_sqrt_bias2, eps);
    moment1[i] = m;
    moment2[i] = v;
    params[i] = std::fma(neg_step_size, m / denom, p * decay);
  }
}

template <class Real>
class basic_reference_trainer {
 public:
  basic_reference_trainer(const model_config& config, std::uint64_t seed, chunkwise::optim::adam_config adam = {})
      : config_(config), adam_(adam), tensors_(parameter_tensors(config)), acts_(config) {
    chunkwise::optim::validate(adam_);
    std::size_t total = 0;
    for (const auto& tensor : tensors_) {
      offsets_.push_back(total);
      total += tensor.elements;
    }
    params_.assign(total, Real(0));
    grads_.assign(total, Real(0));
    moment1_.assign(total, Real(0));
    moment2_.assign(total, Real(0));
    for (std::size_t i = 0; i < tensors_.size(); ++i) init_parameter(config_, tensors_[i].name, parameter(i), seed);
  }

  /// One step on a batch: tokens and targets are (B, T) token ids. Returns the mean loss before the update.
  Real train_step(const int* tokens, const int* targets, float lr) {
    zero_gradients();
    const Real loss = forward(tokens, targets);
    backward(tokens, targets);
    update(lr);
    return loss;
  }

  /// Every forward pass of the schedule (schedule.hpp); the mean loss against targets. Also what evaluation runs.
  Real forward(const int* tokens, const int* targets) {
    return static_cast<Real>(gpt2::forward(*this, config_, tokens, targets));
  }

  /// Every backward pass, after forward on the same tokens and targets; gradients accumulate.
  void backward(const int* tokens, const int* targets) { gpt2::backward(*this, config_, tokens, targets); }

  /// The schedule's executor: every pass runs on this trainer's arrays.
  template <class Body>
  void pass(const pass_info&, Body&& body) {
    body(*this);
  }
  Real* param(std::size_t index) { return parameter_data(index); }
  Real* grad(std::size_t index) { return gradient_data(index); }

  void zero_gradients() { std::fill(grads_.begin(), grads_.end(), Real(0)); }

  /// AdamW on every parameter with learning rate lr; the step count (for bias correction) advances by one.
  void update(float lr) {
    ++steps_;
    const chunkwise::optim::step_args args{lr, steps_, 1.0f};
    chunkwise::optim::validate(args);
    const auto c = chunkwise::optim::make_coefficients(adam_, args);
    adamw_update(c, params_.data(), grads_.data(), moment1_.data(), moment2_.data(), params_.size());
  }

  [[nodiscard]] const chunkwise::optim::adam_config& adam() const noexcept { return adam_; }
  [[nodiscard]] const model_config& config() const noexcept { return config_; }
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  [[nodiscard]] const std::vector<parameter_tensor>& tensors() const noexcept { return tensors_; }

  /// The index of tensor `name` in tensors(); throws chunkwise::error(invalid_argument) for an unknown name.
  [[nodiscard]] std::size_t tensor_index(std::string_view name) const {
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (tensors_[i].name == name) return i;
    throw chunkwise::error(chunkwise::error_code::invalid_argument,
                           "gpt2 reference trainer: no tensor '" + std::string(name) + "' among its " +
                               std::to_string(tensors_.size()) + " tensors (wte, wpe, h.<l>.<suffix>, ln_f.*)");
  }

  std::span<Real> parameter(std::size_t index) { return {params_.data() + offsets_[index], tensors_[index].elements}; }
  std::span<Real> gradient(std::size_t index) { return {grads_.data() + offsets_[index], tensors_[index].elements}; }
  std::span<const Real> parameter(std::size_t index) const {
    return {params_.data() + offsets_[index], tensors_[index].elements};
  }
  std::span<const Real> gradient(std::size_t index) const {
    return {grads_.data() + offsets_[index], tensors_[index].elements};
  }

  /// All parameters (gradients), flat, tensors in the profile's order.
  [[nodiscard]] std::span<const Real> parameters() const noexcept { return params_; }
  [[nodiscard]] std::span<const Real> gradients() const noexcept { return grads_; }

  activations<Real>& acts() noexcept { return acts_; }

 private:
  Real* parameter_data(std::size_t index) { return params_.data() + offsets_[index]; }
  Real* gradient_data(std::size_t index) { return grads_.data() + offsets_[index]; }

  model_config config_;
  chunkwise::optim::adam_config adam_;
  std::vector<parameter_tensor> tensors_;
  std::vector<std::size_t> offsets_;
  std::vector<Real> params_, grads_, moment1_, moment2_;
  activations<Real> acts_;
  std::uint64_t steps_ = 0;
};

/// The fp32 trainer the example runs; basic_reference_trainer<double> checks the maths in the tests.
using reference_trainer = basic_reference_trainer<float>;

}  // namespace gpt2
