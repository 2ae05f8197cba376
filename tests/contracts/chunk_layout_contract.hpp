#pragma once
// The chunk_layout contract (layout/concepts.hpp), for every layout policy:
// TEST_CASE_TEMPLATE_APPLY(chunk_layout_contract, std::tuple<L1, L2, ...>).
//
// Property tests with fixed seeds over random tensor lists (1 to 24 tensors of fp32, bf16 and fp16, some tied,
// sizes log-uniform up to the policy's scale and now and then beyond it) and random options (1 to 4 or 8 ranks,
// alignments 1 to 512 bytes, larger where a search range needs it), each map checked against brute-force counting:
// - every tensor placed exactly once, where `locations` says, whole, at an aligned offset, without overlap, inside
//   its chunk, tensors in first-use order across chunks; a tied tensor alone in a chunk marked tied;
// - every capacity a multiple of ranks * alignment (equal aligned shards); the summary (count, largest capacity,
//   total, tensor bytes, waste) equal to counting the map by hand, and summarize() equal to build().summary();
// - sizes as the family promises: fixed<B> packs next-fit at round_up(B, ranks * alignment) and fails with
//   layout_error naming the tensor exactly when one does not fit; per_tensor gives tensor i chunk i of its size
//   rounded up; min_waste<R, Min, Max> equals next-fit at the smallest capacity of least waste among every
//   candidate of its range (each one counted), and fails with layout_error exactly when Max leaves no candidate;
//   private_chunks<R, Min, Max, Sigmas> gives each tied tensor, and each larger than the mean plus Sigmas standard
//   deviations, a chunk of its size rounded up; packs the rest next-fit, the chunk before a private tensor and the
//   last one shrunk to what they hold, at the smallest capacity of least waste in its range (each one counted);
// - bad inputs (no tensors, a tensor of no elements, tensors out of first-use order, 0 ranks, an alignment that is
//   no power of two) are errors with their code and a message naming the problem;
// - the same answer in a constant expression as at run time (a static_assert on a small constant profile).
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/layout/concepts.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <doctest/doctest.h>

#include "expect_error.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace chunkwise::test::layout_contract {

/// A small constant profile every policy can pack: a tied tensor between two others, so at least 3 chunks.
constexpr model_profile tiny_profile() {
  model_profile model;
  model.name = "tiny";
  model.tensors.push_back(tensor_spec{"a", 10, dtype::fp32, tensor_role::parameter, false});   // 40 bytes
  model.tensors.push_back(tensor_spec{"wte", 30, dtype::bf16, tensor_role::parameter, true});  // 60, tied
  model.tensors.push_back(tensor_spec{"b", 7, dtype::fp16, tensor_role::parameter, false});    // 14
  model.tensors.push_back(tensor_spec{"c", 16, dtype::fp32, tensor_role::parameter, false});   // 64
  model.passes.push_back(profile_pass{"all", pass_kind::forward, {0, 1, 2, 3}, 0, 0});
  return model;
}
inline constexpr byte_count tiny_tensor_bytes = 40 + 60 + 14 + 64;
inline constexpr layout_options tiny_options{.ranks = 2, .alignment = 64};

template <class L>
constexpr layout_summary tiny_summary() {
  return L::summarize(tiny_profile(), tiny_options);
}

/// Whether L::summarize of the tiny profile is a constant expression (false, rather than a compile error, when
/// the policy breaks that promise, so the suite can say which policy does).
template <class L>
concept summarizes_at_compile_time = requires { typename std::integral_constant<bool, (tiny_summary<L>(), true)>; };

/// A chunk as the oracle writes it.
struct expected_chunk {
  byte_count capacity = 0;
  bool tied = false;
  std::vector<chunk_slot> slots;
};

/// Next-fit in first-use order at `capacity`, written from the rule (not the library's code): a chunk takes the
/// next tensor at the next aligned offset while it fits; a tied tensor closes the open chunk and gets its own.
inline std::vector<expected_chunk> next_fit(const model_profile& model, byte_count capacity, byte_count alignment) {
  std::vector<expected_chunk> chunks;
  bool open = false;
  for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
    const auto& t = model.tensors[i];
    const byte_count bytes = t.elements * size_of(t.type);
    if (open && !t.tied) {
      const chunk_slot& last = chunks.back().slots.back();
      const byte_count end = last.offset + last.bytes;
      const byte_count offset = (end + alignment - 1) / alignment * alignment;
      if (offset + bytes <= capacity) {
        chunks.back().slots.push_back(chunk_slot{i, offset, bytes});
        continue;
      }
    }
    chunks.push_back(expected_chunk{capacity, t.tied, {chunk_slot{i, 0, bytes}}});
    open = !t.tied;
  }
  return chunks;
}

/// The same rule, counting chunks only (the brute force runs it at every candidate capacity).
inline std::uint64_t next_fit_count(const model_profile& model, byte_count capacity, byte_count alignment) {
  std::uint64_t count = 0;
  bool open = false;
  byte_count end = 0;  // end of the open chunk's last tensor
  for (const auto& t : model.tensors) {
    const byte_count bytes = t.elements * size_of(t.type);
    const byte_count offset = (end + alignment - 1) / alignment * alignment;
    if (open && !t.tied && offset + bytes <= capacity) {
      end = offset + bytes;
      continue;
    }
    ++count;
    open = !t.tied;
    end = bytes;
  }
  return count;
}

inline byte_count bytes_of(const model_profile& model) {
  byte_count total = 0;
  for (const auto& t : model.tensors) total += t.elements * size_of(t.type);
  return total;
}
inline byte_count largest_of(const model_profile& model) {
  byte_count largest = 0;
  for (const auto& t : model.tensors) largest = std::max(largest, t.elements * size_of(t.type));
  return largest;
}
inline byte_count round_to(byte_count value, byte_count granule) { return (value + granule - 1) / granule * granule; }

/// private_chunks' rule, written from its documentation: tied tensors, and tensors above mean + sigmas * stddev.
inline std::vector<bool> private_rule(const model_profile& model, unsigned sigmas) {
  std::vector<double> sizes;
  for (const auto& t : model.tensors) sizes.push_back(static_cast<double>(t.elements * size_of(t.type)));
  double mean = 0, variance = 0;
  for (const double x : sizes) mean += x / static_cast<double>(sizes.size());
  for (const double x : sizes) variance += (x - mean) * (x - mean) / static_cast<double>(sizes.size());
  std::vector<bool> alone;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    alone.push_back(model.tensors[i].tied || sizes[i] > mean + sigmas * std::sqrt(variance));
  return alone;
}

/// private_chunks' packing at `capacity`: next-fit of the shared tensors, each private tensor alone in a chunk of its
/// size (closing the open one), and the chunks no later tensor joins shrunk to their contents; all rounded to shards.
inline std::vector<expected_chunk> private_fit(const model_profile& model, const std::vector<bool>& alone,
                                               byte_count capacity, byte_count alignment, byte_count granule) {
  std::vector<expected_chunk> chunks;
  bool open = false;
  const auto shrink = [&] {
    if (!open) return;
    const chunk_slot& last = chunks.back().slots.back();
    chunks.back().capacity = round_to(last.offset + last.bytes, granule);
  };
  for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
    const byte_count bytes = model.tensors[i].elements * size_of(model.tensors[i].type);
    if (alone[i]) {
      shrink();
      chunks.push_back(expected_chunk{round_to(bytes, granule), model.tensors[i].tied, {chunk_slot{i, 0, bytes}}});
      open = false;
      continue;
    }
    if (open) {
      const chunk_slot& last = chunks.back().slots.back();
      const byte_count offset = round_to(last.offset + last.bytes, alignment);
      if (offset + bytes <= capacity) {
        chunks.back().slots.push_back(chunk_slot{i, offset, bytes});
        continue;
      }
    }
    chunks.push_back(expected_chunk{capacity, false, {chunk_slot{i, 0, bytes}}});
    open = true;
  }
  shrink();
  return chunks;
}

/// What the family promises for this input: the map (as next-fit or per-tensor chunks), or the tensor that makes
/// it fail with layout_error (its name; "" when the failure names no tensor).
struct promise {
  std::optional<std::vector<expected_chunk>> chunks;
  std::string fails_on;
};

/// The smallest capacity of least waste among lowest, lowest + granule, ..., highest, each counted by next-fit.
inline byte_count least_waste_capacity(const model_profile& model, byte_count lowest, byte_count highest,
                                       byte_count granule, byte_count alignment) {
  const byte_count tensors = bytes_of(model);
  byte_count best = lowest, best_waste = ~byte_count{0};
  for (byte_count s = lowest; s <= highest; s += granule) {
    if (s >= tensors && s - tensors >= best_waste) break;  // one chunk of s already wastes more: so do larger ones
    const byte_count waste = next_fit_count(model, s, alignment) * s - tensors;
    if (waste < best_waste) {
      best = s;
      best_waste = waste;
    }
  }
  return best;
}

template <class L>
promise promised(const model_profile& model, const layout_options& options) {
  const byte_count granule = byte_count{options.ranks} * options.alignment;
  const byte_count largest = largest_of(model);
  const auto first_too_big = [&](byte_count capacity) {
    for (const auto& t : model.tensors)
      if (t.elements * size_of(t.type) > capacity) return t.name.str();
    return std::string();
  };
  promise p;
  if constexpr (L::name == "fixed") {
    const byte_count capacity = round_to(L::requested_bytes, granule);
    if (largest > capacity) p.fails_on = first_too_big(capacity);
    else p.chunks = next_fit(model, capacity, options.alignment);
  } else if constexpr (L::name == "per_tensor") {
    std::vector<expected_chunk> chunks;
    for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
      const byte_count bytes = model.tensors[i].elements * size_of(model.tensors[i].type);
      chunks.push_back(expected_chunk{round_to(bytes, granule), model.tensors[i].tied, {chunk_slot{i, 0, bytes}}});
    }
    p.chunks = std::move(chunks);
  } else if constexpr (L::name == "min_waste") {
    const byte_count lowest = round_to(std::max(largest, L::min_chunk), granule);
    byte_count highest = lowest + L::search_range / granule * granule;
    if (L::max_chunk != 0) {
      if (largest > L::max_chunk) {
        p.fails_on = first_too_big(L::max_chunk);
        return p;
      }
      const byte_count cap = L::max_chunk / granule * granule;
      if (cap < lowest) {
        p.fails_on = "";  // no candidate: names the sizes, not a tensor
        return p;
      }
      highest = std::min(highest, cap);
    }
    p.chunks = next_fit(model, least_waste_capacity(model, lowest, highest, granule, options.alignment),
                        options.alignment);
  } else if constexpr (L::name == "private_chunks") {
    const auto alone = private_rule(model, L::outlier_sigmas);
    byte_count shared_largest = 0;
    for (std::size_t i = 0; i < model.tensors.size(); ++i)
      if (!alone[i])
        shared_largest = std::max(shared_largest, model.tensors[i].elements * size_of(model.tensors[i].type));
    const byte_count lowest = round_to(std::max(shared_largest, L::min_chunk), granule);
    byte_count highest = lowest + L::search_range / granule * granule;
    if (L::max_chunk != 0) highest = std::max(lowest, std::min(highest, L::max_chunk / granule * granule));
    byte_count best_waste = ~byte_count{0};
    for (byte_count s = lowest; s <= highest; s += granule) {
      auto chunks = private_fit(model, alone, s, options.alignment, granule);
      byte_count total = 0;
      for (const auto& c : chunks) total += c.capacity;
      if (total - bytes_of(model) < best_waste) {
        best_waste = total - bytes_of(model);
        p.chunks = std::move(chunks);
      }
    }
  } else {
    static_assert(L::name == "fixed", "chunk_layout contract: say what this layout family promises");
  }
  return p;
}

/// The invariants of every chunk map, and the summary counted by hand.
inline void check_map(const model_profile& model, const chunk_map& map) {
  const layout_options& options = map.options;
  const byte_count granule = byte_count{options.ranks} * options.alignment;
  REQUIRE(map.locations.size() == model.tensors.size());
  std::vector<int> placed(model.tensors.size(), 0);
  std::int64_t previous = -1;
  std::size_t bad = 0;  // counted, not CHECKed one by one: thousands of slots
  byte_count total = 0, largest = 0;
  for (std::uint32_t c = 0; c < map.chunks.size(); ++c) {
    const chunk& ch = map.chunks[c];
    CAPTURE(c);
    CHECK(ch.capacity > 0);
    CHECK(ch.capacity % granule == 0);
    CHECK(map.shard_bytes(c) * options.ranks == ch.capacity);
    CHECK(map.shard_bytes(c) % options.alignment == 0);
    CHECK(!ch.slots.empty());
    total += ch.capacity;
    largest = std::max(largest, ch.capacity);
    byte_count end = 0;
    for (const chunk_slot& slot : ch.slots) {
      if (slot.tensor >= model.tensors.size()) {
        ++bad;
        continue;
      }
      const auto& t = model.tensors[slot.tensor];
      bad += slot.offset % options.alignment != 0;                  // aligned
      bad += slot.offset < end;                                     // no overlap (slots in offset order)
      bad += slot.offset + slot.bytes > ch.capacity;                // inside
      bad += slot.bytes != t.elements * size_of(t.type);            // whole
      bad += static_cast<std::int64_t>(slot.tensor) != previous + 1;  // first-use order, none skipped
      bad += map.locations[slot.tensor].chunk != c || map.locations[slot.tensor].offset != slot.offset;
      bad += t.tied && (ch.slots.size() != 1 || !ch.tied);          // tied: alone, and marked
      previous = slot.tensor;
      end = slot.offset + slot.bytes;
      ++placed[slot.tensor];
    }
    if (ch.tied) CHECK(ch.slots.size() == 1);
  }
  CHECK(bad == 0);
  CHECK(std::count(placed.begin(), placed.end(), 1) == static_cast<std::ptrdiff_t>(placed.size()));
  const layout_summary s = map.summary();
  CHECK(s.chunk_count == map.chunks.size());
  CHECK(s.chunk_bytes == largest);
  CHECK(s.total_bytes == total);
  CHECK(s.tensor_bytes == bytes_of(model));
  CHECK(s.waste == total - bytes_of(model));
}

inline bool same_chunks(const chunk_map& map, const std::vector<expected_chunk>& expected) {
  if (map.chunks.size() != expected.size()) return false;
  for (std::size_t c = 0; c < expected.size(); ++c) {
    const chunk& got = map.chunks[c];
    if (got.capacity != expected[c].capacity || got.tied != expected[c].tied ||
        got.slots.size() != expected[c].slots.size())
      return false;
    for (std::size_t k = 0; k < got.slots.size(); ++k)
      if (got.slots[k].tensor != expected[c].slots[k].tensor || got.slots[k].offset != expected[c].slots[k].offset ||
          got.slots[k].bytes != expected[c].slots[k].bytes)
        return false;
  }
  return true;
}

/// The byte scale a policy works at: its chunk size, or its search range and bounds.
template <class L>
byte_count scale_of() {
  if constexpr (L::name == "fixed") return L::requested_bytes;
  else if constexpr (L::name == "min_waste" || L::name == "private_chunks")
    return L::max_chunk != 0 ? L::max_chunk : std::max(L::min_chunk, L::search_range);
  else return 64 * KiB;
}

/// Ranks and alignment at random; the alignment raised where a search range would otherwise hold more than 2048
/// candidates (min_waste), or more than private_chunks tries one by one (1,024), which the brute force counts.
template <class L>
layout_options random_options(std::mt19937_64& rng) {
  layout_options options;
  options.ranks = static_cast<std::uint32_t>(rng() % 5 == 0 ? 8 : 1 + rng() % 4);
  options.alignment = byte_count{1} << (rng() % 10);
  if constexpr (L::name == "min_waste")
    while (L::search_range / (byte_count{options.ranks} * options.alignment) > 2048) options.alignment *= 2;
  if constexpr (L::name == "private_chunks")  // within the range it searches exhaustively
    while (L::search_range / (byte_count{options.ranks} * options.alignment) >= 1024) options.alignment *= 2;
  return options;
}

/// 1 to 24 tensors, log-uniform sizes up to half the policy's scale, one in 16 up to 1.2 times it; one in 10 tied;
/// passes that touch them in first-use order (forward in groups, backward in reverse).
inline model_profile random_profile(std::mt19937_64& rng, byte_count scale) {
  model_profile model;
  model.name = "random";
  const std::size_t count = 1 + rng() % 24;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const dtype types[] = {dtype::fp32, dtype::bf16, dtype::fp16};
  const tensor_role roles[] = {tensor_role::parameter, tensor_role::gradient, tensor_role::optimizer_state};
  for (std::size_t i = 0; i < count; ++i) {
    const dtype type = types[rng() % 3];
    const double top = static_cast<double>(rng() % 16 == 0 ? scale + scale / 5 : scale / 2);
    const double bytes = std::exp(unit(rng) * std::log(std::max(2.0, top)));
    const std::uint64_t elements = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(bytes) / size_of(type));
    std::string name = std::to_string(i);
    name.insert(name.begin(), 't');  // (not "t" + ...: GCC 12 warns about that falsely under -O3, -Wrestrict)
    model.tensors.push_back(tensor_spec{name, elements, type, roles[rng() % 3], rng() % 10 == 0});
  }
  std::vector<std::uint32_t> order;
  for (std::uint32_t i = 0; i < count; ++i) {
    order.push_back(i);
    if (rng() % 3 == 0 || i + 1 == count) {
      model.passes.push_back(profile_pass{"f", pass_kind::forward, order, 0, 0});
      order.clear();
    }
  }
  for (std::size_t k = model.passes.size(); k-- > 0;)
    model.passes.push_back(profile_pass{"b", pass_kind::backward, model.passes[k].tensors, 0, 0});
  return model;
}

template <class L>
void check_bad_inputs() {
  model_profile empty;
  empty.name = "empty";
  expect_error([&] { (void)L::build(empty, {}); }, error_code::invalid_profile, {"empty", "no tensors"});
  model_profile model = tiny_profile();
  expect_error([&] { (void)L::build(model, {.ranks = 0}); }, error_code::invalid_argument, {"ranks is 0"});
  expect_error([&] { (void)L::build(model, {.ranks = 2, .alignment = 96}); }, error_code::invalid_argument,
               {"alignment 96", "power of two"});
  expect_error([&] { (void)L::summarize(model, {.ranks = 1, .alignment = 0}); }, error_code::invalid_argument,
               {"alignment 0"});
  model_profile zero = tiny_profile();
  zero.tensors[2].elements = 0;
  expect_error([&] { (void)L::build(zero, {}); }, error_code::invalid_profile, {"'b'", "zero elements"});
  model_profile unordered = tiny_profile();
  unordered.passes = {profile_pass{"late", pass_kind::forward, {1, 0, 3, 2}, 0, 0},
                      profile_pass{"swap", pass_kind::forward, {3}, 0, 0}};
  CHECK_NOTHROW((void)L::build(unordered, tiny_options));  // any order within one pass
  unordered.passes = {profile_pass{"first", pass_kind::forward, {0, 2}, 0, 0}};
  expect_error([&] { (void)L::build(unordered, tiny_options); }, error_code::invalid_profile,
               {"'b'", "first-use order"});
}

}  // namespace chunkwise::test::layout_contract

TEST_CASE_TEMPLATE_DEFINE("chunk_layout contract: every tensor once, sizes as promised, waste counted right", Layout,
                          chunk_layout_contract) {
  using namespace chunkwise;
  namespace contract = chunkwise::test::layout_contract;
  static_assert(chunk_layout<Layout>);
  static_assert(Layout::name == "fixed" || Layout::name == "per_tensor" || Layout::name == "min_waste" ||
                Layout::name == "private_chunks");

  // The constant-expression path: the same summary at compile time as at run time.
  CHECK_MESSAGE(contract::summarizes_at_compile_time<Layout>,
                Layout::name << ": summarize() of a constant profile is not a constant expression");
  if constexpr (contract::summarizes_at_compile_time<Layout>) {
    constexpr layout_summary tiny = contract::tiny_summary<Layout>();
    static_assert(tiny.tensor_bytes == contract::tiny_tensor_bytes);
    static_assert(tiny.waste == tiny.total_bytes - tiny.tensor_bytes);
    static_assert(tiny.chunk_count >= 3);  // the tied tensor between two others is alone
    static_assert(tiny.chunk_bytes % (2 * 64) == 0 && tiny.total_bytes % (2 * 64) == 0);
    CHECK(Layout::summarize(contract::tiny_profile(), contract::tiny_options) == tiny);
  }
  {
    const auto model = contract::tiny_profile();
    const auto map = Layout::build(model, contract::tiny_options);
    contract::check_map(model, map);
    const auto promise = contract::promised<Layout>(model, contract::tiny_options);
    REQUIRE(promise.chunks.has_value());
    CHECK(contract::same_chunks(map, *promise.chunks));
  }

  contract::check_bad_inputs<Layout>();

  std::mt19937_64 rng(0x5eed'1a40 + Layout::name.size());
  int built = 0, failed = 0;
  for (int trial = 0; trial < 60; ++trial) {
    CAPTURE(trial);
    const layout_options options = contract::random_options<Layout>(rng);
    const model_profile model = contract::random_profile(rng, contract::scale_of<Layout>());
    CAPTURE(options.ranks);
    CAPTURE(options.alignment);
    CAPTURE(model.tensors.size());
    const auto promise = contract::promised<Layout>(model, options);
    if (!promise.chunks) {
      ++failed;
      const std::string message = chunkwise::test::expect_error([&] { (void)Layout::build(model, options); },
                                                                error_code::layout_error, {});
      if (!promise.fails_on.empty()) {
        CHECK(message.find("'" + promise.fails_on + "'") != std::string::npos);
        CHECK(message.find("at least") != std::string::npos);  // says what would fit
      }
      chunkwise::test::expect_error([&] { (void)Layout::summarize(model, options); }, error_code::layout_error, {});
      continue;
    }
    ++built;
    const chunk_map map = Layout::build(model, options);
    contract::check_map(model, map);
    CHECK(contract::same_chunks(map, *promise.chunks));
    CHECK(Layout::summarize(model, options) == map.summary());
  }
  CAPTURE(failed);
  CHECK(built >= 30);  // the random profiles mostly fit: the properties above were exercised
}
