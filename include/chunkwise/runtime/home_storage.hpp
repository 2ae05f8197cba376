#pragma once
// home_storage<Placement, Backend>: where every chunk's parameters and optimizer moments live between uses, behind
// one interface whatever the placement:
//   resident chunks    parameters in the device tier (the compute reads them in place); moments in the device tier,
//                      or in the pinned host tier when the plan offloads their optimizer states;
//   streamed chunks    cached<Space>, split<Space>: parameters and moments in Space (pinned host, host or NVMe),
//                      lent to the device through a cache of blocks fetched ahead along the profiled order
//                      (runtime/detail/streamed_homes.hpp).
// Chunk ids are the layout's; the first `resident` chunks in first-use order stay on the device, as the cost model
// assumes.
#include <chunkwise/core/abi.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/worker_threads.hpp>
#include <chunkwise/placement/concepts.hpp>
#include <chunkwise/placement/device_cache.hpp>
#include <chunkwise/runtime/backend_parts.hpp>
#include <chunkwise/runtime/detail/streamed_homes.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>
#include <chunkwise/tier/pinned_host.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace chunkwise::inline CHUNKWISE_ABI {

/// What the home storage keeps per chunk, and how the streamed ones are fetched.
struct home_layout {
  std::vector<std::size_t> param_elements;   // per chunk: this rank's home parameters
  std::vector<std::size_t> state_elements;   // per chunk: its owned elements (each Adam moment)
  std::vector<unsigned char> states_on_device;  // per resident chunk: moments in the device tier (else pinned host)
  std::size_t resident = 0;                  // chunks 0..resident-1 stay on the device
  std::vector<std::uint32_t> streamed_order; // the profiled access order of streamed chunks (their local ids)
  std::size_t blocks = 0;                    // device blocks of the cache (streamed placements)
  std::size_t prefetch_depth = 2;
  std::filesystem::path nvme_directory = std::filesystem::temp_directory_path();
};

template <placement_policy Placement, class Backend>
class home_storage {
  static constexpr bool streams = Placement::uses_device_cache;

 public:
  using device_tier = typename backend_parts<Backend>::device_tier;

  home_storage(Backend& backend, device_tier& device, pinned_host_tier& pinned, byte_count host_budget,
               home_layout layout)
      : resident_(layout.resident) {
    for (std::size_t c = 0; c < resident_; ++c) {
      resident_home h;
      h.param = detail::tier_buffer(device, layout.param_elements[c]);
      const bool on_device = layout.states_on_device[c] != 0;
      h.moment1 = on_device ? detail::tier_buffer(device, layout.state_elements[c])
                            : detail::tier_buffer(pinned, layout.state_elements[c]);
      h.moment2 = on_device ? detail::tier_buffer(device, layout.state_elements[c])
                            : detail::tier_buffer(pinned, layout.state_elements[c]);
      residents_.push_back(std::move(h));
    }
    const std::size_t streamed = layout.param_elements.size() - resident_;
    if constexpr (streams) {
      if (streamed > 0) {
        detail::streamed_settings s;
        s.chunks = streamed;
        s.param_elements.assign(layout.param_elements.begin() + static_cast<std::ptrdiff_t>(resident_),
                                layout.param_elements.end());
        s.state_elements.assign(layout.state_elements.begin() + static_cast<std::ptrdiff_t>(resident_),
                                layout.state_elements.end());
        s.order = std::move(layout.streamed_order);
        s.blocks = layout.blocks;
        s.prefetch_depth = layout.prefetch_depth;
        s.nvme_directory = layout.nvme_directory;
        streamed_ = std::make_unique<streamed_holder>(backend, device, pinned, host_budget, std::move(s));
      }
    } else if (streamed > 0) {
      detail::raise(error_code::invalid_argument, std::string(Placement::name) + " keeps every chunk resident; " +
                                                      std::to_string(streamed) + " chunks have no home");
    }
  }

  [[nodiscard]] bool streamed(std::uint32_t c) const noexcept { return c >= resident_; }
  [[nodiscard]] std::size_t streamed_chunks() const noexcept { return streamed_ ? streamed_->chunks() : 0; }

  /// The device copy of chunk c's home parameters: the home itself (resident), or a cache block, fetched ahead or on
  /// demand, until release(c).
  float* acquire(std::uint32_t c) {
    if (!streamed(c)) return residents_[c].param.data();
    return streamed_->acquire(local(c));
  }
  void release(std::uint32_t c) {
    if (streamed(c)) streamed_->release(local(c));
  }

  /// Before chunk c's home changes (an optimizer update, a checkpoint load): drops a cached device copy. On the
  /// thread that acquires and releases. `changed`: the completion of a change that runs on another thread; the
  /// cache fetches the chunk again (a prefetch too) only after it.
  void invalidate(std::uint32_t c, std::shared_ptr<completion> changed = nullptr) {
    if (streamed(c)) streamed_->invalidate(local(c), std::move(changed));
  }
  /// Calls f(parameters, moment1, moment2) on chunk c's home state, which f may change (invalidate(c) first). May
  /// run on another thread than acquire and release, one update at a time.
  template <class F>
  void update(std::uint32_t c, F&& f) {
    if (streamed(c)) return streamed_->update(local(c), std::forward<F>(f));
    auto& h = residents_[c];
    f(h.param.span(), h.moment1.span(), h.moment2.span());
  }
  /// Calls f(parameters, moment1, moment2) on a read-only view of chunk c's home state.
  template <class F>
  void read(std::uint32_t c, F&& f) {
    if (streamed(c)) return streamed_->read(local(c), std::forward<F>(f));
    auto& h = residents_[c];
    f(h.param.span(), h.moment1.span(), h.moment2.span());
  }

  /// After the updates of an iteration: fetch the next iteration's first streamed chunks ahead.
  void prefetch_ahead() {
    if (streamed_) streamed_->prefetch_ahead();
  }

  /// The device cache of streamed chunks (all zero when every chunk is resident).
  [[nodiscard]] cache_stats stats() const { return streamed_ ? streamed_->stats() : cache_stats{}; }
  /// The streamed chunks' home tier (zero when every chunk is resident).
  [[nodiscard]] tier_stats home_stats() const { return streamed_ ? streamed_->home_stats() : tier_stats{}; }

 private:
  struct resident_home {
    detail::tier_buffer param, moment1, moment2;
  };
  struct absent {
    std::size_t chunks() const noexcept { return 0; }
    float* acquire(std::uint32_t) { return nullptr; }
    void release(std::uint32_t) {}
    void invalidate(std::uint32_t, std::shared_ptr<completion>) {}
    template <class F> void update(std::uint32_t, F&&) {}
    template <class F> void read(std::uint32_t, F&&) {}
    void prefetch_ahead() {}
    cache_stats stats() const { return {}; }
    tier_stats home_stats() const { return {}; }
  };
  // resident<> instantiates no cache, transfer engine or home tier.
  using streamed_holder =
      std::conditional_t<streams, detail::streamed_homes<typename Placement::home_space, Backend>, absent>;

  [[nodiscard]] std::uint32_t local(std::uint32_t c) const noexcept {
    return c - static_cast<std::uint32_t>(resident_);
  }

  std::size_t resident_;
  std::vector<resident_home> residents_;
  std::unique_ptr<streamed_holder> streamed_;  // after the residents: destroyed first (its cache waits for moves)
};

}  // namespace chunkwise
