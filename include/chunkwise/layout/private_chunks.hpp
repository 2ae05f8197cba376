#pragma once
// private_chunks<SearchRange, MinChunk, MaxChunk, OutlierSigmas>: chunks of their own for the tensors that would set
// every chunk's size, and min_waste's exact search over the rest.
//
// Under min_waste no chunk may be smaller than the largest tensor, so one outlier decides the grain of the whole
// model. GPT-2 124M's token embedding is 147 MiB beside 9 MiB layer matrices, which leaves 3 chunks of 165 MiB and
// nothing for a device cache to stream at a useful grain. Two rules, as Colossal-AI does it:
// - tied tensors (used at both ends of every iteration) get private chunks, as Elixir's do;
// - outliers get private chunks too: tensors larger than the mean plus OutlierSigmas standard deviations of the
//   tensor sizes (Gemini's rule, 3 sigmas by default).
// A private chunk is sized to its tensor, rounded up to whole shards. The other (shared) tensors pack next-fit in
// first-use order at the capacity that leaves the least free space in the chunks, and each chunk is then shrunk to
// what it holds (in whole shards): homes and resident chunks keep no free tails, and the capacity bounds the chunks
// (a device cache's block holds the largest, so the search's free space is the blocks' slack). That capacity is
// searched from max(largest shared tensor, MinChunk) upwards over SearchRange, and capped at MaxChunk unless a shared
// tensor is larger. A private tensor closes the open shared chunk, so the chunks still list the tensors in first-use
// order.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/layout/concepts.hpp>
#include <chunkwise/layout/detail/next_fit.hpp>
#include <chunkwise/layout/min_waste.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <cstdint>
#include <string_view>
#include <vector>

namespace chunkwise::layout {

/// 1 for each tensor that gets a chunk of its own: tied, or larger than mean + sigmas * standard deviation of the
/// tensor sizes (compared squared, so it stays a constant expression).
constexpr std::vector<unsigned char> private_tensors(const model_profile& model, unsigned sigmas) {
  const std::size_t n = model.tensors.size();
  double mean = 0.0, variance = 0.0;
  for (const auto& t : model.tensors) mean += static_cast<double>(t.bytes());
  mean /= n == 0 ? 1.0 : static_cast<double>(n);
  for (const auto& t : model.tensors) {
    const double off = static_cast<double>(t.bytes()) - mean;
    variance += off * off;
  }
  variance /= n == 0 ? 1.0 : static_cast<double>(n);
  std::vector<unsigned char> alone(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const double above = static_cast<double>(model.tensors[i].bytes()) - mean;
    alone[i] = model.tensors[i].tied || (above > 0.0 && above * above > double(sigmas) * double(sigmas) * variance);
  }
  return alone;
}

/// The largest tensor that does not get a chunk of its own (0 when every tensor does).
constexpr byte_count largest_shared_tensor(const model_profile& model, const std::vector<unsigned char>& alone) {
  byte_count largest = 0;
  for (std::size_t i = 0; i < model.tensors.size(); ++i)
    if (alone[i] == 0 && model.tensors[i].bytes() > largest) largest = model.tensors[i].bytes();
  return largest;
}

/// The capacity search: every candidate when there are at most this many, else a coarse grid and the granule steps
/// around its best points.
inline constexpr std::uint64_t exhaustive_capacities = 1024;
inline constexpr std::uint64_t coarse_capacities = 128;
inline constexpr std::size_t refined_points = 2;
inline constexpr std::uint64_t fine_steps = 32;

/// Waste of next-fit over `extents` at `capacity` when each segment's last chunk is shrunk to fit (pack_with_private):
/// the free space of the full chunks, plus alignment padding everywhere.
constexpr byte_count shrunk_waste(const std::vector<detail::tensor_extent>& extents, byte_count capacity,
                                  byte_count granule) noexcept {
  byte_count waste = 0, next = 0, end = 0, used = 0;  // next: the aligned offset of the open chunk's next tensor
  bool open = false;
  const auto close = [&](bool full) {
    if (open) waste += (full ? capacity : round_up(end, granule)) - used;
    open = false;
  };
  for (const auto& t : extents) {
    if (t.closes) {
      close(/*full=*/false);
      continue;
    }
    if (open && next + t.bytes <= capacity) {
      end = next + t.bytes;
      next += t.aligned_bytes;
      used += t.bytes;
      continue;
    }
    close(/*full=*/true);
    open = true;
    end = t.bytes;
    next = t.aligned_bytes;
    used = t.bytes;
  }
  close(/*full=*/false);
  return waste;
}

/// The shared tensors' capacity: the least free space next-fit leaves at that capacity (shrunk_waste) over capacities
/// from max(largest shared tensor, min_chunk), rounded to whole shards, to search_range above it, capped at max_chunk
/// unless a shared tensor is larger. Every multiple of the granule is tried up to exhaustive_capacities of them;
/// beyond, a grid of coarse_capacities and the neighbourhoods of its refined_points best points at finer steps
/// (Gemini's own search steps by the hidden size). Ties go to the smaller capacity.
constexpr chunk_size_search shared_chunk_search(const model_profile& model, const layout_options& options,
                                                const std::vector<unsigned char>& alone, byte_count search_range,
                                                byte_count min_chunk, byte_count max_chunk) {
  std::vector<detail::tensor_extent> extents;
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    const byte_count bytes = model.tensors[i].bytes();
    if (alone[i]) extents.push_back({0, 0, false, true});
    else extents.push_back({bytes, round_up(bytes, options.alignment), false, false});
  }
  auto range = capacity_range(largest_shared_tensor(model, alone), options, search_range, min_chunk);
  if (max_chunk != 0) {
    const byte_count cap = max_chunk / range.granule * range.granule;
    range.highest = cap < range.lowest ? range.lowest : (cap < range.highest ? cap : range.highest);
  }
  range.waste = ~byte_count{0};
  const auto try_capacity = [&](byte_count capacity) {
    const byte_count waste = shrunk_waste(extents, capacity, range.granule);
    if (waste < range.waste || (waste == range.waste && capacity < range.best)) {
      range.best = capacity;
      range.waste = waste;
    }
  };
  const std::uint64_t candidates = (range.highest - range.lowest) / range.granule + 1;
  if (candidates <= exhaustive_capacities) {
    for (byte_count capacity = range.lowest; capacity <= range.highest; capacity += range.granule)
      try_capacity(capacity);
  } else {
    // A coarse grid, then finer steps around its best points (cheap enough for a constant expression).
    const byte_count coarse = (range.highest - range.lowest) / coarse_capacities / range.granule * range.granule;
    byte_count best[refined_points] = {};
    byte_count best_waste[refined_points] = {};
    for (auto& w : best_waste) w = ~byte_count{0};
    for (byte_count capacity = range.lowest; capacity <= range.highest; capacity += coarse) {
      byte_count waste = shrunk_waste(extents, capacity, range.granule);
      byte_count at = capacity;
      for (std::size_t k = 0; k < refined_points; ++k)  // keep the refined_points least wasteful, in order
        if (waste < best_waste[k]) {
          const byte_count w = best_waste[k], c = best[k];
          best_waste[k] = waste;
          best[k] = at;
          waste = w;
          at = c;
        }
    }
    const byte_count fine = coarse / range.granule > 2 * fine_steps ? coarse / (2 * fine_steps) / range.granule *
                                                                          range.granule
                                                                    : range.granule;
    for (std::size_t k = 0; k < refined_points; ++k) {
      if (best_waste[k] == ~byte_count{0}) continue;
      const byte_count from = best[k] > range.lowest + coarse ? best[k] - coarse : range.lowest;
      const byte_count to = best[k] + coarse < range.highest ? best[k] + coarse : range.highest;
      for (byte_count capacity = from; capacity <= to; capacity += fine) try_capacity(capacity);
    }
  }
  range.chunk_count = detail::count_chunks(extents, range.best);
  return range;
}

/// Next-fit of the shared tensors at `capacity`, each private tensor alone in a chunk sized to it, every shared chunk
/// shrunk to what it holds once closed.
constexpr chunk_map pack_with_private(const model_profile& model, byte_count capacity, const layout_options& options,
                                      const std::vector<unsigned char>& alone) {
  return detail::pack(model, capacity, options, [&](std::uint32_t i) { return alone[i] != 0; }, true);
}

/// The whole layout at these knobs: private tensors alone, the shared ones at the searched capacity (private_chunks'
/// build, and its smaller chunk-size candidates with other ranges).
constexpr chunk_map build_private(const model_profile& model, const layout_options& options, byte_count search_range,
                                  byte_count min_chunk, byte_count max_chunk, unsigned sigmas) {
  validate(model);
  validate(options);
  const auto alone = private_tensors(model, sigmas);
  const auto shared = shared_chunk_search(model, options, alone, search_range, min_chunk, max_chunk);
  return pack_with_private(model, shared.best, options, alone);
}

template <byte_count SearchRange = 64 * MiB, byte_count MinChunk = 32 * MiB, byte_count MaxChunk = 64 * MiB,
          unsigned OutlierSigmas = 3>
struct private_chunks {
  static_assert(MaxChunk == 0 || MaxChunk >= MinChunk, "private_chunks: MaxChunk must be 0 (none) or >= MinChunk");
  static_assert(OutlierSigmas > 0, "private_chunks: OutlierSigmas must be at least 1");
  static constexpr std::string_view name = "private_chunks";
  static constexpr byte_count search_range = SearchRange;
  static constexpr byte_count min_chunk = MinChunk;
  static constexpr byte_count max_chunk = MaxChunk;
  static constexpr unsigned outlier_sigmas = OutlierSigmas;

  /// The shared chunks' capacity, their count and waste (the private chunks not counted).
  static constexpr chunk_size_search search(const model_profile& model, const layout_options& options) {
    validate(model);
    validate(options);
    return shared_chunk_search(model, options, private_tensors(model, OutlierSigmas), SearchRange, MinChunk,
                               MaxChunk);
  }
  static constexpr chunk_map build(const model_profile& model, const layout_options& options) {
    return build_private(model, options, SearchRange, MinChunk, MaxChunk, OutlierSigmas);
  }
  static constexpr layout_summary summarize(const model_profile& model, const layout_options& options) {
    return build(model, options).summary();
  }
};

static_assert(chunk_layout<private_chunks<>>);

}  // namespace chunkwise::layout
