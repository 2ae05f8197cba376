#pragma once
// llm.c's files, so its users can bring their models and data (Andrej Karpathy's llm.c, MIT licence; the formats
// are those its train_gpt2.py writes and train_gpt2.c / train_gpt2.cu read):
//
//   checkpoint   256 int32 header: [0] 20240326, [1] version (3: fp32 parameters, 5: bf16), [2] maxT, [3] V,
//                [4] L, [5] NH, [6] C, [7] Vp (V padded to a multiple of 128); then every parameter, by kind
//                across the layers: wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C),
//                qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w (L, C), ln2b (L, C), fcw (L, 4C, C),
//                fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C), lnfw (C), lnfb (C).
//   token shard  256 int32 header: [0] 20240520, [1] 1, [2] the token count; then the tokens as uint16.
//
// Our tensors are the same arrays, ordered by layer (gpt2_model.hpp's parameter_tensors), so a checkpoint maps onto
// them by slicing. A checkpoint is read into the model's shape: the same L, NH, C, V and Vp, and a context of at
// most maxT (wpe's first rows; llm.c itself runs shorter sequences that way). Every mismatch is an error naming both
// sides. Files are written atomically (chunkwise::write_file_atomically).
#include "gpt2_model.hpp"

#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace gpt2::llmc {

inline constexpr std::int32_t checkpoint_magic = 20240326, shard_magic = 20240520;
inline constexpr std::size_t header_ints = 256;

/// The shape a checkpoint's header records.
struct checkpoint_shape {
  int version = 3;  // 3: fp32, 5: bf16
  std::size_t max_context = 0, vocab = 0, layers = 0, heads = 0, channels = 0, padded_vocab = 0;
};

namespace detail {

[[noreturn]] inline void fail(chunkwise::error_code code, const std::filesystem::path& path, const std::string& why) {
  throw chunkwise::error(code, "llm.c file '" + path.string() + "': " + why);
}

inline std::vector<char> read_all(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(chunkwise::error_code::io_error, path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<char> bytes{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  if (file.bad()) fail(chunkwise::error_code::io_error, path, "reading failed");
  return bytes;
}

inline std::array<std::int32_t, header_ints> header_of(const std::vector<char>& bytes,
                                                       const std::filesystem::path& path) {
  std::array<std::int32_t, header_ints> header{};
  if (bytes.size() < sizeof(header))
    fail(chunkwise::error_code::invalid_argument, path,
         std::to_string(bytes.size()) + " bytes, shorter than the 1024-byte header");
  std::memcpy(header.data(), bytes.data(), sizeof(header));
  return header;
}

/// One kind of llm.c's parameter arrays: which of our tensors it covers (one per layer, or one) and their size.
struct kind {
  std::size_t tensor_of_layer0;  // our index for layer 0 (or the tensor itself when not per layer)
  std::size_t elements;          // per layer (or in all)
  bool per_layer;
  /// Our tensor holding this kind's slice of layer l.
  [[nodiscard]] std::size_t tensor(std::size_t l) const noexcept {
    return tensor_of_layer0 + (per_layer ? l * std::size_t{layer_tensor_count} : 0);
  }
  [[nodiscard]] std::size_t layers(const model_config& config) const noexcept { return per_layer ? config.layers : 1; }
};

/// llm.c's arrays in file order, as slices of our tensors.
inline std::vector<kind> kinds(const model_config& config, std::size_t max_context) {
  const std::size_t c = config.channels;
  const auto sizes = layer_tensor_sizes(config);
  std::vector<kind> order{{wte_index, config.vocab_rows() * c, false}, {wpe_index, max_context * c, false}};
  for (std::size_t t = 0; t < layer_tensor_count; ++t)
    order.push_back({layer_tensor_index(0, static_cast<layer_tensor>(t)), sizes[t], true});
  order.push_back({ln_f_weight_index(config), c, false});
  order.push_back({ln_f_bias_index(config), c, false});
  return order;
}

}  // namespace detail

/// The header of the checkpoint at `path` (validated: magic, version, positive sizes).
inline checkpoint_shape read_checkpoint_shape(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) detail::fail(chunkwise::error_code::io_error, path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<char> head(header_ints * sizeof(std::int32_t));
  file.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(file.gcount()));
  const auto h = detail::header_of(head, path);
  if (h[0] != checkpoint_magic)
    detail::fail(chunkwise::error_code::invalid_argument, path,
                 "magic " + std::to_string(h[0]) + " is not llm.c's checkpoint magic " +
                     std::to_string(checkpoint_magic) + " (a token shard starts with " + std::to_string(shard_magic) +
                     ": pass it to --data)");
  if (h[1] != 3 && h[1] != 5)
    detail::fail(chunkwise::error_code::unsupported, path,
                 "version " + std::to_string(h[1]) + "; llm.c writes 3 (fp32) and 5 (bf16), and those are read");
  for (int i = 2; i <= 7; ++i)
    if (h[static_cast<std::size_t>(i)] <= 0)
      detail::fail(chunkwise::error_code::invalid_argument, path,
                   "header field " + std::to_string(i) + " is " + std::to_string(h[static_cast<std::size_t>(i)]) +
                       "; maxT, V, L, NH, C and Vp must be positive");
  checkpoint_shape s;
  s.version = h[1];
  s.max_context = static_cast<std::size_t>(h[2]);
  s.vocab = static_cast<std::size_t>(h[3]);
  s.layers = static_cast<std::size_t>(h[4]);
  s.heads = static_cast<std::size_t>(h[5]);
  s.channels = static_cast<std::size_t>(h[6]);
  s.padded_vocab = static_cast<std::size_t>(h[7]);
  if (s.padded_vocab < s.vocab)
    detail::fail(chunkwise::error_code::invalid_argument, path,
                 "Vp " + std::to_string(s.padded_vocab) + " is below V " + std::to_string(s.vocab));
  return s;
}

/// The model shape a checkpoint describes (batch 1, context maxT): set batch and, at most maxT, context after.
inline model_config config_of(const checkpoint_shape& s) {
  model_config config;
  config.vocab = s.vocab;
  config.padded_vocab = s.padded_vocab;
  config.context = s.max_context;
  config.channels = s.channels;
  config.heads = s.heads;
  config.layers = s.layers;
  config.batch = 1;
  return config;
}

/// Reads the checkpoint at `path` into tensors of `config`'s shape (parameter_tensors order), widening bf16.
inline std::vector<std::vector<float>> read_checkpoint(const std::filesystem::path& path, const model_config& config) {
  const checkpoint_shape s = read_checkpoint_shape(path);
  const auto differs = [&](const char* what, std::size_t file, std::size_t ours) {
    if (file != ours)
      detail::fail(chunkwise::error_code::invalid_argument, path,
                   std::string(what) + " is " + std::to_string(file) + " in the file, " + std::to_string(ours) +
                       " in the model (the model takes the checkpoint's shape: --init-from sets it)");
  };
  differs("V (vocabulary)", s.vocab, config.vocab);
  differs("Vp (padded vocabulary)", s.padded_vocab, config.vocab_rows());
  differs("L (layers)", s.layers, config.layers);
  differs("NH (heads)", s.heads, config.heads);
  differs("C (channels)", s.channels, config.channels);
  if (config.context > s.max_context)
    detail::fail(chunkwise::error_code::invalid_argument, path,
                 "the model's context " + std::to_string(config.context) + " is longer than the checkpoint's maxT " +
                     std::to_string(s.max_context) + " (wpe has that many rows); use --context " +
                     std::to_string(s.max_context) + " or less");
  const std::vector<char> bytes = detail::read_all(path);
  const std::size_t element = s.version == 5 ? sizeof(chunkwise::bf16) : sizeof(float);
  std::size_t count = 0;
  const auto order = detail::kinds(config, s.max_context);
  for (const auto& k : order) count += k.elements * k.layers(config);
  const std::size_t expected = header_ints * sizeof(std::int32_t) + count * element;
  if (bytes.size() != expected)
    detail::fail(chunkwise::error_code::invalid_argument, path,
                 std::to_string(bytes.size()) + " bytes; its header describes " + std::to_string(expected) +
                     " (a truncated or different file)");

  auto tensors_list = parameter_tensors(config);
  std::vector<std::vector<float>> tensors(tensors_list.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].resize(tensors_list[i].elements);
  const char* at = bytes.data() + header_ints * sizeof(std::int32_t);
  const auto take = [&](std::span<float> into, std::size_t elements) {
    // elements >= into.size(): wpe's rows past our context are skipped.
    for (std::size_t i = 0; i < into.size(); ++i) {
      if (element == sizeof(float)) {
        std::memcpy(&into[i], at + i * element, sizeof(float));
      } else {
        chunkwise::bf16 value;
        std::memcpy(&value, at + i * element, sizeof(value));
        into[i] = chunkwise::to_float(value);
      }
    }
    at += elements * element;
  };
  for (const auto& k : order)
    for (std::size_t l = 0; l < k.layers(config); ++l) take(tensors[k.tensor(l)], k.elements);
  return tensors;
}

/// Writes `tensors` (parameter_tensors(config) order) as an llm.c checkpoint: version 3 (fp32) or 5 (bf16, rounded
/// to nearest even); maxT is the model's context.
inline void write_checkpoint(const std::filesystem::path& path, const model_config& config,
                             const std::vector<std::vector<float>>& tensors, int version = 3) {
  if (version != 3 && version != 5)
    detail::fail(chunkwise::error_code::invalid_argument, path,
                 "version " + std::to_string(version) + "; llm.c reads 3 (fp32) and 5 (bf16)");
  const auto expected = parameter_tensors(config);
  if (tensors.size() != expected.size())
    detail::fail(chunkwise::error_code::invalid_argument, path,
                 std::to_string(tensors.size()) + " tensors given, the model has " + std::to_string(expected.size()));
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].size() != expected[i].elements)
      detail::fail(chunkwise::error_code::invalid_argument, path,
                   expected[i].name + " has " + std::to_string(tensors[i].size()) + " elements, the model " +
                       std::to_string(expected[i].elements));
  std::array<std::int32_t, header_ints> header{};
  header[0] = checkpoint_magic;
  header[1] = version;
  header[2] = static_cast<std::int32_t>(config.context);
  header[3] = static_cast<std::int32_t>(config.vocab);
  header[4] = static_cast<std::int32_t>(config.layers);
  header[5] = static_cast<std::int32_t>(config.heads);
  header[6] = static_cast<std::int32_t>(config.channels);
  header[7] = static_cast<std::int32_t>(config.vocab_rows());
  std::string contents(reinterpret_cast<const char*>(header.data()), sizeof(header));
  for (const auto& k : detail::kinds(config, config.context)) {
    for (std::size_t l = 0; l < k.layers(config); ++l)
      for (const float value : tensors[k.tensor(l)]) {
        if (version == 3) {
          contents.append(reinterpret_cast<const char*>(&value), sizeof(value));
        } else {
          const chunkwise::bf16 rounded = chunkwise::to_bf16(value);
          contents.append(reinterpret_cast<const char*>(&rounded), sizeof(rounded));
        }
      }
  }
  chunkwise::write_file_atomically(path, contents);
}

/// Whether the file at `path` starts with the token shard magic (else the trainer reads it as bytes).
inline bool is_token_shard(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::int32_t magic = 0;
  return file.read(reinterpret_cast<char*>(&magic), sizeof(magic)) && magic == shard_magic;
}

/// The tokens of the shard at `path`, each checked against `vocab`.
inline std::vector<int> read_tokens(const std::filesystem::path& path, std::size_t vocab) {
  const std::vector<char> bytes = detail::read_all(path);
  const auto h = detail::header_of(bytes, path);
  if (h[0] != shard_magic)
    detail::fail(chunkwise::error_code::invalid_argument, path,
                 "magic " + std::to_string(h[0]) + " is not llm.c's token shard magic " + std::to_string(shard_magic));
  if (h[1] != 1)
    detail::fail(chunkwise::error_code::unsupported, path,
                 "shard version " + std::to_string(h[1]) + "; version 1 (uint16 tokens) is read");
  const std::size_t count = static_cast<std::size_t>(static_cast<std::uint32_t>(h[2]));
  const std::size_t expected = header_ints * sizeof(std::int32_t) + count * sizeof(std::uint16_t);
  if (bytes.size() != expected)
    detail::fail(chunkwise::error_code::invalid_argument, path,
                 std::to_string(bytes.size()) + " bytes; its header counts " + std::to_string(count) +
                     " tokens, " + std::to_string(expected) + " bytes");
  std::vector<int> tokens(count);
  const char* at = bytes.data() + header_ints * sizeof(std::int32_t);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t token = 0;
    std::memcpy(&token, at + i * sizeof(token), sizeof(token));
    if (token >= vocab)
      detail::fail(chunkwise::error_code::invalid_argument, path,
                   "token " + std::to_string(token) + " at position " + std::to_string(i) +
                       " is outside the vocabulary of " + std::to_string(vocab) +
                       " (GPT-2's tokenizer: --vocab 50257)");
    tokens[i] = token;
  }
  return tokens;
}

/// Writes `tokens` as a version-1 shard (for tests, and to hand our data to llm.c).
inline void write_tokens(const std::filesystem::path& path, std::span<const int> tokens) {
  std::array<std::int32_t, header_ints> header{};
  header[0] = shard_magic;
  header[1] = 1;
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::string contents(reinterpret_cast<const char*>(header.data()), sizeof(header));
  for (const int token : tokens) {
    if (token < 0 || token > 65535)
      detail::fail(chunkwise::error_code::invalid_argument, path,
                   "token " + std::to_string(token) + " does not fit a uint16 shard");
    const auto value = static_cast<std::uint16_t>(token);
    contents.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  chunkwise::write_file_atomically(path, contents);
}

}  // namespace gpt2::llmc
