#pragma once
// streamed_homes<Space>: the chunks a cached<> or split<> placement keeps off the device. Each streamed chunk has its
// working parameters (this rank's home part, in the compute type), its fp32 master weights (bf16/fp16 only) and Adam
// moments in a home tier of Space: the pinned host tier, pageable host memory or the NVMe store. A device cache of
// `blocks` chunk-sized blocks, fed by the transfer engine, holds the working parameters of the chunks in use, fetched
// ahead along the profiled order: in bf16/fp16 the cache moves half the bytes of fp32.
//
// The optimizer updates a streamed chunk where its states are (the home; for NVMe through pinned scratch copies,
// pipelined: the next chunk's blocks are read and the last one's written back while one updates, see
// nvme_update_pipeline.hpp), which makes any cached copy stale: the caller invalidates it first (on the thread that
// drives the cache), handing over the completion its update will signal, and may then run `update_async` on another
// thread, beside the next acquires; the next fetch of the chunk waits for that completion (the cost model's cold
// cache). Updates run one at a time. Chunks are indexed 0..count-1 here (the runtime maps its chunk ids).
#include <chunkwise/core/abi.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/placement/device_cache.hpp>
#include <chunkwise/runtime/backend_parts.hpp>
#include <chunkwise/runtime/detail/nvme_update_pipeline.hpp>
#include <chunkwise/runtime/home_view.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>
#include <chunkwise/tier/host.hpp>
#include <chunkwise/tier/nvme.hpp>
#include <chunkwise/tier/pinned_host.hpp>
#include <chunkwise/tier/spaces.hpp>
#include <chunkwise/tier/transfer_engine.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace chunkwise::detail::inline CHUNKWISE_ABI {

struct streamed_settings {
  std::size_t chunks = 0;                    // streamed chunks
  std::vector<std::size_t> param_elements;   // per chunk: this rank's home parameters
  std::vector<std::size_t> state_elements;   // per chunk: its owned elements (Adam moments)
  std::vector<std::size_t> owned_offset;     // per chunk: where the owned elements start in its home parameters
  dtype type = dtype::fp32;                  // the working parameters' element type
  std::vector<std::uint32_t> order;          // the profiled access order of streamed chunks (local ids)
  std::size_t blocks = 2;                    // device blocks of the cache
  std::size_t prefetch_depth = 2;
  std::filesystem::path nvme_directory = std::filesystem::temp_directory_path();
};

template <class Space, class Backend>
class streamed_homes {
  static constexpr bool on_nvme = std::same_as<Space, space::nvme>;
  using pinned_tier = typename backend_parts<Backend>::pinned_tier;
  using home_tier = std::conditional_t<on_nvme, nvme_tier,
                                       std::conditional_t<std::same_as<Space, space::host>, host_tier, pinned_tier>>;
  using device_tier = typename backend_parts<Backend>::device_tier;
  using engine_type = transfer_engine<Backend, home_tier, pinned_tier>;
  using cache_type = device_cache<engine_type, device_tier>;
  using home_handle = typename home_tier::handle_type;

 public:
  /// `device`: where the cache's blocks come from; `pinned`: the pinned host tier (the home for space::pinned_host,
  /// NVMe staging and scratch otherwise); `host_budget`: the budget of a pageable host home.
  streamed_homes(Backend& backend, device_tier& device, pinned_tier& pinned, byte_count host_budget,
                 streamed_settings s)
      : settings_(std::move(s)),
        device_(&device),
        block_elements_(std::max<std::size_t>(1, *std::max_element(settings_.param_elements.begin(),
                                                                  settings_.param_elements.end()))),
        block_bytes_(block_elements_ * size_of(settings_.type)),
        state_bytes_(std::max<std::size_t>(1, *std::max_element(settings_.state_elements.begin(),
                                                                settings_.state_elements.end())) *
                     sizeof(float)),
        home_(make_home(pinned, host_budget)),
        engine_(make_engine(backend, pinned)) {
    std::vector<home_handle> params;
    for (std::size_t c = 0; c < settings_.chunks; ++c) {
      chunk_home h;
      if constexpr (on_nvme) {
        h.param = home_->allocate_sync(block_bytes_);
        for (auto* state : states_of(h)) *state = home_->allocate_sync(state_bytes_);
        params.push_back(h.param);
      } else {
        h.param = tier_buffer(*home_, block_elements_, settings_.type);  // whole blocks: the cache moves block_bytes
        for (auto* state : states_of(h)) *state = tier_buffer(*home_, settings_.state_elements[c]);
        params.push_back(h.param.template data<std::byte>());
      }
      homes_.push_back(std::move(h));
    }
    if constexpr (on_nvme) {
      {
        // Every block written once (zeros; the runtime's first update fills the parameters): reads never meet an
        // unwritten block.
        const tier_buffer zeros(pinned, round_up(std::max(block_bytes_, state_bytes_), nvme_tier::io_alignment),
                                dtype::uint8);
        for (auto& h : homes_) {
          home_->write(h.param, zeros.data<std::byte>(), block_bytes_);
          for (auto* state : states_of(h)) home_->write(*state, zeros.data<std::byte>(), state_bytes_);
        }
      }
      std::vector<nvme_chunk_state> states;
      for (std::size_t c = 0; c < settings_.chunks; ++c)
        states.push_back({homes_[c].param, homes_[c].master, homes_[c].moment1, homes_[c].moment2,
                          settings_.param_elements[c], settings_.state_elements[c], settings_.owned_offset[c]});
      pipeline_ = std::make_unique<nvme_update_pipeline>(*home_, pinned, std::move(states), settings_.type,
                                                         block_bytes_, state_bytes_);
    }
    cache_.emplace(*engine_, device, std::move(params), settings_.order,
                   cache_options{.blocks = settings_.blocks, .chunk_bytes = block_bytes_,
                                 .prefetch_depth = settings_.prefetch_depth});
  }
  streamed_homes(const streamed_homes&) = delete;
  streamed_homes& operator=(const streamed_homes&) = delete;
  ~streamed_homes() {
    cache_.reset();   // waits for its moves before the homes go
    engine_.reset();
    pipeline_.reset();
    if constexpr (on_nvme)
      for (auto& h : homes_) {
        home_->deallocate_sync(h.param);
        for (auto* state : states_of(h)) home_->deallocate_sync(*state);
      }
    homes_.clear();
  }

  /// The device copy of chunk c's working parameters (param_elements[c] elements), until release(c).
  std::byte* acquire(std::uint32_t c) { return static_cast<std::byte*>(cache_->acquire(c)); }
  /// acquire(c) for the trainer's kernels, which run on the backend's compute stream: a fetch still in flight is
  /// waited for there, not here, unless it completes on a host thread (device_cache::acquire_for).
  std::byte* acquire_for_kernels(std::uint32_t c) {
    return static_cast<std::byte*>(cache_->acquire_for(c, engine_->backend().compute()));
  }
  void release(std::uint32_t c) { cache_->release(c); }
  /// acquire(c) without waiting for the block's fetch: its memory and the fetch, for a consumer that orders itself
  /// after it (a gather prefetched from the block); release(c) after the consumer is done.
  std::pair<std::byte*, typename engine_type::transfer_type> acquire_ahead(std::uint32_t c) {
    auto lent = cache_->acquire_ahead(c);
    return {static_cast<std::byte*>(lent.memory), std::move(lent.filled)};
  }
  /// The device blocks of the cache.
  [[nodiscard]] std::size_t blocks() const noexcept { return cache_->options().blocks; }

  /// Drops chunk c's cached copy before its home changes (on the thread that acquires and releases); `changed`: the
  /// completion of a change running elsewhere, which every later fetch of the chunk waits for.
  void invalidate(std::uint32_t c, std::shared_ptr<completion> changed = nullptr) {
    cache_->invalidate(c, changed ? engine_type::transfer_type::after_completion(std::move(changed))
                                  : typename engine_type::transfer_type{});
  }
  /// Calls f(home_view) on chunk c's home state, which f may change, and writes it back at once; invalidate(c) first.
  /// Between steps (initialisation, checkpoints, publication).
  template <class F>
  void update(std::uint32_t c, F&& f) {
    visit(c, /*write=*/true, std::forward<F>(f));
  }
  /// The optimizer's update of chunk c: f(home_view) on its state, on any thread, one at a time; `done` (may be
  /// null) completes once the new state is in the home (NVMe: written back behind the caller), or with the failure.
  template <class F>
  void update_async(std::uint32_t c, F&& f, std::shared_ptr<completion> done) {
    if constexpr (on_nvme) {
      pipeline_->update(c, std::forward<F>(f), std::move(done));
    } else {
      run_then_complete(done, [&] { visit(c, /*write=*/true, std::forward<F>(f)); });
    }
  }
  /// Chunk c's update comes next: NVMe homes read its blocks ahead, taking its working block from the device cache's
  /// copy where there is one (so each block is read from the drive once a step). On the thread that drives the
  /// cache, before invalidate(c).
  void prepare_update(std::uint32_t c) {
    if constexpr (on_nvme) {
      const void* cached = cache_->clean_block(c);
      if (cached == nullptr) return pipeline_->prepare(c);
      pipeline_->prepare(c, [&](std::byte* destination) {
        tier_buffer_ops_for<device_tier>.to_host(device_, destination, cached, block_bytes_);
      });
    }
  }
  /// The NVMe updates' counts (zero for other homes).
  [[nodiscard]] nvme_update_stats nvme_updates() const { return pipeline_ ? pipeline_->stats() : nvme_update_stats{}; }
  /// Waits for the updates' write-backs in flight; rethrows the first that failed.
  void drain_updates() {
    if constexpr (on_nvme) pipeline_->drain();
  }
  /// Whether update() hands f the home memory itself: pinned and pageable host homes; NVMe homes are read into
  /// scratch and written back.
  static constexpr bool changes_in_place() noexcept { return !on_nvme; }
  /// Calls f(home_view) on chunk c's home state, which f only reads.
  template <class F>
  void read(std::uint32_t c, F&& f) {
    visit(c, /*write=*/false, std::forward<F>(f));
  }

  /// After updates: fetch the next iteration's first chunks ahead.
  void prefetch_ahead() { cache_->prefetch_ahead(); }

  [[nodiscard]] const cache_stats& stats() const { return cache_->stats(); }
  [[nodiscard]] tier_stats home_stats() const { return home_->stats(); }
  [[nodiscard]] std::size_t chunks() const noexcept { return settings_.chunks; }

 private:
  using home_block = std::conditional_t<on_nvme, nvme_block, tier_buffer>;
  struct chunk_home {
    home_block param{}, master{}, moment1{}, moment2{};  // master: bf16/fp16 only
  };
  // The fp32 arrays of a chunk's home: master weights when they are separate, the moments.
  std::vector<home_block*> states_of(chunk_home& h) const {
    if (settings_.type == dtype::fp32) return {&h.moment1, &h.moment2};
    return {&h.master, &h.moment1, &h.moment2};
  }

  std::unique_ptr<home_tier, void (*)(home_tier*)> make_home(pinned_tier& pinned, byte_count host_budget) {
    if constexpr (on_nvme) {
      const byte_count block = std::max(block_bytes_, state_bytes_);
      const std::size_t arrays = settings_.type == dtype::fp32 ? 3 : 4;  // parameters, (master,) two moments
      nvme_options store;
      store.directory = settings_.nvme_directory;
      store.capacity = arrays * round_up(block, nvme_tier::io_alignment) * settings_.chunks;
      store.block_bytes = block;
      return {new nvme_tier(store), [](home_tier* t) { delete t; }};
    } else if constexpr (std::same_as<Space, space::host>) {
      return {new host_tier(host_budget), [](home_tier* t) { delete t; }};
    } else {
      (void)host_budget;
      return {&pinned, [](home_tier*) {}};  // the runtime's pinned tier: one budget for homes and offloaded states
    }
  }
  std::unique_ptr<engine_type> make_engine(Backend& backend, pinned_tier& pinned) {
    if constexpr (on_nvme)
      return std::make_unique<engine_type>(backend, *home_, pinned,
                                           transfer_options{.staging_buffers = 2,
                                                            .staging_bytes = block_bytes_});
    else
      return std::make_unique<engine_type>(backend, *home_, pinned, transfer_options{});
  }

  template <class F>
  void visit(std::uint32_t c, bool write, F&& f) {
    if (c >= homes_.size())
      raise(error_code::invalid_argument, "streamed_homes: chunk " + std::to_string(c) + " of " +
                                              std::to_string(homes_.size()));
    if constexpr (on_nvme) {
      pipeline_->visit(c, write, std::forward<F>(f));
    } else {
      (void)write;
      const std::size_t params = settings_.param_elements[c], states = settings_.state_elements[c];
      auto& h = homes_[c];
      f(home_view::of(h.param.template data<std::byte>(), params, settings_.type, settings_.owned_offset[c],
                      h.master.data(), h.moment1.data(), h.moment2.data(), states));
    }
  }

  streamed_settings settings_;
  device_tier* device_;     // the cache's blocks: a working block handed to an update is copied down through it
  std::size_t block_elements_;
  byte_count block_bytes_;  // one cache block: the largest home part's working parameters
  byte_count state_bytes_;  // the largest owned part in fp32 (master weights, each moment)
  std::unique_ptr<home_tier, void (*)(home_tier*)> home_;
  std::unique_ptr<engine_type> engine_;
  std::vector<chunk_home> homes_;
  std::unique_ptr<nvme_update_pipeline> pipeline_;  // NVMe only: the blocks' pinned scratch copies and their I/O
  std::optional<cache_type> cache_;
};

}  // namespace chunkwise::detail
