#pragma once
// fixed<Bytes>: chunks of one given capacity (rounded up to ranks * alignment so shards stay equal).
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/layout/concepts.hpp>
#include <chunkwise/layout/detail/next_fit.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <string_view>

namespace chunkwise::layout {

template <byte_count Bytes = 64 * MiB>
struct fixed {
  static_assert(Bytes > 0, "fixed<Bytes>: a chunk must hold at least one byte");
  static constexpr std::string_view name = "fixed";
  static constexpr byte_count requested_bytes = Bytes;

  /// The capacity actually used: Bytes rounded up to a multiple of ranks * alignment.
  static constexpr byte_count chunk_bytes(const layout_options& options) { return round_up(Bytes, options.granule()); }

  static constexpr chunk_map build(const model_profile& model, const layout_options& options) {
    validate(model);
    validate(options);
    const byte_count capacity = chunk_bytes(options);
    // The name is formatted only on the error path: format_bytes is not constexpr, and a constant profile that
    // fits must leave build() a constant expression.
    if (model.largest_tensor_bytes() > capacity) detail::require_fits(model, capacity, "fixed<" + format_bytes(Bytes) + ">");
    return detail::pack(model, capacity, options);
  }
  static constexpr layout_summary summarize(const model_profile& model, const layout_options& options) {
    return build(model, options).summary();
  }
};

static_assert(chunk_layout<fixed<>>);

}  // namespace chunkwise::layout
