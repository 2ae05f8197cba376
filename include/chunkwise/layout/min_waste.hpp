#pragma once
// min_waste<SearchRange, MinChunk, MaxChunk>: the chunk capacity that minimises waste (free space plus alignment
// padding, summed over chunks), searched exactly over every multiple of ranks * alignment in
// [lo, lo + SearchRange], lo = max(largest tensor, MinChunk) rounded up, as Colossal-AI's Gemini/Elixir search does.
// MaxChunk (0 = none) caps the capacity; a tensor above it is an error.
//
// The search. With next-fit in first-use order the chunk count k(S) is non-increasing in the capacity S
// (detail/next_fit.hpp), and waste(S) = k(S) * S - tensor_bytes. Within a run of capacities with the same k,
// waste grows with S, so the optimum is the smallest capacity of some run. We walk those run starts from lo upwards:
// from the start of a run with k chunks, an exponential search from the expected next level (about S / k further)
// and a bisection find the smallest capacity that needs at most k - 1 chunks (the predicate is monotone).
// Cost: O(levels * n * log(S / (k * granule))), levels <= k(lo) - k(hi); next-fit runs over a dense array of aligned
// sizes, with no division in its loop. Ties go to the smaller capacity (finer-grained prefetch and eviction).
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/layout/concepts.hpp>
#include <chunkwise/layout/detail/next_fit.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <cstdint>
#include <string_view>

namespace chunkwise::layout {

/// The capacity range a min_waste search covers, and its answer.
struct chunk_size_search {
  byte_count lowest = 0;   // first candidate capacity
  byte_count highest = 0;  // last candidate capacity
  byte_count granule = 0;  // candidates are lowest + j * granule (ranks * alignment)
  byte_count best = 0;     // the chosen capacity
  std::uint64_t chunk_count = 0;
  byte_count waste = 0;
};

/// The capacities from max(largest, min_chunk), rounded up to the granule, to search_range above it: the search range
/// with no maximum (throws when a knob exceeds max_profile_bytes).
constexpr chunk_size_search capacity_range(byte_count largest, const layout_options& options, byte_count search_range,
                                           byte_count min_chunk) {
  // Knobs beyond the most a profile can hold (validate) are nonsense, and would wrap the rounding and the range's end.
  if (search_range > max_profile_bytes || min_chunk > max_profile_bytes)
    chunkwise::detail::raise(error_code::invalid_argument,
                             "min_waste: search range " + format_bytes(search_range) + " and minimum chunk " +
                                 format_bytes(min_chunk) + " must each be at most " +
                                 format_bytes(max_profile_bytes));
  const byte_count granule = options.granule();
  const byte_count lowest = round_up(largest > min_chunk ? largest : min_chunk, granule);
  return chunk_size_search{lowest, lowest + search_range / granule * granule, granule, 0, 0, 0};
}

/// The search range of min_waste with these knobs (throws when the largest tensor exceeds max_chunk, or a knob
/// exceeds max_profile_bytes). Expects a validated model and options.
constexpr chunk_size_search min_waste_range(const model_profile& model, const layout_options& options,
                                            byte_count search_range, byte_count min_chunk, byte_count max_chunk) {
  const byte_count largest = model.largest_tensor_bytes();
  auto range = capacity_range(largest, options, search_range, min_chunk);
  const byte_count granule = range.granule, lowest = range.lowest;
  if (max_chunk != 0) {
    if (largest > max_chunk)
      detail::require_fits(model, max_chunk, "min_waste (max chunk " + format_bytes(max_chunk) + ")");
    const byte_count cap = max_chunk / granule * granule;
    if (cap < lowest)
      chunkwise::detail::raise(error_code::layout_error,
                               "min_waste: the smallest admissible chunk is " + format_bytes(lowest) +
                                   " (largest tensor or minimum chunk, rounded to " + std::to_string(granule) +
                                   " bytes for " + std::to_string(options.ranks) + " ranks) but the maximum is " +
                                   format_bytes(max_chunk) + "; raise the maximum to at least " +
                                   format_bytes(lowest));
    range.highest = range.highest < cap ? range.highest : cap;
  }
  return range;
}

/// The exact minimum-waste capacity over the range (see the header comment for the algorithm).
constexpr chunk_size_search search_min_waste(const model_profile& model, const layout_options& options,
                                             chunk_size_search range) {
  const byte_count tensor_bytes = model.tensor_bytes();
  const std::uint64_t points = (range.highest - range.lowest) / range.granule;  // grid indices 0..points
  const auto capacity_at = [&](std::uint64_t j) { return range.lowest + j * range.granule; };

  const auto extents = detail::extents_of(model, options.alignment);
  const auto chunks_at = [&](std::uint64_t j, std::uint64_t limit = detail::too_many) {
    return detail::count_chunks(extents, capacity_at(j), limit);
  };

  std::uint64_t j = 0;
  std::uint64_t k = chunks_at(0);
  range.best = range.lowest;
  range.chunk_count = k;
  range.waste = k * range.lowest - tensor_bytes;
  while (k > 1 && j < points) {
    // Smallest grid index in (j, points] whose capacity needs at most k - 1 chunks. Levels sit about S / k apart
    // (one chunk's worth spread over the others): probe there, double the stride until a probe needs fewer
    // chunks, then bisect the last stride. Invariant: index `low` needs k or more chunks, `high` fewer.
    const auto fewer = [&](std::uint64_t index) { return chunks_at(index, k - 1) <= k - 1; };
    const std::uint64_t guess = capacity_at(j) / k / range.granule;
    std::uint64_t low = j, high = 0, stride = guess < 1 ? 1 : guess;
    bool found = false;
    for (;;) {
      const std::uint64_t probe = low + stride < points ? low + stride : points;
      if (fewer(probe)) {
        high = probe;
        found = true;
        break;
      }
      if (probe == points) break;
      low = probe;
      stride *= 2;
    }
    if (!found) break;  // no capacity in range needs fewer chunks
    while (high - low > 1) {
      const std::uint64_t mid = low + (high - low) / 2;
      if (fewer(mid)) high = mid;
      else low = mid;
    }
    j = high;
    k = chunks_at(j);
    const byte_count waste = k * capacity_at(j) - tensor_bytes;
    if (waste < range.waste) {
      range.best = capacity_at(j);
      range.chunk_count = k;
      range.waste = waste;
    }
  }
  return range;
}

/// The chunk map at the minimum-waste capacity of `range` (from min_waste_range): min_waste's build over a range of
/// the caller's choice (the planner tries several).
constexpr chunk_map build_min_waste(const model_profile& model, const layout_options& options,
                                    const chunk_size_search& range) {
  return detail::pack(model, search_min_waste(model, options, range).best, options);
}

template <byte_count SearchRange = 64 * MiB, byte_count MinChunk = 32 * MiB, byte_count MaxChunk = 0>
struct min_waste {
  static_assert(MaxChunk == 0 || MaxChunk >= MinChunk, "min_waste: MaxChunk must be 0 (none) or >= MinChunk");
  static_assert(SearchRange <= max_profile_bytes && MinChunk <= max_profile_bytes,
                "min_waste: SearchRange and MinChunk must each be at most max_profile_bytes (64 PiB)");
  static constexpr std::string_view name = "min_waste";
  static constexpr byte_count search_range = SearchRange;
  static constexpr byte_count min_chunk = MinChunk;
  static constexpr byte_count max_chunk = MaxChunk;

  /// The search with its range and answer: the chosen capacity, its chunk count and waste.
  static constexpr chunk_size_search search(const model_profile& model, const layout_options& options) {
    validate(model);
    validate(options);
    return search_min_waste(model, options, min_waste_range(model, options, SearchRange, MinChunk, MaxChunk));
  }
  static constexpr chunk_map build(const model_profile& model, const layout_options& options) {
    return detail::pack(model, search(model, options).best, options);
  }
  static constexpr layout_summary summarize(const model_profile& model, const layout_options& options) {
    return build(model, options).summary();
  }
};

static_assert(chunk_layout<min_waste<>>);

}  // namespace chunkwise::layout
