#pragma once
// The chunk access trace of one iteration (which chunks each pass needs at once) and how many fetches a device cache
// of b blocks makes along it with next-use (Belady) eviction: the cost model's count of host-to-device moves.
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace chunkwise::detail {

struct chunk_trace {
  std::vector<std::vector<std::uint32_t>> passes;  // chunk ids each pass touches, without repeats
  std::uint64_t widest_pass = 0;                   // most chunks one pass needs at once
  // Most gradient accumulators alive at once in backward: a chunk's lives from its first backward pass to its last
  // (a tied embedding's through all of backward), one more while the previous chunk's reduction is in flight.
  std::uint64_t live_gradients = 0;
};

constexpr chunk_trace trace_chunks(const model_profile& model, const chunk_map& map) {
  chunk_trace trace;
  for (const auto& pass : model.passes) {
    std::vector<std::uint32_t> chunks;
    for (const auto tensor : pass.tensors) {
      const auto c = map.locations[tensor].chunk;
      if (std::find(chunks.begin(), chunks.end(), c) == chunks.end()) chunks.push_back(c);
    }
    trace.widest_pass = std::max<std::uint64_t>(trace.widest_pass, chunks.size());
    trace.passes.push_back(std::move(chunks));
  }
  constexpr std::size_t none = ~std::size_t{0};
  std::vector<std::size_t> first(map.chunks.size(), none), last(map.chunks.size(), none);
  for (std::size_t p = 0; p < model.passes.size(); ++p)
    if (model.passes[p].kind == pass_kind::backward)
      for (const auto c : trace.passes[p]) {
        if (first[c] == none) first[c] = p;
        last[c] = p;
      }
  for (std::size_t p = 0; p < model.passes.size(); ++p) {
    if (model.passes[p].kind != pass_kind::backward) continue;
    std::uint64_t live = 1;  // the reduction in flight
    for (std::size_t c = 0; c < first.size(); ++c) live += first[c] != none && first[c] <= p && p <= last[c] ? 1 : 0;
    trace.live_gradients = std::max(trace.live_gradients, live);
  }
  return trace;
}

/// Fetches of one iteration that starts with an empty cache of `blocks` blocks, for the chunks with id >= first_streamed
/// (lower ids are resident and never fetched). A pass's chunks are pinned while it runs; on a miss with a full cache
/// the block whose chunk is used farthest ahead (or never again) is evicted. blocks must be >= the widest pass's
/// streamed chunks.
constexpr std::uint64_t count_fetches(const chunk_trace& trace, std::uint32_t first_streamed, std::uint64_t blocks) {
  // Flatten to (pass, chunk) accesses of streamed chunks, with each access's next use.
  std::vector<std::uint32_t> chunk_of, pass_of;
  for (std::uint32_t s = 0; s < trace.passes.size(); ++s)
    for (const auto c : trace.passes[s])
      if (c >= first_streamed) {
        chunk_of.push_back(c);
        pass_of.push_back(s);
      }
  const std::size_t accesses = chunk_of.size();
  constexpr std::uint64_t never = ~std::uint64_t{0};
  std::vector<std::uint64_t> next_use(accesses, never);
  {
    std::vector<std::pair<std::uint32_t, std::uint64_t>> last_seen;  // chunk -> next access index (small maps)
    for (std::size_t i = accesses; i-- > 0;) {
      auto it = std::find_if(last_seen.begin(), last_seen.end(), [&](const auto& e) { return e.first == chunk_of[i]; });
      if (it != last_seen.end()) {
        next_use[i] = it->second;
        it->second = i;
      } else {
        last_seen.push_back({chunk_of[i], i});
      }
    }
  }
  struct block { std::uint32_t chunk; std::uint64_t next; std::uint32_t pinned_pass; };
  std::vector<block> cache;
  std::uint64_t fetches = 0;
  for (std::size_t i = 0; i < accesses; ++i) {
    auto it = std::find_if(cache.begin(), cache.end(), [&](const block& b) { return b.chunk == chunk_of[i]; });
    if (it != cache.end()) {
      it->next = next_use[i];
      it->pinned_pass = pass_of[i];
      continue;
    }
    ++fetches;
    if (cache.size() < blocks) {
      cache.push_back({chunk_of[i], next_use[i], pass_of[i]});
      continue;
    }
    // Evict the farthest next use among blocks not needed by the running pass.
    block* victim = nullptr;
    for (auto& b : cache)
      if (b.pinned_pass != pass_of[i] && (victim == nullptr || b.next > victim->next)) victim = &b;
    if (victim == nullptr) return never;  // the pass alone needs more blocks than the cache has
    *victim = {chunk_of[i], next_use[i], pass_of[i]};
  }
  return fetches;
}

/// Most streamed chunks (id >= first_streamed) one pass needs at once: the fewest blocks streaming can work with.
constexpr std::uint64_t widest_streamed_pass(const chunk_trace& trace, std::uint32_t first_streamed) {
  std::uint64_t widest = 0;
  for (const auto& pass : trace.passes) {
    std::uint64_t n = 0;
    for (const auto c : pass) n += c >= first_streamed ? 1 : 0;
    widest = std::max(widest, n);
  }
  return widest;
}

}  // namespace chunkwise::detail
