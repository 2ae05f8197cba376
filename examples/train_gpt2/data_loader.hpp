#pragma once
// Batches for the example trainer: an llm.c token shard (llmc_files.hpp), or any other file read as bytes, each byte
// a token (vocabulary 256), split into a training part (the first 90%) and a validation part (the last 10%).
//
// A split is cut into windows of T + 1 tokens starting every T tokens (window k covers tokens [k T, k T + T], so
// consecutive windows share one token); a batch is B windows, its tokens the first T of each window and its targets
// the last T (the next token at every position). The training split visits its windows in an order shuffled anew
// for every epoch by a generator seeded once (the same seed gives the same batches on every machine); the
// validation split visits them in file order, so an evaluation over its first N batches is always the same text.
//
// A distributed sampler: with a shard {rank, ranks}, `batch` counts the global batch and each loader keeps only its
// rank's rows of it (rows [rank B/ranks, (rank + 1) B/ranks)), so ranks in threads, processes or on other machines
// draw one global batch between them without talking, and the same global batch whatever the rank count.
#include "llmc_files.hpp"
#include "random.hpp"

#include <chunkwise/core/error.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace gpt2 {

#ifdef CHUNKWISE_GPT2_DATA_FILE
/// The text shipped beside the example (data/README.md), as CMake located it.
inline constexpr const char* default_data_file = CHUNKWISE_GPT2_DATA_FILE;
#endif

enum class data_split : std::uint8_t { train, validation };

/// Which rows of each global batch a loader keeps: rank's share of `ranks` equal shares.
struct batch_shard {
  std::size_t rank = 0, ranks = 1;
};

/// The bytes of a file as tokens in [0, 256). Throws chunkwise::error(io_error) naming the file and the reason.
inline std::vector<int> read_byte_tokens(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    throw chunkwise::error(chunkwise::error_code::io_error,
                           "gpt2 data: cannot open '" + path.string() + "': " + std::strerror(errno) +
                               " (the example ships examples/train_gpt2/data/kjv_genesis_exodus.txt)");
  const std::vector<char> bytes{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  if (file.bad())
    throw chunkwise::error(chunkwise::error_code::io_error, "gpt2 data: reading '" + path.string() + "' failed");
  std::vector<int> tokens(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) tokens[i] = static_cast<unsigned char>(bytes[i]);
  return tokens;
}

class data_loader {
 public:
  /// Global batches of `batch` windows of `context` + 1 tokens from one split of the file at `path`, of which this
  /// loader keeps `shard`'s rows. Throws chunkwise::error: io_error when the file cannot be read, invalid_argument
  /// when the split is shorter than one window, batch or context is 0, or the shard is not a whole share of batch.
  data_loader(const std::filesystem::path& path, data_split split, std::size_t batch, std::size_t context,
              std::uint64_t seed = 0, std::size_t vocab = 256, batch_shard shard = {})
      : batch_(batch), context_(context), shuffled_(split == data_split::train), seed_(seed), rng_(seed) {
    if (batch == 0 || context == 0)
      throw chunkwise::error(chunkwise::error_code::invalid_argument,
                             "gpt2 data_loader: batch (" + std::to_string(batch) + ") and context (" +
                                 std::to_string(context) + ") must be positive");
    if (shard.ranks == 0 || shard.rank >= shard.ranks || batch % shard.ranks != 0)
      throw chunkwise::error(chunkwise::error_code::invalid_argument,
                             "gpt2 data_loader: rank " + std::to_string(shard.rank) + " of " +
                                 std::to_string(shard.ranks) + " cannot take an equal share of a global batch of " +
                                 std::to_string(batch) + " rows; use a global batch divisible by the rank count");
    rows_ = batch / shard.ranks;
    first_row_ = shard.rank * rows_;
    std::vector<int> all = llmc::is_token_shard(path) ? llmc::read_tokens(path, vocab) : read_byte_tokens(path);
    const std::size_t validation_size = all.size() / 10;
    const std::size_t train_size = all.size() - validation_size;
    if (shuffled_)
      tokens_.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(train_size));
    else
      tokens_.assign(all.begin() + static_cast<std::ptrdiff_t>(train_size), all.end());
    if (tokens_.size() < context + 1)
      throw chunkwise::error(
          chunkwise::error_code::invalid_argument,
          "gpt2 data_loader: the " + std::string(shuffled_ ? "training" : "validation") + " split of '" +
              path.string() + "' (" + std::to_string(all.size()) + " bytes) has " + std::to_string(tokens_.size()) +
              " tokens, fewer than one window of context + 1 = " + std::to_string(context + 1) +
              "; the validation split is the last 10%, so the file needs at least " +
              std::to_string(10 * (context + 1)) + " bytes, or use a shorter context");
    order_.resize((tokens_.size() - 1) / context_);
    batch_tokens_.resize(rows_ * context_);
    batch_targets_.resize(rows_ * context_);
    reset();
  }

  /// Fills tokens() and targets() with this shard's rows of the next global batch; past the last window, a new
  /// epoch begins (every rank walks the whole global batch, so every rank's epochs turn at the same window).
  void next_batch() {
    for (std::size_t b = 0; b < batch_; ++b) {
      if (position_ == order_.size()) {
        ++epoch_;
        start_epoch();
      }
      const std::size_t window_index = order_[position_++];
      if (b < first_row_ || b >= first_row_ + rows_) continue;
      const int* window = tokens_.data() + window_index * context_;
      const auto row = static_cast<std::ptrdiff_t>((b - first_row_) * context_);
      std::copy(window, window + context_, batch_tokens_.begin() + row);
      std::copy(window + 1, window + 1 + context_, batch_targets_.begin() + row);
    }
  }

  /// Back to the first batch, as freshly constructed (the same order of windows follows).
  void reset() {
    rng_ = splitmix64(seed_);
    epoch_ = 0;
    start_epoch();
  }

  /// This shard's rows of the current batch, (B / ranks, T) row-major each: the inputs and the next token at every
  /// position.
  [[nodiscard]] std::span<const int> tokens() const noexcept { return batch_tokens_; }
  [[nodiscard]] std::span<const int> targets() const noexcept { return batch_targets_; }

  [[nodiscard]] std::size_t split_tokens() const noexcept { return tokens_.size(); }
  [[nodiscard]] std::size_t windows() const noexcept { return order_.size(); }
  [[nodiscard]] std::size_t batches_per_epoch() const noexcept { return order_.size() / batch_; }
  [[nodiscard]] std::size_t epoch() const noexcept { return epoch_; }

 private:
  void start_epoch() {
    position_ = 0;
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    if (shuffled_)  // Fisher-Yates
      for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng_.below(i)]);
  }

  std::size_t batch_, context_;
  std::size_t rows_ = 0, first_row_ = 0;  // this shard's rows of each global batch
  bool shuffled_;
  std::uint64_t seed_;
  splitmix64 rng_;
  std::vector<int> tokens_;          // the split
  std::vector<std::size_t> order_;   // window indices of this epoch, in visiting order
  std::size_t position_ = 0;         // next entry of order_
  std::size_t epoch_ = 0;            // the current epoch, from 0
  std::vector<int> batch_tokens_, batch_targets_;
};

}  // namespace gpt2
