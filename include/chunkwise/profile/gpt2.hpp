#pragma once
// Analytic, constexpr model profile of GPT-2 (and larger GPT-style models with the same block structure).
//
// Parameters, per the published GPT-2 (Radford et al. 2019; Hugging Face names), in first-use order:
//   wte [V, C] (tied: also the LM head), wpe [T, C],
//   per layer h.l: ln_1.{weight,bias} [C], attn.c_attn.{weight [C,3C], bias [3C]}, attn.c_proj.{weight [C,C], bias [C]},
//                  ln_2.{weight,bias} [C], mlp.c_fc.{weight [C,4C], bias [4C]}, mlp.c_proj.{weight [4C,C], bias [C]},
//   ln_f.{weight,bias} [C].
//   Total V*C + T*C + L*(12*C^2 + 13*C) + 2*C: 124,439,808 for gpt2_124m, 1,557,611,200 for gpt2_1558m.
//
// Activations, in elements, as llm.c's train_gpt2.c keeps them for backward (our example trainer keeps the same):
//   embed:    B*T*C                                         (encoded)
//   layer:    B*T*(18*C + 4) + B*H*T*T                     (ln1, qkv, atty, attproj, residual2, ln2, fch, fch_gelu,
//                                                           fcproj, residual3 = 18*C per token; 4 layer-norm stats;
//                                                           the attention weights, H*T*T per sequence, computed in
//                                                           place of the scores: llm.c keeps both)
//   head:     B*T*(C + 2) + B*T*V + B*T                     (lnf and its stats, the logits, which the softmax
//                                                           turns into the probabilities in place, losses)
// With flash_attention the H*T*T score matrices are not kept (B*H*T softmax statistics are), as FlashAttention does.
// With recompute (activation checkpointing per layer) a layer keeps only its output, B*T*C, and its backward pass
// recomputes the layer first, in one slot of a layer's other activations (B*T*(17*C + 4) + the scores) that every
// pass holds; it does the forward FLOPs once more.
// A forward pass holds everything saved so far. A backward pass holds what is still saved plus backward's workspace,
// held from the head's backward pass to the embedding's: the gradient of the residual stream in two alternating
// slices (2*B*T*C), and in the same memory one layer's activation gradients (B*T*17*C + the scores') or the head's
// dlnf (B*T*C): no pass uses both (the head's dlogits replace the probabilities in place, as llm.c's CUDA trainer
// does; its CPU trainer keeps logits, probs and dlogits, 3*B*T*V). The peak is the head's backward pass:
// all saved, the slot and the workspace, the memory the example trainer allocates (examples/train_gpt2:
// activations<float>). Times size_of(dtype) bytes.
//
// FLOPs (a multiply-add is two), forward, as llm.c counts them: per layer 2*B*T*12*C^2 for the four matrix products
// plus 2*2*B*T*T*C for the attention scores and their weighted sum (computed for the full square, as llm.c does);
// the LM head 2*B*T*C*V; the embedding and layer norms are counted as zero. Backward is twice forward.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/tensor_spec.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace chunkwise {

struct gpt2_config {
  tensor_name name;
  std::uint32_t layers = 12;
  std::uint32_t d_model = 768;
  std::uint32_t heads = 12;
  std::uint32_t vocab = 50257;
  std::uint32_t context = 1024;
  std::uint32_t micro_batch = 4;
  dtype type = dtype::fp32;
  bool flash_attention = false;  // attention scores not kept for backward
  bool recompute = false;        // per-layer activation checkpointing

  [[nodiscard]] constexpr std::uint64_t parameter_count() const noexcept {
    const std::uint64_t c = d_model;
    return std::uint64_t{vocab} * c + std::uint64_t{context} * c + std::uint64_t{layers} * (12 * c * c + 13 * c) +
           2 * c;
  }
};

// Micro-batches of the published sizes: what fits a 24 GiB card with llm.c's fp32 activations.
inline constexpr gpt2_config gpt2_124m{"gpt2-124m", 12, 768, 12, 50257, 1024, 4};
inline constexpr gpt2_config gpt2_355m{"gpt2-355m", 24, 1024, 16, 50257, 1024, 4};
inline constexpr gpt2_config gpt2_774m{"gpt2-774m", 36, 1280, 20, 50257, 1024, 2};
inline constexpr gpt2_config gpt2_1558m{"gpt2-1558m", 48, 1600, 25, 50257, 1024, 1};
// Larger GPT-style sizes for planning (same block; GPT-NeoX-20B's depth and width for the largest).
// Trained as such models are: bf16, FlashAttention, per-layer activation checkpointing.
inline constexpr gpt2_config gpt_4b{"gpt-4b", 32, 3200, 25, 50257, 2048, 1, dtype::bf16, true, true};
inline constexpr gpt2_config gpt_10b{"gpt-10b", 48, 4096, 32, 50257, 2048, 1, dtype::bf16, true, true};
inline constexpr gpt2_config gpt_20b{"gpt-20b", 44, 6144, 48, 50257, 2048, 1, dtype::bf16, true, true};

inline constexpr std::array<gpt2_config, 7> gpt2_configs{gpt2_124m,  gpt2_355m, gpt2_774m, gpt2_1558m,
                                                         gpt_4b,     gpt_10b,   gpt_20b};

/// The named config ("gpt2-355m", "gpt-20b"); throws error_code::invalid_argument listing the known names.
inline gpt2_config find_gpt2_config(std::string_view name) {
  for (const auto& config : gpt2_configs)
    if (config.name.view() == name) return config;
  std::string known;
  for (const auto& config : gpt2_configs) known += (known.empty() ? "" : ", ") + config.name.str();
  detail::raise(error_code::invalid_argument, "unknown model '" + std::string(name) + "'; known models: " + known);
}

namespace detail {
/// "h.<layer>.<suffix>", or the layer's label "h.<layer>" for an empty suffix.
constexpr tensor_name layer_tensor_name(std::uint32_t layer, std::string_view suffix) {
  std::array<char, tensor_name::capacity> text{};
  std::size_t length = 0;
  text[length++] = 'h';
  text[length++] = '.';
  std::array<char, 10> digits{};
  std::size_t count = 0;
  do {
    digits[count++] = static_cast<char>('0' + layer % 10);
    layer /= 10;
  } while (layer != 0);
  while (count != 0) text[length++] = digits[--count];
  if (!suffix.empty()) text[length++] = '.';
  for (const char c : suffix) text[length++] = c;
  return tensor_name(std::string_view(text.data(), length));
}
}  // namespace detail

/// The profile of one training iteration (forward then backward) of `config`, parameters only.
constexpr model_profile gpt2_profile(const gpt2_config& config) {
  if (config.layers == 0 || config.d_model == 0 || config.heads == 0 || config.vocab == 0 || config.context == 0 ||
      config.micro_batch == 0)
    detail::raise(error_code::invalid_argument, "GPT-2 config '" + config.name.str() +
                                                    "' has a zero dimension; layers, d_model, heads, vocab, context "
                                                    "and micro_batch must all be positive");
  if (config.d_model % config.heads != 0)
    detail::raise(error_code::invalid_argument, "GPT-2 config '" + config.name.str() + "': d_model " +
                                                    std::to_string(config.d_model) + " is not divisible by heads " +
                                                    std::to_string(config.heads));
  const std::uint64_t c = config.d_model, v = config.vocab, t = config.context, b = config.micro_batch,
                      h = config.heads;
  const byte_count element = size_of(config.type);
  const byte_count embed_acts = b * t * c * element;
  const byte_count layer_acts =
      (b * t * (18 * c + 4) + (config.flash_attention ? b * h * t : b * h * t * t)) * element;
  const byte_count saved_per_layer = config.recompute ? b * t * c * element : layer_acts;
  const byte_count slot = config.recompute ? layer_acts - b * t * c * element : 0;  // where a layer is recomputed
  const byte_count head_acts = (b * t * (c + 2) + b * t * v + b * t) * element;
  // Backward's workspace: two alternating slices of the residual stream's gradient, and one block's activation
  // gradients or, in the same memory, the head's dlnf (B*T*C, the smaller), as no pass uses both. The attention's
  // score gradients are one (B, H, T, T) array: the softmax's backward overwrites the weights' gradients in place.
  const byte_count block_gradients = 17 * b * t * c + (config.flash_attention ? b * h * t : b * h * t * t);
  const byte_count backward_workspace = (2 * b * t * c + block_gradients) * element;
  const std::uint64_t layer_flops = 2 * b * t * 12 * c * c + 4 * b * t * t * c;
  const std::uint64_t head_flops = 2 * b * t * c * v;

  model_profile model;
  model.name = config.name;
  model.tensors.reserve(2 + 12 * std::size_t{config.layers} + 2);
  model.passes.reserve(2 * std::size_t{config.layers} + 4);
  auto add = [&](tensor_name name, std::uint64_t elements, bool tied = false) {
    model.tensors.push_back(tensor_spec{name, elements, config.type, tensor_role::parameter, tied});
    return static_cast<std::uint32_t>(model.tensors.size() - 1);
  };
  const std::uint32_t wte = add("wte", v * c, /*tied=*/true);
  const std::uint32_t wpe = add("wpe", t * c);
  model.passes.push_back(profile_pass{"embed", pass_kind::forward, {wte, wpe}, embed_acts + slot});

  constexpr std::array<std::string_view, 12> suffixes{
      "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
      "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  const std::array<std::uint64_t, 12> sizes{c, c, c * 3 * c, 3 * c, c * c, c, c, c, c * 4 * c, 4 * c, 4 * c * c, c};
  std::vector<profile_pass> backward;
  for (std::uint32_t layer = 0; layer < config.layers; ++layer) {
    profile_pass pass{detail::layer_tensor_name(layer, ""), pass_kind::forward, {}, 0};
    for (std::size_t i = 0; i < suffixes.size(); ++i)
      pass.tensors.push_back(add(detail::layer_tensor_name(layer, suffixes[i]), sizes[i]));
    pass.activation_bytes = embed_acts + (layer + 1) * saved_per_layer + slot;
    pass.flops = layer_flops;
    model.passes.push_back(pass);
  }
  const std::uint32_t ln_f_weight = add("ln_f.weight", c);
  const std::uint32_t ln_f_bias = add("ln_f.bias", c);
  const byte_count all_saved = embed_acts + config.layers * saved_per_layer + head_acts;
  model.passes.push_back(
      profile_pass{"head", pass_kind::forward, {ln_f_weight, ln_f_bias, wte}, all_saved + slot, head_flops});

  // Backward: head, layers in reverse, embedding. A pass's saved activations are freed after it runs.
  model.passes.push_back(profile_pass{"head", pass_kind::backward, {ln_f_weight, ln_f_bias, wte},
                                      all_saved + slot + backward_workspace, 2 * head_flops});
  for (std::uint32_t layer = config.layers; layer-- > 0;) {
    profile_pass pass = model.passes[1 + layer];
    pass.kind = pass_kind::backward;
    pass.activation_bytes = embed_acts + (layer + 1) * saved_per_layer + slot + backward_workspace;
    pass.flops = (config.recompute ? 3 : 2) * layer_flops;
    model.passes.push_back(pass);
  }
  model.passes.push_back(
      profile_pass{"embed", pass_kind::backward, {wte, wpe}, embed_acts + slot + backward_workspace});
  return model;
}

}  // namespace chunkwise
