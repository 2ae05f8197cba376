#pragma once
// parameter_fetches: how a chunk's working parameters reach the compute and leave it. The home storage lends its
// device copy (the home itself, or a cache block fetched ahead along the profiled order); when the collective shards
// parameters (ZeRO-3, hybrid) this rank's shard is all-gathered into a full-chunk device buffer, prefetch_depth passes
// ahead of its use (a streamed home's block too: the gather waits for the block's fetch where it runs), and dropped
// after it. The chunk's record holds the gather in flight (`fetching`) and what the trainer reads (`compute`).
// On one rank the shard is the whole chunk: the compute reads the home's device copy as without sharding (a gather
// would only copy it, and the cost model charges none).
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/abi.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/runtime/backend_parts.hpp>
#include <chunkwise/runtime/chunk_record.hpp>
#include <chunkwise/runtime/detail/pass_chunks.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>
#include <chunkwise/runtime/home_view.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace chunkwise::inline CHUNKWISE_ABI {

template <class Collective, communicator Comm, class Homes, class Gradients>
class parameter_fetches {
  static constexpr bool gathers_on_device =
      reaches_device_memory<Comm> && !backend_parts<typename Homes::backend_type>::device_is_host_memory;

 public:
  using record = chunk_record<Comm>;

  parameter_fetches(chunk_collectives<Collective, Comm>& ops, Homes& homes, Gradients& gradients,
                    std::vector<record>& chunks, const detail::pass_chunk_lists& pass_chunks,
                    std::size_t prefetch_depth, dtype type)
      : ops_(&ops), homes_(&homes), gradients_(&gradients), chunks_(&chunks),
        pass_chunks_(&pass_chunks), prefetch_depth_(prefetch_depth), type_(type),
        gathers_(Collective::shards_parameters && ops.ranks() > 1) {
    for (const auto& pass : pass_chunks) widest_pass_ = std::max(widest_pass_, pass.size());
  }
  parameter_fetches(const parameter_fetches&) = delete;
  parameter_fetches& operator=(const parameter_fetches&) = delete;
  ~parameter_fetches() {
    for (auto& b : *chunks_) {  // prefetched gathers still writing into this rank's buffers
      try {
        b.fetch.wait();
      } catch (...) {  // the run already failed; its own error was reported
      }
    }
  }

  [[nodiscard]] std::size_t prefetch_depth() const noexcept { return prefetch_depth_; }
  [[nodiscard]] byte_count gathered_bytes() const noexcept { return gathered_bytes_; }
  /// Gathers started ahead of their pass (prefetch_depth passes along the profiled order).
  [[nodiscard]] std::uint64_t gathers_ahead() const noexcept { return gathers_ahead_; }

  /// released -> fetching: the home's device copy, gathered into the full chunk when the collective shards
  /// parameters. The gather's buffer may make room by completing reductions (`reduced` hands them on), a prefetch
  /// too: whether a prefetch fits must not depend on which reductions happened to finish (timing differs between
  /// ranks, and every rank must issue the same gathers in the same order), so it waits for reductions until its buffer
  /// fits or none is left, and is skipped only then. A prefetch takes a streamed home's cache block without waiting
  /// for its fetch: the gather waits for it where it runs (NCCL: on its stream, after the compute stream's wait).
  template <class Reduced>
  void start(record& b, bool prefetch, Reduced&& reduced) {
    if (gathers_) {
      detail::tier_buffer full;
      try {
        full = gradients_->gathered_buffer(b.full_elements, reduced);
      } catch (const error& e) {
        if (!prefetch || e.code() != error_code::out_of_memory) throw;
        return;
      }
      b.life.start_fetch();
      std::function<void()> home_ready;
      const std::byte* home = nullptr;
      if constexpr (follows_compute_stream<Comm>) {
        // The gather runs after the compute stream's work: it waits there for a block's fetch (NCCL's on a GPU).
        home = lend_home_for_kernels(b);
        if (prefetch) ++gathers_ahead_;
      } else if (prefetch) {
        auto lent = lend_home_ahead(b);
        home = lent.data;
        if (!lent.filled.ready()) home_ready = [filled = std::move(lent.filled)] { filled.wait(); };
        ++gathers_ahead_;
      } else {
        home = lend_home(b);
      }
      b.full = std::move(full);
      visit_element(type_, "runtime", [&]<class T>(T) {
        b.fetch = ops_->template gather_params<T>(std::span<const T>(reinterpret_cast<const T*>(home), b.home_elements),
                                                  b.full.template span<T>(), std::move(home_ready));
      });
      gathered_bytes_ += (b.full_elements - b.home_elements) * size_of(type_);
      b.compute = b.full.template data<std::byte>();
    } else {
      b.life.start_fetch();
      b.compute = lend_home_for_kernels(b);
    }
  }
  /// fetching -> ready: the gather arrived; the gathered copy is what the trainer reads, the home block goes back.
  void finish(record& b) {
    b.fetch.wait();
    b.fetch = {};
    if (gathers_) return_home(b);
    b.life.arrived();
  }
  /// Gathers for the chunks of passes [first, first + prefetch_depth) ahead of their use. A streamed chunk's gather
  /// holds its cache block until the chunk's acquire: prefetches leave one block free for the acquires on demand.
  /// Gathered copies stay within what the cost model charges, the widest pass's chunks plus one: a prefetch beyond
  /// that would take the device memory a later acquire's gradient accumulator or the trainer's activations were
  /// planned in (measured: 2 gathers ahead took 132 KiB past the plan, and a backward acquire ran out). The count is
  /// the same on every rank (copies are dropped at the same passes), so every rank issues the same gathers.
  template <class Reduced>
  void prefetch(std::size_t first, Reduced&& reduced) {
    if (gathers_) {
      std::size_t held = 0, gathered = 0;
      for (const auto& b : *chunks_) {
        held += b.home_held ? 1 : 0;
        gathered += b.full.empty() ? 0 : 1;
      }
      for (std::size_t p = first; p < std::min(first + prefetch_depth_, pass_chunks_->size()); ++p)
        for (const auto c : (*pass_chunks_)[p]) {
          auto& b = (*chunks_)[c];
          if (b.life.state() != chunk_state::released || gathered >= widest_pass_ + 1) continue;
          if (homes_->streamed(c)) {
            if (held + 1 >= homes_->cache_blocks()) continue;
            ++held;
          }
          start(b, /*prefetch=*/true, reduced);
          gathered += b.full.empty() ? 0 : 1;
        }
    }
  }
  /// Prefetched gathers complete and are dropped (before the homes change outside a step).
  void settle() {
    drop_kept(pass_chunks_->size());  // no pass
    for (auto& b : *chunks_)
      if (b.life.state() == chunk_state::fetching) {
        finish(b);
        b.life.evict();
        drop(b);
      }
  }
  /// After a pass's use of chunk b, where the plan drops its device copy (a streamed chunk's cache block, ZeRO-3's
  /// gathered copy): dropped now unless pass `next` uses it too, else kept for `next` (drop_kept).
  void drop_unless_used(record& b, std::size_t next) {
    if (detail::pass_uses(*pass_chunks_, next, b.index)) {
      kept_.push_back(b.index);
      return;
    }
    b.life.evict();
    drop(b);
  }
  /// At the acquire of `pass`: the copies kept for a pass that was expected next and did not come (an evaluation's
  /// forward passes after the head's forward, whose backward it never runs) are dropped unless `pass` uses them.
  /// Kept, they held the cache blocks and gather buffers later passes need.
  void drop_kept(std::size_t pass) {
    for (const auto c : kept_) {
      auto& b = (*chunks_)[c];
      if (b.life.state() == chunk_state::ready && !detail::pass_uses(*pass_chunks_, pass, c)) {
        b.life.evict();
        drop(b);
      }
    }
    kept_.clear();
  }
  /// The gathered copy and the lent home block go back; only a whole resident chunk keeps computing on its home.
  void drop(record& b) {
    b.full = {};
    return_home(b);
    if (homes_->streamed(b.index) || Collective::shards_parameters) b.compute = nullptr;
  }

  /// Elements [first, first + count) of chunk b's working parameters as fp32, read from the home (and gathered when
  /// the collective shards parameters: a collective call, through device buffers where the communicator reaches
  /// device memory only; `reduced` as for start).
  template <class Reduced>
  std::vector<float> read(const record& b, std::size_t first, std::size_t count, Reduced&& reduced) {
    std::vector<float> result(count);
    visit_element(type_, "runtime", [&]<class T>(T) {
      std::vector<T> values;
      homes_->read(b.index, [&](const home_view& home) {
        const auto working = home.working_as<T>();
        values.assign(working.begin(), working.end());
      });
      if constexpr (Collective::shards_parameters && gathers_on_device) {
        auto home = gradients_->device_buffer(values.size(), reduced);
        auto full = gradients_->device_buffer(b.full_elements, reduced);
        home.copy_from_host(0, values.data(), values.size() * sizeof(T));
        ops_->template gather_params<T>(std::span<const T>(home.template span<T>()), full.template span<T>()).wait();
        values.resize(b.full_elements);
        full.copy_to_host(values.data(), 0, full.bytes());
      } else if constexpr (Collective::shards_parameters) {
        std::vector<T> gathered(b.full_elements);
        ops_->template gather_params<T>(std::span<const T>(values), std::span<T>(gathered)).wait();
        values = std::move(gathered);
      }
      for (std::size_t i = 0; i < count; ++i) result[i] = to_float(values[first + i]);
    });
    return result;
  }

 private:
  // The home's device copy; a streamed home's cache block is held until return_home.
  std::byte* lend_home(record& b) {
    b.home_held = homes_->streamed(b.index);
    return homes_->acquire(b.index);
  }
  std::byte* lend_home_for_kernels(record& b) {  // only the trainer's kernels read it: in stream order
    b.home_held = homes_->streamed(b.index);
    return homes_->acquire_for_kernels(b.index);
  }
  auto lend_home_ahead(record& b) {
    b.home_held = homes_->streamed(b.index);
    return homes_->acquire_ahead(b.index);
  }
  void return_home(record& b) {
    if (b.home_held) homes_->release(b.index);
    b.home_held = false;
  }

  chunk_collectives<Collective, Comm>* ops_;
  Homes* homes_;
  Gradients* gradients_;
  std::vector<record>* chunks_;
  const detail::pass_chunk_lists* pass_chunks_;
  std::size_t prefetch_depth_;
  dtype type_;
  byte_count gathered_bytes_ = 0;
  std::uint64_t gathers_ahead_ = 0;
  bool gathers_;  // parameters are sharded over more than one rank
  std::size_t widest_pass_ = 0;  // most chunks one pass touches
  std::vector<std::uint32_t> kept_;  // chunks whose device copy a release kept for the next pass
};

}  // namespace chunkwise
