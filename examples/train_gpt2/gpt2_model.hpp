#pragma once
// GPT-2 on the CPU, after Andrej Karpathy's llm.c (train_gpt2.c, MIT licence): token and position embeddings,
// pre-LayerNorm blocks (causal self-attention, then an MLP with tanh-approximated GELU), a final LayerNorm and an
// LM head tied to the token embedding, trained with mean cross-entropy. Plain loops, `#pragma omp parallel for`
// only where the iterations write disjoint outputs, so results are bit-identical for any thread count (compiled
// without OpenMP, the pragmas are ignored).
//
// The model is organised BY PASS, exactly as chunkwise's analytic profile (chunkwise/profile/gpt2.hpp) lists the
// passes of one training step:
//
//   forward:   embed_forward   (wte, wpe)
//              layer_forward   (the layer's 12 tensors)            for l = 0 .. L-1
//              head_forward    (ln_f.weight, ln_f.bias, wte)  -> mean loss
//   backward:  head_backward   (ln_f.weight, wte; gradients of ln_f.weight, ln_f.bias, wte)
//              layer_backward  (the layer's 12 tensors and their gradients)   for l = L-1 .. 0
//              embed_backward  (gradients of wte, wpe)
//
// A pass receives only the pointers of the parameter tensors it touches (and of their gradients), plus the
// activations, which the trainer owns (`activations`, allocated once for (B, T), as llm.c does). So a trainer that
// keeps parameters in chunk memory hands each pass the pointers it acquired for it, and runs the very same maths as
// the plain reference trainer (reference_trainer.hpp).
//
// Conventions, as llm.c:
//   - Weights of a linear layer are stored (OC, C) row-major ("out channels by in channels"): out = inp @ W^T + b.
//     The element counts are the profile's: c_attn.weight 3C*C, c_proj.weight C*C, c_fc.weight 4C*C,
//     mlp c_proj.weight C*4C.
//   - Parameter gradients ACCUMULATE (+=): the caller zeroes them before backward. So the tied wte receives both
//     the head's contribution (head_backward) and the embedding's (embed_backward).
//   - Activation gradients are scratch: each backward pass zeroes the ones it writes, so the passes need nothing
//     from the caller but the order above.
// Every function is a template over the element type `Real`: the trainers use float (fp32, as the profile's
// dtype::fp32); the gradient test uses double, so central finite differences can check the maths tightly.
#include <chunkwise/core/error.hpp>
#include <chunkwise/profile/gpt2.hpp>

#include "gelu_math.hpp"
#include "matmul_engine.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpt2 {

// ----------------------------------------------------------------------------------------------------------------
// Configuration and parameter tensors

struct model_config {
  std::size_t vocab = 256;     // V: byte-level tokens
  std::size_t context = 64;    // T: tokens per sequence, and the rows of wpe
  std::size_t channels = 128;  // C
  std::size_t heads = 4;       // NH: C must be a multiple of it
  std::size_t layers = 4;      // L
  std::size_t batch = 4;       // B: sequences per step
  std::size_t padded_vocab = 0;  // Vp: rows of wte and of the logits (llm.c pads V to a multiple of 128; 0: V)
  bool recompute = false;  // activation checkpointing: blocks keep only their output, backward recomputes the rest

  /// Rows of wte and of the logits: Vp when padded, else V. The padded rows are never a target: their logits are
  /// computed and ignored, as in llm.c, so they get no gradient.
  [[nodiscard]] std::size_t vocab_rows() const noexcept { return padded_vocab != 0 ? padded_vocab : vocab; }

  /// Vp*C + T*C + L*(12*C^2 + 13*C) + 2*C, as chunkwise::gpt2_config::parameter_count().
  [[nodiscard]] std::size_t parameter_count() const noexcept {
    const std::size_t c = channels;
    return vocab_rows() * c + context * c + layers * (12 * c * c + 13 * c) + 2 * c;
  }
};

/// Throws chunkwise::error(invalid_argument) for a zero dimension or channels not divisible by heads.
inline void validate(const model_config& config) {
  using chunkwise::error, chunkwise::error_code;
  if (config.vocab == 0 || config.context == 0 || config.channels == 0 || config.heads == 0 || config.layers == 0 ||
      config.batch == 0)
    throw error(error_code::invalid_argument,
                "gpt2 model_config has a zero dimension (vocab " + std::to_string(config.vocab) + ", context " +
                    std::to_string(config.context) + ", channels " + std::to_string(config.channels) + ", heads " +
                    std::to_string(config.heads) + ", layers " + std::to_string(config.layers) + ", batch " +
                    std::to_string(config.batch) + "); all must be positive");
  if (config.channels % config.heads != 0)
    throw error(error_code::invalid_argument, "gpt2 model_config: channels " + std::to_string(config.channels) +
                                                  " is not divisible by heads " + std::to_string(config.heads) +
                                                  "; pick heads among the divisors of channels");
  if (config.padded_vocab != 0 && config.padded_vocab < config.vocab)
    throw error(error_code::invalid_argument, "gpt2 model_config: padded_vocab " +
                                                  std::to_string(config.padded_vocab) + " is below vocab " +
                                                  std::to_string(config.vocab) + "; it pads the vocabulary, or is 0");
}

/// llm.c's padding of the vocabulary: up to a multiple of 128 (50257 -> 50304), so the head's products tile well.
constexpr std::size_t llmc_padded_vocab(std::size_t vocab) noexcept { return (vocab + 127) / 128 * 128; }

/// The same model for chunkwise's planner: gpt2_profile(profile_config(config)) is this model's profile.
inline chunkwise::gpt2_config profile_config(const model_config& config) {
  chunkwise::gpt2_config profile;
  profile.name = "train-gpt2";
  profile.layers = static_cast<std::uint32_t>(config.layers);
  profile.d_model = static_cast<std::uint32_t>(config.channels);
  profile.heads = static_cast<std::uint32_t>(config.heads);
  profile.vocab = static_cast<std::uint32_t>(config.vocab_rows());
  profile.context = static_cast<std::uint32_t>(config.context);
  profile.micro_batch = static_cast<std::uint32_t>(config.batch);
  profile.type = chunkwise::dtype::fp32;
  profile.recompute = config.recompute;
  return profile;
}

/// The 12 tensors of one block, in the profile's order ("h.<l>.<suffix>").
enum layer_tensor : std::size_t {
  ln_1_weight,
  ln_1_bias,
  attn_c_attn_weight,
  attn_c_attn_bias,
  attn_c_proj_weight,
  attn_c_proj_bias,
  ln_2_weight,
  ln_2_bias,
  mlp_c_fc_weight,
  mlp_c_fc_bias,
  mlp_c_proj_weight,
  mlp_c_proj_bias,
  layer_tensor_count
};

inline constexpr std::array<std::string_view, layer_tensor_count> layer_tensor_suffixes{
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

/// Element counts of the 12 tensors of one block, in the order of layer_tensor.
inline std::array<std::size_t, layer_tensor_count> layer_tensor_sizes(const model_config& config) {
  const std::size_t c = config.channels;
  return {c, c, 3 * c * c, 3 * c, c * c, c, c, c, 4 * c * c, 4 * c, c * 4 * c, c};
}

/// One parameter tensor: its name (as the profile spells it) and element count.
struct parameter_tensor {
  std::string name;
  std::size_t elements = 0;
};

/// Index of a tensor in parameter_tensors(): wte, wpe, then 12 per layer, then ln_f.weight, ln_f.bias.
inline constexpr std::size_t wte_index = 0;
inline constexpr std::size_t wpe_index = 1;
constexpr std::size_t layer_tensor_index(std::size_t layer, layer_tensor tensor) noexcept {
  return 2 + layer * layer_tensor_count + tensor;
}
constexpr std::size_t ln_f_weight_index(const model_config& config) noexcept { return 2 + config.layers * 12; }
constexpr std::size_t ln_f_bias_index(const model_config& config) noexcept { return 3 + config.layers * 12; }

/// All parameter tensors in the profile's first-use order (the order of gpt2_profile(profile_config(config))).
inline std::vector<parameter_tensor> parameter_tensors(const model_config& config) {
  const std::size_t c = config.channels;
  std::vector<parameter_tensor> tensors;
  tensors.reserve(4 + config.layers * layer_tensor_count);
  tensors.push_back({"wte", config.vocab_rows() * c});
  tensors.push_back({"wpe", config.context * c});
  const auto sizes = layer_tensor_sizes(config);
  for (std::size_t l = 0; l < config.layers; ++l)
    for (std::size_t t = 0; t < layer_tensor_count; ++t)
      tensors.push_back({"h." + std::to_string(l) + "." + std::string(layer_tensor_suffixes[t]), sizes[t]});
  tensors.push_back({"ln_f.weight", c});
  tensors.push_back({"ln_f.bias", c});
  return tensors;
}

/// The pointers one layer pass reads: its 12 parameter tensors, indexed by layer_tensor.
template <class Real>
struct layer_params {
  std::array<const Real*, layer_tensor_count> tensor{};
  const Real* operator[](layer_tensor t) const noexcept { return tensor[t]; }
};

/// The pointers one layer's backward pass accumulates into: the gradients of its 12 tensors.
template <class Real>
struct layer_grads {
  std::array<Real*, layer_tensor_count> tensor{};
  Real* operator[](layer_tensor t) const noexcept { return tensor[t]; }
};

// ----------------------------------------------------------------------------------------------------------------
// Activations: what forward keeps for backward (llm.c's ActivationTensors), and backward's scratch gradients.
// Buffer: a view of where they live. The CPU passes use std::span over one block of memory: the trainer's own, or
// lent from the runtime's device tier, so the bytes the planner charged as activations are the bytes these take
// (4 * total_elements(config) == the profile's peak activation bytes). The device passes (device_model_impl.hpp)
// view one block of device memory the same way: their own, or the runtime's device tier's (a GPU's).

namespace detail {
/// A buffer that only counts its elements (activations::total_elements).
struct counted_buffer {
  counted_buffer() = default;
  template <class Real>
  counted_buffer(std::size_t n, Real) : elements(n) {}
  [[nodiscard]] std::size_t size() const noexcept { return elements; }
  std::size_t elements = 0;
};
}  // namespace detail

template <class Real, class Buffer = std::span<Real>>
struct activations {
  /// Owns its memory. Every buffer starts zeroed.
  explicit activations(const model_config& config) : activations(config, nullptr) {}
  /// In `memory`: total_elements(config) elements the caller keeps alive, zeroed by `fill_zero` (device memory: the
  /// device passes') or else here; nullptr: owns its memory. A Buffer that allocates itself takes nullptr.
  activations(const model_config& config, Real* memory, void (*fill_zero)(Real*, std::size_t) = nullptr)
      : B(config.batch), T(config.context), C(config.channels), NH(config.heads), L(config.layers), V(config.vocab),
        Vp(config.vocab_rows()), slots(config.recompute ? 1 : config.layers) {
    validate(config);
    if constexpr (std::is_same_v<Buffer, std::span<Real>>) {
      if (memory == nullptr) {
        owned_.assign(total_elements(config), Real(0));
        memory = owned_.data();
      } else if (fill_zero != nullptr) {
        fill_zero(memory, total_elements(config));
      } else {
        std::fill_n(memory, total_elements(config), Real(0));
      }
      assign([&](std::size_t n) { return std::span<Real>(std::exchange(memory, memory + n), n); });
    } else {
      assign([](std::size_t n) { return Buffer(n, Real(0)); });
    }
  }
  activations(const activations&) = delete;  // views into owned_ would alias
  activations& operator=(const activations&) = delete;

  /// The elements every buffer together takes: what forward keeps, the recompute slot, and backward's workspace
  /// (the profile's peak activation bytes, reached in the head's backward pass).
  [[nodiscard]] static std::size_t total_elements(const model_config& config) {
    return activations<Real, detail::counted_buffer>(config, nullptr).held_elements();
  }
  /// total_elements in bytes: what the planner charges the device tier for them.
  [[nodiscard]] static std::size_t total_bytes(const model_config& config) {
    return total_elements(config) * sizeof(Real);
  }
  /// Backward's workspace, held through the step: the two alternating slices of the residual stream's gradient, and
  /// one block's activation gradients or the head's dlnf, which share their memory (the head's dlogits replace the
  /// probabilities in place).
  [[nodiscard]] static std::size_t backward_workspace_elements(const model_config& config) {
    return activations<Real, detail::counted_buffer>(config, nullptr).workspace_elements();
  }
  [[nodiscard]] std::size_t held_elements() const noexcept { return saved_elements() + workspace_elements(); }
  [[nodiscard]] std::size_t workspace_elements() const noexcept { return dresidual.size() + gradient_scratch_.size(); }

  /// Elements forward keeps for backward: B*T*C + L*(B*T*(18C+4) + B*NH*T*T) + B*T*(C+2) + B*T*Vp + B*T,
  /// the profile's activation count for this model (chunkwise/profile/gpt2.hpp); under recompute the per-layer terms
  /// count one slot besides the L outputs.
  [[nodiscard]] std::size_t saved_elements() const noexcept {
    std::size_t n = 0;
    for (const auto* buffer : {&encoded, &ln1, &ln1_mean, &ln1_rstd, &qkv, &atty, &att, &attproj,
                               &residual2, &ln2, &ln2_mean, &ln2_rstd, &fch, &fch_gelu, &fcproj, &residual3, &lnf,
                               &lnf_mean, &lnf_rstd, &logits, &losses})
      n += buffer->size();
    return n;
  }

  std::size_t B, T, C, NH, L, V, Vp;  // V: tokens; Vp: rows of wte and the logits (V, or llm.c's padding)
  std::size_t slots;  // layers whose intermediate activations are held: L, or 1 under recompute

  /// Where layer l's intermediate activations live (every buffer but residual3): its own slice, or under recompute
  /// the one slice every layer's forward writes and its backward recomputes.
  [[nodiscard]] std::size_t slot(std::size_t l) const noexcept { return slots == L ? l : 0; }

  // Forward. Per-layer buffers hold `slots` layers (slot(l) times the slice size); residual3 holds all L outputs, the
  // checkpoints recompute starts from.
  Buffer encoded;                  // (B, T, C)       token + position embedding: the input of layer 0
  Buffer ln1, ln1_mean, ln1_rstd;  // (L, B, T, C), (L, B, T), (L, B, T)
  Buffer qkv;                      // (L, B, T, 3C)   queries, keys, values
  Buffer atty;                     // (L, B, T, C)    attention output, before the projection
  Buffer att;                      // (L, B, NH, T, T) the causal softmax of the scores (computed in place)
  Buffer attproj;                  // (L, B, T, C)
  Buffer residual2;                // (L, B, T, C)    residual stream after attention
  Buffer ln2, ln2_mean, ln2_rstd;  // (L, B, T, C), (L, B, T), (L, B, T)
  Buffer fch, fch_gelu;            // (L, B, T, 4C)   MLP hidden layer before and after GELU
  Buffer fcproj;                   // (L, B, T, C)
  Buffer residual3;                // (L, B, T, C)    output of layer l, the input of layer l + 1
  Buffer lnf, lnf_mean, lnf_rstd;  // (B, T, C), (B, T), (B, T)
  Buffer logits;                   // (B, T, Vp)      the logits, then in place their probabilities (forward: the
                                   //                 padded columns' 0), then the head's backward's dlogits
  Buffer losses;                   // (B, T)          cross-entropy of each position

  // Backward: gradients of the mean loss with respect to activations.
  Buffer dresidual;  // (2, B, T, C): d(input of layer l) at dresidual_offset(l); l = L: d(output of layer L-1)
  // One layer's worth, reused by every layer_backward (the working set the profile counts for a backward pass).
  Buffer dln1, dqkv, datty, datt, dattproj, dresidual2, dln2, dfch, dfch_gelu, dfcproj;
  // The head's, in the same memory as the layer's: each backward pass zeroes its own before use, and none uses both.
  // (Its dlogits, (B, T, Vp), replace the probabilities in `logits`: at 124M, batch 4, context 1024, 824 MB that
  // llm.c's CPU trainer keeps three times, logits, probs and dlogits.)
  Buffer dlnf;

  /// Where in dresidual the gradient of layer l's input lies (l = L: of the last layer's output). Layer l's backward
  /// reads l + 1's and writes l's, so two slices alternate (llm.c keeps all L + 1).
  [[nodiscard]] std::size_t dresidual_offset(std::size_t l) const noexcept { return (l % 2) * B * T * C; }

 private:
  // Every buffer, in one order, from make(elements).
  template <class Make>
  void assign(Make&& make) {
    const std::size_t BT = B * T, BTC = B * T * C, S = slots;
    encoded = make(BTC);
    ln1 = make(S * BTC), ln1_mean = make(S * BT), ln1_rstd = make(S * BT);
    qkv = make(S * BTC * 3), atty = make(S * BTC);
    att = make(S * B * NH * T * T);
    attproj = make(S * BTC), residual2 = make(S * BTC);
    ln2 = make(S * BTC), ln2_mean = make(S * BT), ln2_rstd = make(S * BT);
    fch = make(S * BTC * 4), fch_gelu = make(S * BTC * 4), fcproj = make(S * BTC), residual3 = make(L * BTC);
    lnf = make(BTC), lnf_mean = make(BT), lnf_rstd = make(BT);
    logits = make(BT * Vp), losses = make(BT);

    dresidual = make(2 * BTC);
    gradient_scratch_ = make(17 * BTC + B * NH * T * T);  // the head's dlnf (BTC) fits in it
    std::size_t at = 0;
    const auto carve = [&](std::size_t n) {
      at += n;
      if constexpr (std::is_same_v<Buffer, std::span<Real>>) return gradient_scratch_.subspan(at - n, n);
      else return Buffer(n, Real(0));
    };
    dln1 = carve(BTC), dqkv = carve(BTC * 3), datty = carve(BTC);
    datt = carve(B * NH * T * T);  // the weights' gradients, then in place the scores' (attention_backward)
    dattproj = carve(BTC), dresidual2 = carve(BTC), dln2 = carve(BTC);
    dfch = carve(BTC * 4), dfch_gelu = carve(BTC * 4), dfcproj = carve(BTC);
    at = 0;
    dlnf = carve(BTC);
  }
  Buffer gradient_scratch_;  // the layer's and the head's activation gradients
  std::vector<Real> owned_;  // the memory of a span Buffer given none
};

// ----------------------------------------------------------------------------------------------------------------
// Kernels: one operation each, forward and backward, on (B, T, channels) row-major arrays. As in llm.c, backward
// kernels ACCUMULATE (+=) into every gradient they produce.

namespace kernels {

inline void check_tokens(const int* tokens, std::size_t count, std::size_t vocab, const char* what) {
  for (std::size_t i = 0; i < count; ++i)
    if (tokens[i] < 0 || static_cast<std::size_t>(tokens[i]) >= vocab)
      throw chunkwise::error(chunkwise::error_code::invalid_argument,
                             std::string("gpt2: ") + what + "[" + std::to_string(i) + "] = " +
                                 std::to_string(tokens[i]) + " is not a token of the vocabulary [0, " +
                                 std::to_string(vocab) + ")");
}

/// Sums over a row (layer norm's C channels, the softmax's V tokens) run by segments, then over the segments in order:
/// the order the device passes (device_kernels.hpp) use with one thread per segment, so that both give the same bits.
inline constexpr std::size_t layernorm_segment = 64;
inline constexpr std::size_t softmax_segment = 256;

/// term(0) + ... + term(n - 1), in that segmented order.
template <class Real, class Term>
Real segmented_sum(std::size_t n, std::size_t segment, Term&& term) {
  Real sum = 0;
  for (std::size_t begin = 0; begin < n; begin += segment) {
    Real part = 0;
    for (std::size_t i = begin; i < std::min(n, begin + segment); ++i) part += term(i);
    sum += part;
  }
  return sum;
}

// out[b,t,:] = wte[token[b,t],:] + wpe[t,:]
template <class Real>
void encoder_forward(Real* out, const int* tokens, const Real* wte, const Real* wpe, std::size_t B, std::size_t T,
                     std::size_t C) {
#pragma omp parallel for collapse(2)
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      Real* out_bt = out + (b * T + t) * C;
      const Real* wte_ix = wte + static_cast<std::size_t>(tokens[b * T + t]) * C;
      const Real* wpe_t = wpe + t * C;
      for (std::size_t i = 0; i < C; ++i) out_bt[i] = wte_ix[i] + wpe_t[i];
    }
}

// Serial: rows of wte repeat across (b, t), and a fixed order keeps the result deterministic.
template <class Real>
void encoder_backward(Real* dwte, Real* dwpe, const Real* dout, const int* tokens, std::size_t B, std::size_t T,
                      std::size_t C) {
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      const Real* dout_bt = dout + (b * T + t) * C;
      Real* dwte_ix = dwte + static_cast<std::size_t>(tokens[b * T + t]) * C;
      Real* dwpe_t = dwpe + t * C;
      for (std::size_t i = 0; i < C; ++i) {
        dwte_ix[i] += dout_bt[i];
        dwpe_t[i] += dout_bt[i];
      }
    }
}

// out = (x - mean) * rstd * weight + bias over the C channels of each (b, t); keeps mean and rstd for backward.
template <class Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight, const Real* bias,
                       std::size_t B, std::size_t T, std::size_t C) {
  const Real eps = Real(1e-5);
#pragma omp parallel for collapse(2)
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      const Real* x = inp + (b * T + t) * C;
      const Real m = segmented_sum<Real>(C, layernorm_segment, [&](std::size_t i) { return x[i]; }) / Real(C);
      const Real v =
          segmented_sum<Real>(C, layernorm_segment, [&](std::size_t i) { return (x[i] - m) * (x[i] - m); }) / Real(C);
      const Real s = Real(1) / std::sqrt(v + eps);
      Real* out_bt = out + (b * T + t) * C;
      for (std::size_t i = 0; i < C; ++i) out_bt[i] = s * (x[i] - m) * weight[i] + bias[i];
      mean[b * T + t] = m;
      rstd[b * T + t] = s;
    }
}

// Serial: dweight and dbias sum over every (b, t) as add_column_sums does.
template <class Real>
void layernorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp, const Real* weight,
                        const Real* mean, const Real* rstd, std::size_t B, std::size_t T, std::size_t C) {
  segmented_column_sums<Real> sum_dbias(B * T, C), sum_dweight(B * T, C);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      const Real* dout_bt = dout + (b * T + t) * C;
      const Real* inp_bt = inp + (b * T + t) * C;
      Real* dinp_bt = dinp + (b * T + t) * C;
      const Real mean_bt = mean[b * T + t], rstd_bt = rstd[b * T + t];
      // Two reductions: the mean of dnorm and the mean of dnorm * norm.
      const auto dnorm = [&](std::size_t i) { return weight[i] * dout_bt[i]; };
      const Real dnorm_mean = segmented_sum<Real>(C, layernorm_segment, dnorm) / Real(C);
      const Real dnorm_norm_mean = segmented_sum<Real>(C, layernorm_segment, [&](std::size_t i) {
                                     return dnorm(i) * ((inp_bt[i] - mean_bt) * rstd_bt);
                                   }) / Real(C);
      Real* part_dbias = sum_dbias.part();
      Real* part_dweight = sum_dweight.part();
      for (std::size_t i = 0; i < C; ++i) {
        const Real norm = (inp_bt[i] - mean_bt) * rstd_bt;
        part_dbias[i] += dout_bt[i];
        part_dweight[i] += norm * dout_bt[i];
        dinp_bt[i] += (dnorm(i) - dnorm_mean - norm * dnorm_norm_mean) * rstd_bt;
      }
      sum_dbias.end_row(b * T + t);
      sum_dweight.end_row(b * T + t);
    }
  sum_dbias.add_to(dbias);
  sum_dweight.add_to(dweight);
}

// out[b,t,o] = bias[o] + sum_i inp[b,t,i] * weight[o,i]; weight is (OC, C); bias may be null.
// The dot product is an `omp simd` reduction: vectorised, its summation order fixed by the build (so results do not
// depend on the thread count), but not the sequential order.
template <class Real>
void matmul_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, std::size_t B, std::size_t T,
                    std::size_t C, std::size_t OC) {
  if constexpr (std::is_same_v<Real, float>)
    if (const auto* engine = installed_matmul_engine()) return engine->forward(out, inp, weight, bias, B * T, C, OC);
#pragma omp parallel for collapse(2)
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      const Real* inp_bt = inp + (b * T + t) * C;
      Real* out_bt = out + (b * T + t) * OC;
      for (std::size_t o = 0; o < OC; ++o) {
        const Real* w_o = weight + o * C;
        Real dot = 0;
#pragma omp simd reduction(+ : dot)
        for (std::size_t i = 0; i < C; ++i) dot += inp_bt[i] * w_o[i];
        out_bt[o] = (bias != nullptr ? bias[o] : Real(0)) + dot;
      }
    }
}

// Two passes, each parallel over outputs it alone writes: dinp over (b, t), then dweight and dbias over o.
template <class Real>
void matmul_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp, const Real* weight,
                     std::size_t B, std::size_t T, std::size_t C, std::size_t OC) {
  if constexpr (std::is_same_v<Real, float>)
    if (const auto* engine = installed_matmul_engine())
      return engine->backward(dinp, dweight, dbias, dout, inp, weight, B * T, C, OC);
#pragma omp parallel for collapse(2)
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      const Real* dout_bt = dout + (b * T + t) * OC;
      Real* dinp_bt = dinp + (b * T + t) * C;
      for (std::size_t o = 0; o < OC; ++o) {
        const Real* w_o = weight + o * C;
        const Real d = dout_bt[o];
        for (std::size_t i = 0; i < C; ++i) dinp_bt[i] += w_o[i] * d;
      }
    }
#pragma omp parallel for
  for (std::size_t o = 0; o < OC; ++o) {
    Real* dw_o = dweight + o * C;
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < T; ++t) {
        const Real* inp_bt = inp + (b * T + t) * C;
        const Real d = dout[(b * T + t) * OC + o];
        for (std::size_t i = 0; i < C; ++i) dw_o[i] += inp_bt[i] * d;
      }
  }
  if (dbias != nullptr) add_column_sums(dbias, dout, B * T, OC);
}

// y[i] += x[i] * a for i < n: the attention's inner loops, vectorised (y and x never overlap).
template <class Real>
void add_scaled(Real* __restrict y, const Real* __restrict x, Real a, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i] * a;
}

// The channels of one head's keys or values (part 1 or 2 of qkv) for every position, transposed to (hs, T): a
// query's dot products with all keys then vectorise over the keys, each still summed over the channels in order.
template <class Real>
std::vector<Real> head_transposed(const Real* inp, std::size_t b, std::size_t h, std::size_t part, std::size_t T,
                                  std::size_t C, std::size_t hs) {
  std::vector<Real> transposed(hs * T);
  for (std::size_t t = 0; t < T; ++t) {
    const Real* row = inp + (b * T + t) * 3 * C + part * C + h * hs;
    for (std::size_t i = 0; i < hs; ++i) transposed[i * T + t] = row[i];
  }
  return transposed;
}

// Causal multi-head self-attention. inp is qkv (B, T, 3C): query, key, value at channel offsets 0, C, 2C, each split
// into NH heads of hs = C / NH channels. att is (B, NH, T, T): the scores, then in place their softmax (backward reads
// only that); only t2 <= t is written (the rest stays 0).
// Parallel over (b, h). Every element is summed in llm.c's order (the device functors' too), only the loops are
// arranged so that the inner one runs over independent elements.
template <class Real>
void attention_forward(Real* out, Real* att, const Real* inp, std::size_t B, std::size_t T, std::size_t C,
                       std::size_t NH) {
  const std::size_t C3 = 3 * C, hs = C / NH;
  const Real scale = Real(1) / std::sqrt(Real(hs));
#pragma omp parallel for collapse(2)
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < NH; ++h) {
      const std::vector<Real> keys = head_transposed(inp, b, h, 1, T, C, hs);
      for (std::size_t t = 0; t < T; ++t) {
        const Real* query = inp + (b * T + t) * C3 + h * hs;
        Real* att_bth = att + ((b * NH + h) * T + t) * T;

        // 1: scores q.k / sqrt(hs) and their maximum
        std::fill(att_bth, att_bth + t + 1, Real(0));
        for (std::size_t i = 0; i < hs; ++i) add_scaled(att_bth, keys.data() + i * T, query[i], t + 1);
        Real maxval = -std::numeric_limits<Real>::infinity();
        for (std::size_t t2 = 0; t2 <= t; ++t2) {
          att_bth[t2] *= scale;
          maxval = std::max(maxval, att_bth[t2]);
        }
        // 2: softmax over t2 <= t, in place (the causal mask: later positions get weight 0)
        Real expsum = 0;
        for (std::size_t t2 = 0; t2 <= t; ++t2) {
          const Real e = std::exp(att_bth[t2] - maxval);
          expsum += e;
          att_bth[t2] = e;
        }
        for (std::size_t t2 = 0; t2 <= t; ++t2) att_bth[t2] /= expsum;
        // 3: weighted sum of the values
        Real* out_bth = out + (b * T + t) * C + h * hs;
        std::fill(out_bth, out_bth + hs, Real(0));
        for (std::size_t t2 = 0; t2 <= t; ++t2)
          add_scaled(out_bth, inp + (b * T + t2) * C3 + h * hs + 2 * C, att_bth[t2], hs);
      }
    }
}

// Parallel over (b, h): each pair owns its slice of dinp (the head's channels) and of datt.
// The softmax backward uses dpreatt[t3] = att[t3] * (datt[t3] - sum_t2 att[t2] * datt[t2]), O(T) per row, the
// same sum llm.c's double loop computes, and writes it over datt's row once the row's sum is taken (llm.c keeps
// both arrays: B*NH*T*T more).
template <class Real>
void attention_backward(Real* dinp, Real* datt, const Real* dout, const Real* inp, const Real* att, std::size_t B,
                        std::size_t T, std::size_t C, std::size_t NH) {
  const std::size_t C3 = 3 * C, hs = C / NH;
  const Real scale = Real(1) / std::sqrt(Real(hs));
#pragma omp parallel for collapse(2)
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < NH; ++h) {
      const std::vector<Real> values = head_transposed(inp, b, h, 2, T, C, hs);
      for (std::size_t t = 0; t < T; ++t) {
        const Real* att_bth = att + ((b * NH + h) * T + t) * T;
        Real* datt_bth = datt + ((b * NH + h) * T + t) * T;
        const Real* dout_bth = dout + (b * T + t) * C + h * hs;
        const Real* query = inp + (b * T + t) * C3 + h * hs;
        Real* dquery = dinp + (b * T + t) * C3 + h * hs;

        // 3: the weighted sum of values: datt[t2] += v(t2) . dout(t), dv(t2) += att[t2] * dout(t)
        for (std::size_t i = 0; i < hs; ++i) add_scaled(datt_bth, values.data() + i * T, dout_bth[i], t + 1);
        for (std::size_t t2 = 0; t2 <= t; ++t2)
          add_scaled(dinp + (b * T + t2) * C3 + h * hs + 2 * C, dout_bth, att_bth[t2], hs);
        // 2: the softmax
        Real weighted = 0;
        for (std::size_t t2 = 0; t2 <= t; ++t2) weighted += att_bth[t2] * datt_bth[t2];
        Real* dpreatt_bth = datt_bth;  // in place
        for (std::size_t t2 = 0; t2 <= t; ++t2) dpreatt_bth[t2] = att_bth[t2] * (datt_bth[t2] - weighted);
        // 1: the scores: dq(t) += k(t2) * d, dk(t2) += q(t) * d
        for (std::size_t t2 = 0; t2 <= t; ++t2) {
          const Real d = dpreatt_bth[t2] * scale;
          add_scaled(dquery, inp + (b * T + t2) * C3 + h * hs + C, d, hs);
          add_scaled(dinp + (b * T + t2) * C3 + h * hs + C, query, d, hs);
        }
      }
    }
}

// tanh for GELU: in float gelu_math's, which vectorises (and which the device functors share); libm's in double,
// where the gradient test checks the maths against finite differences.
template <class Real>
Real gelu_tanh(Real u) {
  if constexpr (std::is_same_v<Real, float>)
    return gelu_math::tanh_approx(u);
  else
    return std::tanh(u);
}

// GELU, tanh approximation (as GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class Real>
void gelu_forward(Real* out, const Real* inp, std::size_t N) {
  const Real scaling = std::sqrt(Real(2) / Real(3.14159265358979323846));
#pragma omp parallel for
  for (std::size_t i = 0; i < N; ++i) {
    const Real x = inp[i];
    const Real cube = Real(0.044715) * x * x * x;
    out[i] = Real(0.5) * x * (Real(1) + gelu_tanh(scaling * (x + cube)));
  }
}

template <class Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, std::size_t N) {
  const Real scaling = std::sqrt(Real(2) / Real(3.14159265358979323846));
#pragma omp parallel for
  for (std::size_t i = 0; i < N; ++i) {
    const Real x = inp[i];
    const Real cube = Real(0.044715) * x * x * x;
    const Real tanh_out = gelu_tanh(scaling * (x + cube));
    const Real sech2 = Real(1) - tanh_out * tanh_out;  // 1 / cosh^2
    const Real local_grad = Real(0.5) * (Real(1) + tanh_out) +
                            x * Real(0.5) * sech2 * scaling * (Real(1) + Real(3) * Real(0.044715) * x * x);
    dinp[i] += local_grad * dout[i];
  }
}

template <class Real>
void residual_forward(Real* out, const Real* inp1, const Real* inp2, std::size_t N) {
#pragma omp parallel for
  for (std::size_t i = 0; i < N; ++i) out[i] = inp1[i] + inp2[i];
}

template <class Real>
void residual_backward(Real* dinp1, Real* dinp2, const Real* dout, std::size_t N) {
#pragma omp parallel for
  for (std::size_t i = 0; i < N; ++i) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

// In place: logits[b,t,:V] becomes softmax(logits[b,t,:V]) over the V tokens; rows have Vp >= V columns, the padded
// ones' probabilities 0.
template <class Real>
void softmax_forward(Real* logits, std::size_t B, std::size_t T, std::size_t V, std::size_t Vp) {
#pragma omp parallel for collapse(2)
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      Real* row = logits + (b * T + t) * Vp;
      std::fill(row + V, row + Vp, Real(0));
      Real maxval = -std::numeric_limits<Real>::infinity();
      for (std::size_t i = 0; i < V; ++i) maxval = std::max(maxval, row[i]);
      const Real sum = segmented_sum<Real>(V, softmax_segment, [&](std::size_t i) {
        row[i] = std::exp(row[i] - maxval);
        return row[i];
      });
      for (std::size_t i = 0; i < V; ++i) row[i] /= sum;
    }
}

// losses[b,t] = -log probs[b,t,target[b,t]] (rows of Vp columns)
template <class Real>
void crossentropy_forward(Real* losses, const Real* probs, const int* targets, std::size_t B, std::size_t T,
                          std::size_t Vp) {
  for (std::size_t bt = 0; bt < B * T; ++bt)
    losses[bt] = -std::log(probs[bt * Vp + static_cast<std::size_t>(targets[bt])]);
}

// Softmax and cross-entropy together, in place (the one backward kernel that overwrites: nothing else reads the
// probabilities): probs becomes dlogits = (probs - onehot(target)) * dloss, with dloss = 1 / (B*T) for every
// position (the loss is the mean). Rows of Vp columns; the padded columns past V keep their 0.
template <class Real>
void crossentropy_softmax_backward(Real* probs, const int* targets, Real dloss, std::size_t B, std::size_t T,
                                   std::size_t V, std::size_t Vp) {
#pragma omp parallel for collapse(2)
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      Real* row = probs + (b * T + t) * Vp;
      const std::size_t target = static_cast<std::size_t>(targets[b * T + t]);
      for (std::size_t i = 0; i < V; ++i) {
        const Real indicator = i == target ? Real(1) : Real(0);
        row[i] = (row[i] - indicator) * dloss;
      }
    }
}

template <class Real>
void zero(std::span<Real> buffer) {
  std::fill(buffer.begin(), buffer.end(), Real(0));
}

}  // namespace kernels

// ----------------------------------------------------------------------------------------------------------------
// Forward passes

/// Pass "embed": acts.encoded = wte[tokens] + wpe. tokens: (B, T) token ids in [0, V).
template <class Real>
void embed_forward(const Real* wte, const Real* wpe, const int* tokens, activations<Real>& acts) {
  kernels::check_tokens(tokens, acts.B * acts.T, acts.V, "tokens");
  kernels::encoder_forward(acts.encoded.data(), tokens, wte, wpe, acts.B, acts.T, acts.C);
}

/// Pass "h.<layer>": one transformer block on the residual stream (acts.encoded for layer 0, else the output of
/// layer - 1), writing the layer's slice of every per-layer activation.
template <class Real>
void layer_forward(std::size_t layer, const layer_params<Real>& p, activations<Real>& acts) {
  const std::size_t B = acts.B, T = acts.T, C = acts.C, NH = acts.NH;
  const std::size_t BT = B * T, BTC = B * T * C, l = layer, s = acts.slot(layer);
  const Real* residual = l == 0 ? acts.encoded.data() : acts.residual3.data() + (l - 1) * BTC;
  Real* ln1 = acts.ln1.data() + s * BTC;
  Real* ln1_mean = acts.ln1_mean.data() + s * BT;
  Real* ln1_rstd = acts.ln1_rstd.data() + s * BT;
  Real* qkv = acts.qkv.data() + s * BTC * 3;
  Real* atty = acts.atty.data() + s * BTC;
  Real* att = acts.att.data() + s * B * NH * T * T;
  Real* attproj = acts.attproj.data() + s * BTC;
  Real* residual2 = acts.residual2.data() + s * BTC;
  Real* ln2 = acts.ln2.data() + s * BTC;
  Real* ln2_mean = acts.ln2_mean.data() + s * BT;
  Real* ln2_rstd = acts.ln2_rstd.data() + s * BT;
  Real* fch = acts.fch.data() + s * BTC * 4;
  Real* fch_gelu = acts.fch_gelu.data() + s * BTC * 4;
  Real* fcproj = acts.fcproj.data() + s * BTC;
  Real* residual3 = acts.residual3.data() + l * BTC;

  using namespace kernels;
  layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p[ln_1_weight], p[ln_1_bias], B, T, C);
  matmul_forward(qkv, ln1, p[attn_c_attn_weight], p[attn_c_attn_bias], B, T, C, 3 * C);
  attention_forward(atty, att, qkv, B, T, C, NH);
  matmul_forward(attproj, atty, p[attn_c_proj_weight], p[attn_c_proj_bias], B, T, C, C);
  residual_forward(residual2, residual, attproj, BTC);
  layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p[ln_2_weight], p[ln_2_bias], B, T, C);
  matmul_forward(fch, ln2, p[mlp_c_fc_weight], p[mlp_c_fc_bias], B, T, C, 4 * C);
  gelu_forward(fch_gelu, fch, BTC * 4);
  matmul_forward(fcproj, fch_gelu, p[mlp_c_proj_weight], p[mlp_c_proj_bias], B, T, 4 * C, C);
  residual_forward(residual3, residual2, fcproj, BTC);
}

/// Pass "head": final LayerNorm, logits = lnf @ wte^T (the tied LM head), softmax, cross-entropy against targets
/// (B, T). Returns the mean loss over the B*T positions (summed in double).
template <class Real>
Real head_forward(const Real* ln_f_weight, const Real* ln_f_bias, const Real* wte, const int* targets,
                  activations<Real>& acts) {
  const std::size_t B = acts.B, T = acts.T, C = acts.C, V = acts.V, Vp = acts.Vp;
  kernels::check_tokens(targets, B * T, V, "targets");
  const Real* residual = acts.residual3.data() + (acts.L - 1) * B * T * C;
  using namespace kernels;
  layernorm_forward(acts.lnf.data(), acts.lnf_mean.data(), acts.lnf_rstd.data(), residual, ln_f_weight, ln_f_bias, B,
                    T, C);
  matmul_forward(acts.logits.data(), acts.lnf.data(), wte, static_cast<const Real*>(nullptr), B, T, C, Vp);
  softmax_forward(acts.logits.data(), B, T, V, Vp);  // now the probabilities
  crossentropy_forward(acts.losses.data(), acts.logits.data(), targets, B, T, Vp);
  double sum = 0;
  for (const Real loss : acts.losses) sum += static_cast<double>(loss);
  return static_cast<Real>(sum / static_cast<double>(B * T));
}

// ----------------------------------------------------------------------------------------------------------------
// Backward passes (after the forward passes of the same batch; gradients of parameters accumulate)

/// Pass "head", backward: from the mean loss back to acts.dresidual's slice L; accumulates into the gradients of
/// ln_f.weight, ln_f.bias and wte (the head's share of the tied embedding).
template <class Real>
void head_backward(const Real* ln_f_weight, const Real* wte, Real* d_ln_f_weight, Real* d_ln_f_bias, Real* d_wte,
                   const int* targets, activations<Real>& acts) {
  const std::size_t B = acts.B, T = acts.T, C = acts.C, V = acts.V, Vp = acts.Vp, BTC = B * T * C;
  using namespace kernels;
  check_tokens(targets, B * T, V, "targets");
  zero(acts.dlnf);
  Real* dresidual = acts.dresidual.data() + acts.dresidual_offset(acts.L);
  std::fill(dresidual, dresidual + BTC, Real(0));
  const Real* residual = acts.residual3.data() + (acts.L - 1) * BTC;

  const Real dloss = Real(1) / Real(B * T);
  Real* dlogits = acts.logits.data();  // the probabilities forward left there, replaced
  crossentropy_softmax_backward(dlogits, targets, dloss, B, T, V, Vp);
  matmul_backward(acts.dlnf.data(), d_wte, static_cast<Real*>(nullptr), dlogits, acts.lnf.data(), wte, B, T, C, Vp);
  layernorm_backward(dresidual, d_ln_f_weight, d_ln_f_bias, acts.dlnf.data(), residual, ln_f_weight,
                     acts.lnf_mean.data(), acts.lnf_rstd.data(), B, T, C);
}

/// Pass "h.<layer>", backward: from acts.dresidual's slice layer + 1 (the gradient of the layer's output) to slice
/// layer (its input); accumulates into the layer's 12 gradients.
template <class Real>
void layer_backward(std::size_t layer, const layer_params<Real>& p, const layer_grads<Real>& g,
                    activations<Real>& acts) {
  const std::size_t B = acts.B, T = acts.T, C = acts.C, NH = acts.NH;
  const std::size_t BT = B * T, BTC = B * T * C, l = layer, s = acts.slot(layer);
  const Real* residual = l == 0 ? acts.encoded.data() : acts.residual3.data() + (l - 1) * BTC;
  const Real* ln1 = acts.ln1.data() + s * BTC;
  const Real* ln1_mean = acts.ln1_mean.data() + s * BT;
  const Real* ln1_rstd = acts.ln1_rstd.data() + s * BT;
  const Real* qkv = acts.qkv.data() + s * BTC * 3;
  const Real* atty = acts.atty.data() + s * BTC;
  const Real* att = acts.att.data() + s * B * NH * T * T;
  const Real* residual2 = acts.residual2.data() + s * BTC;
  const Real* ln2 = acts.ln2.data() + s * BTC;
  const Real* ln2_mean = acts.ln2_mean.data() + s * BT;
  const Real* ln2_rstd = acts.ln2_rstd.data() + s * BT;
  const Real* fch = acts.fch.data() + s * BTC * 4;
  const Real* fch_gelu = acts.fch_gelu.data() + s * BTC * 4;
  const Real* dresidual3 = acts.dresidual.data() + acts.dresidual_offset(l + 1);  // d(output of this layer)
  Real* dresidual = acts.dresidual.data() + acts.dresidual_offset(l);               // d(input of this layer)

  using namespace kernels;
  for (auto* buffer : {&acts.dln1, &acts.dqkv, &acts.datty, &acts.datt, &acts.dattproj,
                       &acts.dresidual2, &acts.dln2, &acts.dfch, &acts.dfch_gelu, &acts.dfcproj})
    zero(*buffer);
  std::fill(dresidual, dresidual + BTC, Real(0));

  // The forward of layer_forward, undone in reverse.
  residual_backward(acts.dresidual2.data(), acts.dfcproj.data(), dresidual3, BTC);
  matmul_backward(acts.dfch_gelu.data(), g[mlp_c_proj_weight], g[mlp_c_proj_bias], acts.dfcproj.data(), fch_gelu,
                  p[mlp_c_proj_weight], B, T, 4 * C, C);
  gelu_backward(acts.dfch.data(), fch, acts.dfch_gelu.data(), BTC * 4);
  matmul_backward(acts.dln2.data(), g[mlp_c_fc_weight], g[mlp_c_fc_bias], acts.dfch.data(), ln2, p[mlp_c_fc_weight],
                  B, T, C, 4 * C);
  layernorm_backward(acts.dresidual2.data(), g[ln_2_weight], g[ln_2_bias], acts.dln2.data(), residual2,
                     p[ln_2_weight], ln2_mean, ln2_rstd, B, T, C);
  residual_backward(dresidual, acts.dattproj.data(), acts.dresidual2.data(), BTC);
  matmul_backward(acts.datty.data(), g[attn_c_proj_weight], g[attn_c_proj_bias], acts.dattproj.data(), atty,
                  p[attn_c_proj_weight], B, T, C, C);
  attention_backward(acts.dqkv.data(), acts.datt.data(), acts.datty.data(), qkv, att, B, T, C, NH);
  matmul_backward(acts.dln1.data(), g[attn_c_attn_weight], g[attn_c_attn_bias], acts.dqkv.data(), ln1,
                  p[attn_c_attn_weight], B, T, C, 3 * C);
  layernorm_backward(dresidual, g[ln_1_weight], g[ln_1_bias], acts.dln1.data(), residual, p[ln_1_weight], ln1_mean,
                     ln1_rstd, B, T, C);
}

/// Pass "embed", backward: accumulates acts.dresidual's slice 0 into the gradients of wte (the embedding's share
/// of the tied tensor) and wpe.
template <class Real>
void embed_backward(Real* d_wte, Real* d_wpe, const int* tokens, activations<Real>& acts) {
  kernels::check_tokens(tokens, acts.B * acts.T, acts.V, "tokens");
  kernels::encoder_backward(d_wte, d_wpe, acts.dresidual.data() + acts.dresidual_offset(0), tokens, acts.B, acts.T,
                            acts.C);
}

}  // namespace gpt2
