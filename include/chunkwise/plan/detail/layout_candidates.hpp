#pragma once
// The chunk sizes the search tries for a layout: one for fixed<> and per_tensor; for min_waste<> the minimum-waste
// size in four ranges that start at 1x, 2x, 4x and 8x its lowest admissible size, so the search can trade waste for
// fewer, larger collectives and transfers. Each candidate is tested for feasibility first, so the search never
// throws on a layout that cannot pack (it reports it as infeasible instead).
#include <chunkwise/layout/fixed.hpp>
#include <chunkwise/layout/min_waste.hpp>
#include <chunkwise/layout/per_tensor.hpp>

#include <cstddef>

namespace chunkwise::inline CHUNKWISE_ABI::detail {

template <class Layout>
struct layout_candidates {
  static constexpr std::size_t count = 1;
  static constexpr bool fits(const model_profile&, const layout_options&, std::size_t) noexcept { return true; }
  static constexpr chunk_map build(const model_profile& model, const layout_options& options, std::size_t) {
    return Layout::build(model, options);
  }
};

template <byte_count Bytes>
struct layout_candidates<layout::fixed<Bytes>> {
  static constexpr std::size_t count = 1;
  static constexpr bool fits(const model_profile& model, const layout_options& options, std::size_t) noexcept {
    return model.largest_tensor_bytes() <= layout::fixed<Bytes>::chunk_bytes(options);
  }
  static constexpr chunk_map build(const model_profile& model, const layout_options& options, std::size_t) {
    return layout::fixed<Bytes>::build(model, options);
  }
};

template <byte_count SearchRange, byte_count MinChunk, byte_count MaxChunk>
struct layout_candidates<layout::min_waste<SearchRange, MinChunk, MaxChunk>> {
  static constexpr std::size_t count = 4;
  static constexpr byte_count min_chunk(const model_profile& model, std::size_t candidate) noexcept {
    const byte_count largest = model.largest_tensor_bytes();
    return (largest > MinChunk ? largest : MinChunk) << candidate;
  }
  static constexpr bool fits(const model_profile& model, const layout_options& options, std::size_t candidate) noexcept {
    if (MaxChunk == 0) return true;
    return round_up(min_chunk(model, candidate), options.granule()) <= MaxChunk / options.granule() * options.granule();
  }
  static constexpr chunk_map build(const model_profile& model, const layout_options& options, std::size_t candidate) {
    const auto range = layout::min_waste_range(model, options, SearchRange, min_chunk(model, candidate), MaxChunk);
    return layout::detail::pack(model, layout::search_min_waste(model, options, range).best, options);
  }
};

}  // namespace chunkwise::detail
