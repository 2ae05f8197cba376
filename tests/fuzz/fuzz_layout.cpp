// libFuzzer target: bytes -> an arbitrary tensor list and layout options -> every layout. Each layout either throws
// chunkwise::error (and only where that is justified) or returns a chunk map whose invariants hold; min_waste also
// equals a brute force over its candidate capacities when there are fewer than 2000 of them.
#include "fuzz_support.hpp"

#include <chunkwise/layout.hpp>

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using namespace chunkwise;
using fuzz::fail;

constexpr dtype all_dtypes[] = {dtype::fp32, dtype::fp16, dtype::bf16, dtype::fp64,
                                dtype::int32, dtype::int64, dtype::uint8};

/// A tensor list from the input: mostly small tensors (so brute force stays cheap), sometimes up to 2^20 or any
/// 64-bit element count; each may be tied; optionally one pass in first-use order or one pass per tensor.
model_profile model_from(FuzzedDataProvider& input) {
  model_profile model;
  model.name = "fuzz";
  const auto count = input.ConsumeIntegralInRange<std::uint32_t>(1, 48);
  for (std::uint32_t i = 0; i < count && input.remaining_bytes() > 0; ++i) {
    const auto flags = input.ConsumeIntegral<std::uint8_t>();
    tensor_spec t;
    t.name = "t" + std::to_string(i);
    t.type = all_dtypes[(flags & 7u) % 7];
    t.tied = (flags & 8u) != 0;
    switch ((flags >> 4) & 7u) {
      case 7: t.elements = input.ConsumeIntegral<std::uint64_t>(); break;
      case 6: t.elements = input.ConsumeIntegralInRange<std::uint64_t>(0, 1u << 20); break;
      default: t.elements = input.ConsumeIntegralInRange<std::uint64_t>(0, 4096); break;
    }
    model.tensors.push_back(t);
  }
  switch (input.ConsumeIntegralInRange(0, 2)) {
    case 1: {
      profile_pass all{"all", pass_kind::forward, {}, 0};
      for (std::uint32_t i = 0; i < model.tensors.size(); ++i) all.tensors.push_back(i);
      model.passes.push_back(all);
      break;
    }
    case 2:
      for (std::uint32_t i = 0; i < model.tensors.size(); ++i)
        model.passes.push_back({"s" + std::to_string(i), pass_kind::forward, {i}, 0});
      break;
    default: break;
  }
  return model;
}

/// The invariants every chunk map must satisfy.
void check_map(const model_profile& model, const layout_options& options, const chunk_map& map, const char* layout) {
  const std::string at = std::string(layout) + ": ";
  CHUNKWISE_FUZZ_CHECK(map.options.ranks == options.ranks && map.options.alignment == options.alignment,
                       at + "options not kept");
  CHUNKWISE_FUZZ_CHECK(map.locations.size() == model.tensors.size(), at + "one location per tensor");
  const byte_count granule = options.granule();
  std::uint32_t next_tensor = 0;  // slots, chunk by chunk, must list every tensor exactly once in first-use order
  byte_count tensor_bytes = 0;
  for (std::size_t c = 0; c < map.chunks.size(); ++c) {
    const auto& chunk = map.chunks[c];
    const std::string in = at + "chunk #" + std::to_string(c) + " ";
    CHUNKWISE_FUZZ_CHECK(chunk.capacity > 0 && chunk.capacity % granule == 0,
                         in + "capacity " + std::to_string(chunk.capacity) + " is not a positive multiple of " +
                             std::to_string(granule));
    CHUNKWISE_FUZZ_CHECK(map.shard_bytes(c) * options.ranks == chunk.capacity &&
                             map.shard_bytes(c) % options.alignment == 0,
                         in + "shards are not equal and aligned");
    CHUNKWISE_FUZZ_CHECK(!chunk.slots.empty(), in + "is empty");
    CHUNKWISE_FUZZ_CHECK(!chunk.tied || chunk.slots.size() == 1, in + "is tied but holds several tensors");
    byte_count end = 0;  // of the previous slot
    for (std::size_t k = 0; k < chunk.slots.size(); ++k) {
      const auto& slot = chunk.slots[k];
      const std::string s = in + "slot #" + std::to_string(k) + " ";
      CHUNKWISE_FUZZ_CHECK(slot.tensor == next_tensor, s + "holds tensor #" + std::to_string(slot.tensor) +
                                                           ", expected #" + std::to_string(next_tensor));
      ++next_tensor;
      const auto& t = model.tensors[slot.tensor];
      CHUNKWISE_FUZZ_CHECK(slot.bytes == t.bytes(), s + "has the wrong size");
      CHUNKWISE_FUZZ_CHECK(slot.offset % options.alignment == 0, s + "is not aligned");
      CHUNKWISE_FUZZ_CHECK(slot.offset >= end, s + "overlaps the previous slot");
      CHUNKWISE_FUZZ_CHECK(slot.bytes <= chunk.capacity && slot.offset <= chunk.capacity - slot.bytes,
                           s + "ends past the capacity: offset " + std::to_string(slot.offset) + " bytes " +
                               std::to_string(slot.bytes) + " capacity " + std::to_string(chunk.capacity));
      end = slot.offset + slot.bytes;
      CHUNKWISE_FUZZ_CHECK(!t.tied || (chunk.tied && chunk.slots.size() == 1), s + "tied tensor not alone");
      CHUNKWISE_FUZZ_CHECK(map.locations[slot.tensor].chunk == c && map.locations[slot.tensor].offset == slot.offset,
                           s + "location disagrees with the slot");
      tensor_bytes += slot.bytes;  // cannot wrap: validate() bounds the profile's bytes
    }
  }
  CHUNKWISE_FUZZ_CHECK(next_tensor == model.tensors.size(), at + "not every tensor is placed");
  byte_count total = 0;
  for (const auto& chunk : map.chunks)
    CHUNKWISE_FUZZ_CHECK(!__builtin_add_overflow(total, chunk.capacity, &total), at + "total capacity overflows");
  const auto summary = map.summary();
  CHUNKWISE_FUZZ_CHECK(summary.tensor_bytes == tensor_bytes && summary.waste == summary.total_bytes - tensor_bytes &&
                           summary.chunk_count == map.chunks.size(),
                       at + "summary disagrees with the chunks");
}

/// Runs one layout call; a chunkwise::error is allowed only when `may_fail`.
template <class Body>
bool run(Body&& body, bool may_fail, const char* what) {
  const bool ok = fuzz::accepted(body, what);
  if (!ok && !may_fail) fail(std::string(what) + " threw on a valid tensor list");
  return ok;
}

template <class Fixed>
void check_fixed(const model_profile& model, const layout_options& options, bool valid) {
  chunk_map map;
  const bool fits = valid && model.largest_tensor_bytes() <= Fixed::chunk_bytes(options);
  if (!run([&] { map = Fixed::build(model, options); }, !fits, "fixed::build")) return;
  CHUNKWISE_FUZZ_CHECK(valid, "fixed::build accepted an invalid tensor list or options");
  check_map(model, options, map, "fixed");
  for (const auto& c : map.chunks)
    CHUNKWISE_FUZZ_CHECK(c.capacity == Fixed::chunk_bytes(options), "fixed: a chunk of another capacity");
}

/// Waste of next-fit at `capacity`, written out independently of the library (and without allocating, so the
/// brute force over up to 2000 capacities stays fast): a tied tensor gets a chunk alone, any other tensor joins the
/// open chunk at the next aligned offset if it fits there.
byte_count next_fit_waste(const model_profile& model, const layout_options& options, byte_count capacity) {
  std::uint64_t chunks = 0;
  bool open = false;
  byte_count end = 0;  // of the open chunk's last tensor
  for (const auto& t : model.tensors) {
    const byte_count offset = (end + options.alignment - 1) / options.alignment * options.alignment;
    if (!t.tied && open && offset + t.bytes() <= capacity) {
      end = offset + t.bytes();
      continue;
    }
    ++chunks;
    open = !t.tied;
    end = t.bytes();
  }
  return chunks * capacity - model.tensor_bytes();
}

/// min_waste's search against its own build and (small grids) a brute force over every candidate capacity.
void check_search(const model_profile& model, const layout_options& options, const layout::chunk_size_search& found,
                  byte_count max_chunk, const char* what) {
  const std::string at = std::string(what) + ": ";
  CHUNKWISE_FUZZ_CHECK(found.granule == options.granule(), at + "granule is not the layout granule");
  CHUNKWISE_FUZZ_CHECK(found.best >= found.lowest && found.best <= found.highest && found.best % found.granule == 0,
                       at + "best capacity " + std::to_string(found.best) + " is outside the grid");
  CHUNKWISE_FUZZ_CHECK(found.best >= model.largest_tensor_bytes(), at + "best capacity cannot hold the largest tensor");
  CHUNKWISE_FUZZ_CHECK(max_chunk == 0 || found.best <= max_chunk, at + "best capacity exceeds the maximum");
  const chunk_map map = layout::detail::pack(model, found.best, options);
  check_map(model, options, map, what);
  const auto summary = map.summary();
  CHUNKWISE_FUZZ_CHECK(summary.chunk_count == found.chunk_count && summary.waste == found.waste,
                       at + "reported chunk count or waste differs from the packed map");
  if ((found.highest - found.lowest) / found.granule >= 2000) return;
  byte_count best = 0, waste = ~byte_count{0};
  for (byte_count j = 0; j <= (found.highest - found.lowest) / found.granule; ++j) {
    const byte_count s = found.lowest + j * found.granule;
    const auto w = next_fit_waste(model, options, s);
    if (w < waste) {
      waste = w;
      best = s;
    }
  }
  CHUNKWISE_FUZZ_CHECK(found.best == best && found.waste == waste,
                       at + "search chose " + std::to_string(found.best) + " (waste " + std::to_string(found.waste) +
                           "), brute force " + std::to_string(best) + " (waste " + std::to_string(waste) + ")");
}

template <class MinWaste>
void check_min_waste(const model_profile& model, const layout_options& options, bool valid) {
  layout::chunk_size_search found;
  const bool may_fail = !valid || (MinWaste::max_chunk != 0 && model.largest_tensor_bytes() > MinWaste::max_chunk);
  if (!run([&] { found = MinWaste::search(model, options); }, true, "min_waste::search")) {
    // Without a maximum, a valid tensor list always has an answer; with one, only when some grid point is <= it.
    if (!may_fail && MinWaste::max_chunk == 0) fail("min_waste::search threw on a valid tensor list");
    return;
  }
  CHUNKWISE_FUZZ_CHECK(valid, "min_waste::search accepted an invalid tensor list or options");
  check_search(model, options, found, MinWaste::max_chunk, "min_waste");
  chunk_map map;
  run([&] { map = MinWaste::build(model, options); }, false, "min_waste::build");
  for (const auto& c : map.chunks) CHUNKWISE_FUZZ_CHECK(c.capacity == found.best, "min_waste::build disagrees");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider input(data, size);
  layout_options options;
  // Mostly what machines use (1..8 ranks, alignment up to 4 KiB), sometimes anything the options type holds.
  const bool wide = input.ConsumeIntegralInRange(0, 15) == 0;
  options.ranks = wide ? input.ConsumeIntegral<std::uint32_t>() : input.ConsumeIntegralInRange<std::uint32_t>(1, 8);
  options.alignment = byte_count{1} << input.ConsumeIntegralInRange(0, wide ? 63 : 12);
  // Knobs of the run-time search: mostly modest, sometimes any 64-bit value.
  const auto knob = [&](byte_count modest) {
    switch (input.ConsumeIntegralInRange(0, 7)) {
      case 0: return input.ConsumeIntegral<byte_count>();  // mostly beyond max_profile_bytes: must be rejected
      case 1: return input.ConsumeIntegralInRange<byte_count>(0, byte_count{1} << 48);
      default: return input.ConsumeIntegralInRange<byte_count>(0, modest);
    }
  };
  const auto search_range = knob(1u << 20);
  const auto min_chunk = knob(1u << 20);
  const auto max_chunk = input.ConsumeBool() ? 0 : knob(1u << 24);
  const model_profile model = model_from(input);

  const bool valid = fuzz::accepted([&] { validate(model); }, "validate(model)") &&
                     fuzz::accepted([&] { validate(options); }, "validate(options)");

  chunk_map map;
  if (run([&] { map = layout::per_tensor::build(model, options); }, !valid, "per_tensor::build")) {
    check_map(model, options, map, "per_tensor");
    for (std::size_t c = 0; c < map.chunks.size(); ++c)
      CHUNKWISE_FUZZ_CHECK(map.chunks[c].capacity == round_up(model.tensors[c].bytes(), options.granule()),
                           "per_tensor: a chunk not sized to its tensor");
  }
  check_fixed<layout::fixed<1>>(model, options, valid);
  check_fixed<layout::fixed<4 * KiB>>(model, options, valid);
  check_fixed<layout::fixed<1 * MiB>>(model, options, valid);
  check_min_waste<layout::min_waste<>>(model, options, valid);
  check_min_waste<layout::min_waste<64 * KiB, 0>>(model, options, valid);
  check_min_waste<layout::min_waste<1 * MiB, 4 * KiB, 2 * MiB>>(model, options, valid);

  // The search functions with knobs from the input.
  if (!valid) return 0;
  layout::chunk_size_search range;
  const bool has_range =
      fuzz::accepted([&] { range = layout::min_waste_range(model, options, search_range, min_chunk, max_chunk); },
                     "min_waste_range");
  if (!has_range) {
    // Only a maximum below the smallest admissible capacity, or an absurd knob, justifies an error.
    CHUNKWISE_FUZZ_CHECK(max_chunk != 0 || search_range > max_profile_bytes || min_chunk > max_profile_bytes,
                         "min_waste_range threw without a maximum and with sensible knobs");
    return 0;
  }
  layout::chunk_size_search found;
  run([&] { found = layout::search_min_waste(model, options, range); }, false, "search_min_waste");
  check_search(model, options, found, max_chunk, "search_min_waste");
  return 0;
}
