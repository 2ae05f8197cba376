#pragma once
// home_storage<Placement, Backend>: where every chunk's parameters and optimizer states live between uses, behind
// one interface whatever the placement (each chunk's state as a home_view: working parameters in the compute type,
// fp32 master weights, moments):
//   resident chunks    working parameters in the device tier (the compute reads them in place); master weights (in
//                      bf16/fp16) and moments in the device tier, or in the pinned host tier when the plan offloads
//                      their optimizer states;
//   streamed chunks    cached<Space>, split<Space>: everything in Space (pinned host, host or NVMe), the working
//                      parameters lent to the device through a cache of blocks fetched ahead along the profiled order
//                      (runtime/detail/streamed_homes.hpp).
// Chunk ids are the layout's; the first `resident` chunks in first-use order stay on the device, as the cost model
// assumes.
#include <chunkwise/core/abi.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/worker_threads.hpp>
#include <chunkwise/placement/concepts.hpp>
#include <chunkwise/placement/device_cache.hpp>
#include <chunkwise/runtime/backend_parts.hpp>
#include <chunkwise/runtime/home_view.hpp>
#include <chunkwise/runtime/detail/streamed_homes.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>
#include <chunkwise/tier/pinned_host.hpp>
#include <chunkwise/tier/transfer_engine.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace chunkwise::inline CHUNKWISE_ABI {

/// What the home storage keeps per chunk, and how the streamed ones are fetched.
struct home_layout {
  std::vector<std::size_t> param_elements;   // per chunk: this rank's home parameters
  std::vector<std::size_t> state_elements;   // per chunk: its owned elements (each Adam moment)
  std::vector<std::size_t> owned_offset;     // per chunk: where the owned elements start in its home parameters
  dtype type = dtype::fp32;                  // the working parameters' element type
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
  using pinned_tier = typename backend_parts<Backend>::pinned_tier;
  using backend_type = Backend;

  home_storage(Backend& backend, device_tier& device, pinned_tier& pinned, byte_count host_budget,
               home_layout layout)
      : resident_(layout.resident), type_(layout.type), owned_offset_(layout.owned_offset) {
    for (std::size_t c = 0; c < resident_; ++c) {
      resident_home h;
      h.param = detail::tier_buffer(device, layout.param_elements[c], type_);
      const auto states = [&] {
        return layout.states_on_device[c] != 0 ? detail::tier_buffer(device, layout.state_elements[c])
                                               : detail::tier_buffer(pinned, layout.state_elements[c]);
      };
      if (type_ != dtype::fp32) h.master = states();
      h.moment1 = states();
      h.moment2 = states();
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
        s.owned_offset.assign(layout.owned_offset.begin() + static_cast<std::ptrdiff_t>(resident_),
                              layout.owned_offset.end());
        s.type = type_;
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

  /// The working parameters' element type.
  [[nodiscard]] dtype type() const noexcept { return type_; }

  /// The device copy of chunk c's home parameters: the home itself (resident), or a cache block, fetched ahead or on
  /// demand, until release(c).
  std::byte* acquire(std::uint32_t c) {
    if (!streamed(c)) return residents_[c].param.template data<std::byte>();
    return streamed_->acquire(local(c));
  }
  /// acquire(c) for the trainer's kernels on the backend's compute stream (a GPU's legacy default stream, which
  /// every blocking stream is ordered with): where the host cannot address the device, a cache block's fetch still
  /// in flight is left for that stream to wait on, so the trainer's thread goes on queuing kernels. The host
  /// backend's trainer reads the chunk on its own thread at once: it waits here.
  std::byte* acquire_for_kernels(std::uint32_t c) {
    if constexpr (backend_parts<Backend>::device_is_host_memory) return acquire(c);
    else return streamed(c) ? streamed_->acquire_for_kernels(local(c)) : acquire(c);
  }
  void release(std::uint32_t c) {
    if (streamed(c)) streamed_->release(local(c));
  }
  /// acquire(c) that does not wait for a cache block's fetch: the device copy and the fetch that fills it (complete
  /// for a resident chunk), for a consumer that orders itself after it; release(c) once that consumer is done.
  struct lent_home {
    std::byte* data = nullptr;
    transfer<Backend> filled{};
  };
  lent_home acquire_ahead(std::uint32_t c) {
    if (!streamed(c)) return {residents_[c].param.template data<std::byte>(), {}};
    auto [data, filled] = streamed_->acquire_ahead(local(c));
    return {data, std::move(filled)};
  }
  /// The device cache's blocks (0 when every chunk is resident): how many streamed chunks can be held at once.
  [[nodiscard]] std::size_t cache_blocks() const noexcept { return streamed_ ? streamed_->blocks() : 0; }

  /// Before chunk c's home changes (an optimizer update, a checkpoint load): drops a cached device copy. On the
  /// thread that acquires and releases. `changed`: the completion of a change that runs on another thread; the
  /// cache fetches the chunk again (a prefetch too) only after it.
  void invalidate(std::uint32_t c, std::shared_ptr<completion> changed = nullptr) {
    if (streamed(c)) streamed_->invalidate(local(c), std::move(changed));
  }
  /// Calls f(home_view) on chunk c's home state, which f may change (invalidate(c) first). May run on another thread
  /// than acquire and release, one update at a time.
  template <class F>
  void update(std::uint32_t c, F&& f) {
    if (streamed(c)) return streamed_->update(local(c), std::forward<F>(f));
    on_host(c, f, /*write_back=*/true);
  }
  /// The optimizer's update of chunk c: f(home_view) on its home state, on any thread, one at a time; `done` (may be
  /// null) completes once the new state is in the home (NVMe homes write it back behind the caller), or with the
  /// failure. invalidate(c, done) first. A resident chunk's view is its memory where it lives (device addresses for
  /// a device the host cannot address: f hands them to the device's optimizer), or a host copy when its states are
  /// offloaded from such a device.
  template <class F>
  void update_async(std::uint32_t c, F&& f, std::shared_ptr<completion> done = nullptr) {
    if (streamed(c)) return streamed_->update_async(local(c), std::forward<F>(f), std::move(done));
    run_then_complete(done, [&] {
      // States offloaded from a device the host cannot address: the CPU updates a host copy of the working
      // parameters (fp32: they are the master weights) and the new ones go back up, as ZeRO-Offload's do.
      if (states_offloaded_from_device(c)) return on_host(c, f, /*write_back=*/true);
      f(resident_view(c));
    });
  }
  /// Chunk c is the next to update: NVMe homes start reading its state, its working block from the device cache's
  /// copy where there is one (on the thread that acquires and releases, before invalidate(c)).
  void prepare_update(std::uint32_t c) {
    if (streamed(c)) streamed_->prepare_update(local(c));
  }
  /// Waits for every update's write-back in flight (before the homes are fetched or read again); rethrows the first
  /// failure.
  void drain_updates() {
    if (streamed_) streamed_->drain_updates();
  }
  /// Whether update(c, f) hands f chunk c's home memory itself (not a copy written back after f): what f starts may
  /// then go on writing into it after update returns.
  [[nodiscard]] bool changes_in_place(std::uint32_t c) const noexcept {
    if (streamed(c)) return streamed_->changes_in_place();
    return in_host_memory(c);
  }
  /// Calls f(home_view) on chunk c's home state, which f only reads.
  template <class F>
  void read(std::uint32_t c, F&& f) {
    if (streamed(c)) return streamed_->read(local(c), std::forward<F>(f));
    on_host(c, f, /*write_back=*/false);
  }

  /// After the updates of an iteration: fetch the next iteration's first streamed chunks ahead.
  void prefetch_ahead() {
    if (streamed_) streamed_->prefetch_ahead();
  }

  /// The device cache of streamed chunks (all zero when every chunk is resident).
  [[nodiscard]] cache_stats stats() const { return streamed_ ? streamed_->stats() : cache_stats{}; }
  /// The streamed chunks' home tier (zero when every chunk is resident).
  [[nodiscard]] tier_stats home_stats() const { return streamed_ ? streamed_->home_stats() : tier_stats{}; }
  [[nodiscard]] nvme_update_stats nvme_updates() const {
    return streamed_ ? streamed_->nvme_updates() : nvme_update_stats{};
  }

 private:
  struct resident_home {
    detail::tier_buffer param, master, moment1, moment2;  // master: bf16/fp16 only
  };
  home_view resident_view(std::uint32_t c) {
    auto& h = residents_[c];
    return home_view::of(h.param.template data<std::byte>(), h.param.bytes() / size_of(type_), type_, owned_offset_[c],
                         h.master.data(), h.moment1.data(), h.moment2.data(), h.moment1.span().size());
  }
  // Whether resident chunk c's parameters and states are all memory the host may touch (the host backend's device).
  bool in_host_memory(std::uint32_t c) const noexcept {
    return residents_[c].param.host_accessible() && residents_[c].moment1.host_accessible();
  }
  // Whether its parameters are on a device the host cannot address and its states in a host tier (offloaded).
  bool states_offloaded_from_device(std::uint32_t c) const noexcept {
    return !residents_[c].param.host_accessible() && residents_[c].moment1.host_accessible();
  }
  // f(home_view) on resident chunk c from the host (initialisation, checkpoints, reads): arrays in device memory the
  // host cannot address are copied to the host first and, when f may change them, back after.
  template <class F>
  void on_host(std::uint32_t c, F& f, bool write_back) {
    auto& h = residents_[c];
    if (in_host_memory(c)) return f(resident_view(c));
    detail::host_window param(h.param), master(h.master), moment1(h.moment1), moment2(h.moment2);
    f(home_view::of(param.data<std::byte>(), h.param.bytes() / size_of(type_), type_, owned_offset_[c],
                    master.data(), moment1.data(), moment2.data(), h.moment1.span().size()));
    if (!write_back) return;
    for (auto* window : {&param, &master, &moment1, &moment2}) window->write_back();
  }
  struct absent {
    std::size_t chunks() const noexcept { return 0; }
    std::byte* acquire(std::uint32_t) { return nullptr; }
    std::byte* acquire_for_kernels(std::uint32_t) { return nullptr; }
    void release(std::uint32_t) {}
    std::pair<std::byte*, transfer<Backend>> acquire_ahead(std::uint32_t) { return {}; }
    std::size_t blocks() const noexcept { return 0; }
    bool changes_in_place() const noexcept { return true; }
    void invalidate(std::uint32_t, std::shared_ptr<completion>) {}
    template <class F> void update(std::uint32_t, F&&) {}
    template <class F> void update_async(std::uint32_t, F&&, std::shared_ptr<completion>) {}
    void prepare_update(std::uint32_t) {}
    void drain_updates() {}
    template <class F> void read(std::uint32_t, F&&) {}
    void prefetch_ahead() {}
    cache_stats stats() const { return {}; }
    tier_stats home_stats() const { return {}; }
    nvme_update_stats nvme_updates() const { return {}; }
  };
  // resident<> instantiates no cache, transfer engine or home tier.
  using streamed_holder =
      std::conditional_t<streams, detail::streamed_homes<typename Placement::home_space, Backend>, absent>;

  [[nodiscard]] std::uint32_t local(std::uint32_t c) const noexcept {
    return c - static_cast<std::uint32_t>(resident_);
  }

  std::size_t resident_;
  dtype type_;
  std::vector<std::size_t> owned_offset_;
  std::vector<resident_home> residents_;
  std::unique_ptr<streamed_holder> streamed_;  // after the residents: destroyed first (its cache waits for moves)
};

}  // namespace chunkwise
