#pragma once
// streamed_homes<Space>: the chunks a cached<> or split<> placement keeps off the device. Each streamed chunk has its
// parameters (this rank's home part) and Adam moments in a home tier of Space: the pinned host tier, pageable host
// memory or the NVMe store. A device cache of `blocks` chunk-sized blocks, fed by the transfer engine, holds the
// parameters of the chunks in use, fetched ahead along the profiled order.
//
// The optimizer updates a streamed chunk where its states are (the home; for NVMe through pinned scratch buffers:
// read, update, write back), which makes any cached copy stale: the caller invalidates it first (on the thread that
// drives the cache) and may then run `update` on another thread, beside the next acquires; the next acquire of the
// chunk fetches again (the cost model's cold cache). Updates of different chunks run one at a time (the NVMe
// scratch buffers are shared). Chunks are indexed 0..count-1 here (the runtime maps its chunk ids).
#include <chunkwise/core/abi.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/placement/device_cache.hpp>
#include <chunkwise/runtime/backend_parts.hpp>
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
#include <vector>

namespace chunkwise::detail::inline CHUNKWISE_ABI {

struct streamed_settings {
  std::size_t chunks = 0;                    // streamed chunks
  std::vector<std::size_t> param_elements;   // per chunk: this rank's home parameters
  std::vector<std::size_t> state_elements;   // per chunk: its owned elements (Adam moments)
  std::vector<std::uint32_t> order;          // the profiled access order of streamed chunks (local ids)
  std::size_t blocks = 2;                    // device blocks of the cache
  std::size_t prefetch_depth = 2;
  std::filesystem::path nvme_directory = std::filesystem::temp_directory_path();
};

template <class Space, class Backend>
class streamed_homes {
  static constexpr bool on_nvme = std::same_as<Space, space::nvme>;
  using home_tier = std::conditional_t<on_nvme, nvme_tier,
                                       std::conditional_t<std::same_as<Space, space::host>, host_tier, pinned_host_tier>>;
  using device_tier = typename backend_parts<Backend>::device_tier;
  using engine_type = transfer_engine<Backend, home_tier, pinned_host_tier>;
  using cache_type = device_cache<engine_type, device_tier>;
  using home_handle = typename home_tier::handle_type;

 public:
  /// `device`: where the cache's blocks come from; `pinned`: the pinned host tier (the home for space::pinned_host,
  /// NVMe staging and scratch otherwise); `host_budget`: the budget of a pageable host home.
  streamed_homes(Backend& backend, device_tier& device, pinned_host_tier& pinned, byte_count host_budget,
                 streamed_settings s)
      : settings_(std::move(s)),
        block_elements_(std::max<std::size_t>(1, *std::max_element(settings_.param_elements.begin(),
                                                                  settings_.param_elements.end()))),
        home_(make_home(pinned, host_budget)),
        engine_(make_engine(backend, pinned)) {
    const byte_count block_bytes = block_elements_ * sizeof(float);
    std::vector<home_handle> params;
    for (std::size_t c = 0; c < settings_.chunks; ++c) {
      if constexpr (on_nvme) {
        chunk_home h;
        h.param = home_->allocate_sync(block_bytes);
        h.moment1 = home_->allocate_sync(block_bytes);
        h.moment2 = home_->allocate_sync(block_bytes);
        homes_.push_back(h);
        params.push_back(h.param);
      } else {
        chunk_home h;
        h.param = tier_buffer(*home_, block_elements_);  // whole blocks: the cache moves block_bytes
        h.moment1 = tier_buffer(*home_, settings_.state_elements[c]);
        h.moment2 = tier_buffer(*home_, settings_.state_elements[c]);
        params.push_back(h.param.data());
        homes_.push_back(std::move(h));
      }
    }
    if constexpr (on_nvme) {
      for (auto* buffer : {&scratch_param_, &scratch_moment1_, &scratch_moment2_})
        *buffer = tier_buffer(pinned, round_up(block_bytes, nvme_tier::io_alignment) / sizeof(float));
      // Every block written once (zeros; the runtime's first update fills the parameters): reads never meet an
      // unwritten block.
      for (const auto& h : homes_)
        for (const auto block : {h.param, h.moment1, h.moment2})
          home_->write(block, scratch_param_.data(), block_bytes);
    }
    cache_.emplace(*engine_, device, std::move(params), settings_.order,
                   cache_options{.blocks = settings_.blocks, .chunk_bytes = block_bytes,
                                 .prefetch_depth = settings_.prefetch_depth});
  }
  streamed_homes(const streamed_homes&) = delete;
  streamed_homes& operator=(const streamed_homes&) = delete;
  ~streamed_homes() {
    cache_.reset();   // waits for its moves before the homes go
    engine_.reset();
    if constexpr (on_nvme)
      for (const auto& h : homes_)
        for (const auto block : {h.param, h.moment1, h.moment2}) home_->deallocate_sync(block);
    homes_.clear();
  }

  /// The device copy of chunk c's home parameters (param_elements[c] floats), until release(c).
  float* acquire(std::uint32_t c) { return static_cast<float*>(cache_->acquire(c)); }
  void release(std::uint32_t c) { cache_->release(c); }

  /// Drops chunk c's cached copy before its home changes (on the thread that acquires and releases); `changed`: the
  /// completion of a change running elsewhere, which every later fetch of the chunk waits for.
  void invalidate(std::uint32_t c, std::shared_ptr<completion> changed = nullptr) {
    cache_->invalidate(c, changed ? engine_type::transfer_type::after_completion(std::move(changed))
                                  : typename engine_type::transfer_type{});
  }
  /// Calls f(parameters, moment1, moment2) on chunk c's home state, which f may change; invalidate(c) first. May run
  /// on another thread than acquire and release; one update at a time.
  template <class F>
  void update(std::uint32_t c, F&& f) {
    visit(c, /*write=*/true, std::forward<F>(f));
  }
  /// Calls f(parameters, moment1, moment2) on a read-only view of chunk c's home state.
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
  struct chunk_home {
    std::conditional_t<on_nvme, nvme_block, tier_buffer> param{}, moment1{}, moment2{};
  };

  std::unique_ptr<home_tier, void (*)(home_tier*)> make_home(pinned_host_tier& pinned, byte_count host_budget) {
    const byte_count block_bytes = block_elements_ * sizeof(float);
    if constexpr (on_nvme) {
      const byte_count slot = round_up(block_bytes, nvme_tier::io_alignment);
      nvme_options store;
      store.directory = settings_.nvme_directory;
      store.capacity = 3 * slot * settings_.chunks;  // parameters and two moments per chunk
      store.block_bytes = block_bytes;
      return {new nvme_tier(store), [](home_tier* t) { delete t; }};
    } else if constexpr (std::same_as<Space, space::host>) {
      return {new host_tier(host_budget), [](home_tier* t) { delete t; }};
    } else {
      (void)host_budget;
      return {&pinned, [](home_tier*) {}};  // the runtime's pinned tier: one budget for homes and offloaded states
    }
  }
  std::unique_ptr<engine_type> make_engine(Backend& backend, pinned_host_tier& pinned) {
    if constexpr (on_nvme)
      return std::make_unique<engine_type>(backend, *home_, pinned,
                                           transfer_options{.staging_buffers = 2,
                                                            .staging_bytes = block_elements_ * sizeof(float)});
    else
      return std::make_unique<engine_type>(backend, *home_, pinned, transfer_options{});
  }

  template <class F>
  void visit(std::uint32_t c, bool write, F&& f) {
    if (c >= homes_.size())
      raise(error_code::invalid_argument, "streamed_homes: chunk " + std::to_string(c) + " of " +
                                              std::to_string(homes_.size()));
    const std::size_t params = settings_.param_elements[c], states = settings_.state_elements[c];
    auto& h = homes_[c];
    if constexpr (on_nvme) {
      const byte_count bytes = block_elements_ * sizeof(float);
      home_->read(h.param, scratch_param_.data(), bytes);
      home_->read(h.moment1, scratch_moment1_.data(), bytes);
      home_->read(h.moment2, scratch_moment2_.data(), bytes);
      f(std::span<float>(scratch_param_.data(), params), std::span<float>(scratch_moment1_.data(), states),
        std::span<float>(scratch_moment2_.data(), states));
      if (write) {
        home_->write(h.param, scratch_param_.data(), bytes);
        home_->write(h.moment1, scratch_moment1_.data(), bytes);
        home_->write(h.moment2, scratch_moment2_.data(), bytes);
      }
    } else {
      (void)write;
      f(std::span<float>(h.param.data(), params), h.moment1.span(), h.moment2.span());
    }
  }

  streamed_settings settings_;
  std::size_t block_elements_;
  std::unique_ptr<home_tier, void (*)(home_tier*)> home_;
  std::unique_ptr<engine_type> engine_;
  std::vector<chunk_home> homes_;
  tier_buffer scratch_param_, scratch_moment1_, scratch_moment2_;  // NVMe only: pinned, I/O-aligned
  std::optional<cache_type> cache_;
};

}  // namespace chunkwise::detail
