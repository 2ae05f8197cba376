#pragma once
// layout_candidates<Layout>: the chunk sizes the search tries for a layout, each as a chunk map. One candidate for
// fixed<> and per_tensor; for min_waste<> the minimum-waste size in four ranges that start at 1x, 2x, 4x and 8x its
// lowest admissible size, so the search can trade waste for fewer, larger collectives and transfers; for
// private_chunks<> the shared chunks' capacity in [MinChunk, MaxChunk] and in half that range (32-64 and 16-32 MiB
// by default), so a small device can stream at a finer grain where the cost model finds it faster. Ask can_pack
// before build: the search never throws on a layout that cannot pack (it reports it as infeasible instead), and the
// runtime rebuilds the candidate whose chunk size the search chose.
//   for (std::size_t i = 0; i < layout_candidates<L>::count; ++i)
//     if (layout_candidates<L>::can_pack(model, options, i)) use(layout_candidates<L>::build(model, options, i));
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/layout/fixed.hpp>
#include <chunkwise/layout/min_waste.hpp>
#include <chunkwise/layout/per_tensor.hpp>
#include <chunkwise/layout/private_chunks.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <cstddef>

namespace chunkwise {

/// Any layout without a searched size: one candidate, the layout's own build.
template <class Layout>
struct layout_candidates {
  static constexpr std::size_t count = 1;
  static constexpr bool can_pack(const model_profile&, const layout_options&, std::size_t) noexcept { return true; }
  static constexpr chunk_map build(const model_profile& model, const layout_options& options, std::size_t) {
    return Layout::build(model, options);
  }
};

template <byte_count Bytes>
struct layout_candidates<layout::fixed<Bytes>> {
  static constexpr std::size_t count = 1;
  /// The largest tensor fits one chunk.
  static constexpr bool can_pack(const model_profile& model, const layout_options& options, std::size_t) noexcept {
    return model.largest_tensor_bytes() <= layout::fixed<Bytes>::chunk_bytes(options);
  }
  static constexpr chunk_map build(const model_profile& model, const layout_options& options, std::size_t) {
    return layout::fixed<Bytes>::build(model, options);
  }
};

template <byte_count SearchRange, byte_count MinChunk, byte_count MaxChunk>
struct layout_candidates<layout::min_waste<SearchRange, MinChunk, MaxChunk>> {
  static constexpr std::size_t count = 4;
  /// Where candidate `candidate`'s search range starts: the lowest admissible size times 2^candidate.
  static constexpr byte_count min_chunk(const model_profile& model, std::size_t candidate) noexcept {
    const byte_count largest = model.largest_tensor_bytes();
    return (largest > MinChunk ? largest : MinChunk) << candidate;
  }
  /// The range's start, rounded to the granule, stays within MaxChunk.
  static constexpr bool can_pack(const model_profile& model, const layout_options& options,
                                 std::size_t candidate) noexcept {
    if (MaxChunk == 0) return true;
    return round_up(min_chunk(model, candidate), options.granule()) <= MaxChunk / options.granule() * options.granule();
  }
  static constexpr chunk_map build(const model_profile& model, const layout_options& options, std::size_t candidate) {
    return layout::build_min_waste(
        model, options, layout::min_waste_range(model, options, SearchRange, min_chunk(model, candidate), MaxChunk));
  }
};

template <byte_count SearchRange, byte_count MinChunk, byte_count MaxChunk, unsigned Sigmas>
struct layout_candidates<layout::private_chunks<SearchRange, MinChunk, MaxChunk, Sigmas>> {
  static constexpr std::size_t count = 2;
  /// Candidate c's shared-chunk range: [MinChunk, MaxChunk] / 2^c (the layout's own at c = 0).
  static constexpr byte_count min_chunk(std::size_t candidate) noexcept { return MinChunk >> candidate; }
  static constexpr byte_count max_chunk(std::size_t candidate) noexcept { return MaxChunk >> candidate; }
  /// A smaller range than a shared tensor would only repeat the one above it: not offered.
  static constexpr bool can_pack(const model_profile& model, const layout_options& options, std::size_t candidate) {
    if (candidate == 0 || MaxChunk == 0) return true;
    const byte_count largest_shared = layout::largest_shared_tensor(model, layout::private_tensors(model, Sigmas));
    return round_up(largest_shared, options.granule()) <= max_chunk(candidate) / options.granule() * options.granule();
  }
  static constexpr chunk_map build(const model_profile& model, const layout_options& options, std::size_t candidate) {
    return layout::build_private(model, options, SearchRange, min_chunk(candidate), max_chunk(candidate), Sigmas);
  }
};

}  // namespace chunkwise
