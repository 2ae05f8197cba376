#pragma once
// The fixed hyper-parameters of Adam, AdamW and SGD (the learning rate is per step, in step_args), and the
// per-step coefficients the kernels use. CPU and CUDA kernels take the same coefficients, so they compute the
// same update.
#include <chunkwise/core/error.hpp>
#include <chunkwise/optim/concepts.hpp>

#include <cmath>
#include <cstdint>
#include <string>

namespace chunkwise::optim {

/// How weight decay enters Adam: added to the gradient (`l2`, torch.optim.Adam) or applied to the weights
/// directly (`decoupled`, torch.optim.AdamW, Loshchilov & Hutter).
enum class weight_decay_mode : std::uint8_t { l2, decoupled };

struct adam_config {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  weight_decay_mode decay_mode = weight_decay_mode::decoupled;
};

/// AdamW with PyTorch's defaults (weight decay 0.01).
constexpr adam_config adamw_config(float weight_decay = 0.01f) noexcept {
  return {0.9f, 0.999f, 1e-8f, weight_decay, weight_decay_mode::decoupled};
}

struct sgd_config {
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;  // L2, added to the gradient (torch.optim.SGD)
  bool nesterov = false;
};

inline void validate(const adam_config& config) {
  const auto in_unit = [](float b) { return b >= 0.0f && b < 1.0f; };
  if (!in_unit(config.beta1) || !in_unit(config.beta2))
    throw error(error_code::invalid_argument, "adam: betas must lie in [0, 1), got beta1=" +
                                                  std::to_string(config.beta1) + " beta2=" + std::to_string(config.beta2));
  if (!(config.eps >= 0.0f) || !(config.weight_decay >= 0.0f))
    throw error(error_code::invalid_argument, "adam: eps and weight_decay must be >= 0, got eps=" +
                                                  std::to_string(config.eps) +
                                                  " weight_decay=" + std::to_string(config.weight_decay));
}

inline void validate(const sgd_config& config) {
  if (!(config.momentum >= 0.0f) || !(config.weight_decay >= 0.0f) || !(config.dampening >= 0.0f))
    throw error(error_code::invalid_argument, "sgd: momentum, dampening and weight_decay must be >= 0");
  if (config.nesterov && (config.momentum <= 0.0f || config.dampening != 0.0f))
    throw error(error_code::invalid_argument, "sgd: nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
}

inline void validate(const step_args& args) {
  if (args.step == 0)
    throw error(error_code::invalid_argument, "optimizer step: step counts from 1 (bias correction), got 0");
  if (!std::isfinite(args.lr) || !std::isfinite(args.grad_scale))
    throw error(error_code::invalid_argument, "optimizer step: lr and grad_scale must be finite, got lr=" +
                                                  std::to_string(args.lr) +
                                                  " grad_scale=" + std::to_string(args.grad_scale));
}

/// Per-step Adam coefficients. The element update (every kernel, same order of roundings; products feed explicit
/// fused multiply-adds only, so no compiler contraction can change a result):
///   g  = grad * grad_scale;              g = fma(l2, p, g)
///   m  = fma(beta1, m, (1 - beta1) * g)
///   v  = fma(beta2, v, ((1 - beta2) * g) * g)
///   d  = fma(sqrt(v), 1 / sqrt(1 - beta2^t), eps)
///   p  = fma(-lr / (1 - beta1^t), m / d, p * (1 - lr * wd_decoupled))
/// which is PyTorch's Adam/AdamW (denominator sqrt(v_hat) + eps), up to rounding.
struct adam_coefficients {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float neg_step_size;   // -lr / (1 - beta1^t)
  float inv_sqrt_bias2;  // 1 / sqrt(1 - beta2^t)
  float decay;           // 1 - lr * weight_decay for AdamW, else 1
  float l2;              // weight_decay for Adam with L2, else 0
  float grad_scale;
};

inline adam_coefficients make_coefficients(const adam_config& config, const step_args& args) noexcept {
  const double t = static_cast<double>(args.step);
  const double bias1 = 1.0 - std::pow(static_cast<double>(config.beta1), t);
  const double bias2 = 1.0 - std::pow(static_cast<double>(config.beta2), t);
  const bool decoupled = config.decay_mode == weight_decay_mode::decoupled;
  adam_coefficients c{};
  c.beta1 = config.beta1;
  c.one_minus_beta1 = 1.0f - config.beta1;
  c.beta2 = config.beta2;
  c.one_minus_beta2 = 1.0f - config.beta2;
  c.eps = config.eps;
  c.neg_step_size = static_cast<float>(-static_cast<double>(args.lr) / bias1);
  c.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  c.decay = decoupled ? static_cast<float>(1.0 - static_cast<double>(args.lr) * config.weight_decay) : 1.0f;
  c.l2 = decoupled ? 0.0f : config.weight_decay;
  c.grad_scale = args.grad_scale;
  return c;
}

/// Per-step SGD coefficients (torch.optim.SGD):
///   g = fma(wd, p, grad * grad_scale)
///   b = first step ? g : fma(momentum, b, (1 - dampening) * g)          (no buffer when momentum is 0)
///   u = nesterov ? fma(momentum, b, g) : b                               (u = g without momentum)
///   p = fma(-lr, u, p)
struct sgd_coefficients {
  float neg_lr, momentum, one_minus_dampening, weight_decay, grad_scale;
  bool first, nesterov, has_momentum;
};

inline sgd_coefficients make_coefficients(const sgd_config& config, const step_args& args) noexcept {
  return {-args.lr,         config.momentum,  1.0f - config.dampening, config.weight_decay, args.grad_scale,
          args.step == 1,   config.nesterov,  config.momentum != 0.0f};
}

}  // namespace chunkwise::optim
