#pragma once
// The transfer engine: asynchronous fetch (home tier -> device block) and write-back (device block -> home tier),
// each returning a completion handle, under a bound on bytes in flight.
//
// Moves between memory spaces are one copy on the backend's dedicated stream (h2d for fetches, d2h for write-backs),
// completed by an event: no host thread blocks. Moves between the device and a file-backed home (NVMe) go through
// pinned staging buffers on a mover thread per direction: O_DIRECT read into staging, then a copy on h2d (and the
// reverse for write-backs). Either way the caller's thread only queues work; `transfer::wait` is where it may block.
//
// One thread issues transfers (the trainer's); completions may be waited for from any thread.
#include <chunkwise/backend/concepts.hpp>
#include <chunkwise/core/worker_threads.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/tier/concepts.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chunkwise {

/// Completion handle of one move. A default-constructed transfer is complete. `wait()` rethrows the move's error
/// (an I/O error, a checksum mismatch): a failed fetch never looks like data.
template <backend Backend>
class transfer {
 public:
  transfer() = default;
  /// Completes with `event` (say, the compute stream's event after the last kernel that used a block), so moves can
  /// be ordered after work the engine did not issue.
  static transfer after_event(Backend& backend, typename Backend::event_type event) {
    return transfer(&backend, std::move(event), 0);
  }
  /// Completes with `done` (host work the engine did not issue, say an optimizer update of the home), so a move can
  /// be ordered after it without the caller waiting.
  static transfer after_completion(std::shared_ptr<completion> done) { return transfer(std::move(done), 0); }

  [[nodiscard]] bool ready() const {
    if (host_) return host_->ready();
    return backend_ == nullptr || backend_->ready(event_);
  }
  void wait() const {
    if (host_) host_->wait();
    else if (backend_ != nullptr) backend_->wait(event_);
  }
  [[nodiscard]] byte_count bytes() const noexcept { return bytes_; }
  /// True when completion is an event of the backend (a stream can wait for it without a host thread).
  [[nodiscard]] bool is_event() const noexcept { return !host_ && backend_ != nullptr; }
  [[nodiscard]] const typename Backend::event_type& event() const noexcept { return event_; }

 private:
  template <backend, memory_tier, memory_tier>
  friend class transfer_engine;

  transfer(Backend* b, typename Backend::event_type e, byte_count n) : backend_(b), event_(std::move(e)), bytes_(n) {}
  transfer(std::shared_ptr<completion> host, byte_count n) : host_(std::move(host)), bytes_(n) {}

  Backend* backend_ = nullptr;
  typename Backend::event_type event_{};
  std::shared_ptr<completion> host_;
  byte_count bytes_ = 0;
};

struct transfer_options {
  byte_count max_bytes_in_flight = 256 * MiB;  // issuing past it waits for the oldest transfer (counted as a stall)
  std::size_t staging_buffers = 2;             // pinned buffers for staged (NVMe) moves; >= 1
  byte_count staging_bytes = 0;                // bytes of one staging buffer (the chunk size); needed when staged
};

struct transfer_stats {
  std::uint64_t fetches = 0;
  std::uint64_t write_backs = 0;
  byte_count bytes_fetched = 0;      // home -> device
  byte_count bytes_written_back = 0;  // device -> home
  std::uint64_t bound_stalls = 0;    // issues that waited for the bytes-in-flight bound
  std::chrono::nanoseconds bound_stall_time{0};
};

/// Moves chunks between a home tier and device blocks (raw device pointers) on `Backend`. `Staging` is the pinned
/// tier the staging buffers come from (used only when the home is file-backed).
template <backend Backend, memory_tier Home, memory_tier Staging = Home>
class transfer_engine {
 public:
  using home_handle = typename Home::handle_type;
  using transfer_type = transfer<Backend>;
  static constexpr bool staged = tier_access<space::device, typename Home::space>::staged;
  static constexpr std::string_view home_space_name = Home::space::name;

  static_assert(tier_movable_v<space::device, typename Home::space> &&
                    tier_movable_v<typename Home::space, space::device>,
                "transfer_engine: no legal move between this home tier and the device (see tier_access)");
  static_assert(!staged || (addressable_tier<Staging> && has_property<Staging, host_accessible>),
                "transfer_engine: a file-backed home needs a host-accessible staging tier (pinned host)");
  static_assert(staged == has_property<Home, file_backed>, "transfer_engine: tier_access and file_backed disagree");

  transfer_engine(Backend& backend, Home& home, transfer_options options = {}) requires(!staged)
      : backend_(backend), home_(home), options_(options) {
    check_options();
  }
  transfer_engine(Backend& backend, Home& home, Staging& staging, transfer_options options)
      : backend_(backend), home_(home), staging_tier_(&staging), options_(options) {
    check_options();
    if constexpr (staged) {
      if (options_.staging_bytes == 0 || options_.staging_buffers == 0)
        detail::raise(error_code::invalid_argument,
                      "transfer_engine: a file-backed home needs staging buffers: staging_buffers = " +
                          std::to_string(options_.staging_buffers) +
                          ", staging_bytes = " + std::to_string(options_.staging_bytes) + " (give the chunk size)");
      staging_bytes_ = round_up(options_.staging_bytes, 4096);
      try {
        for (std::size_t i = 0; i < options_.staging_buffers; ++i)
          free_staging_.push_back(staging.allocate_sync(staging_bytes_, 4096));
      } catch (...) {
        for (void* buffer : free_staging_) staging.deallocate_sync(buffer, staging_bytes_, 4096);
        throw;
      }
      all_staging_ = free_staging_;
      fetch_mover_ = std::make_unique<worker_threads>(1);
      write_back_mover_ = std::make_unique<worker_threads>(1);
    }
  }
  transfer_engine(const transfer_engine&) = delete;
  transfer_engine& operator=(const transfer_engine&) = delete;
  ~transfer_engine() {
    for (auto& entry : outstanding_) {
      try {
        entry.wait();
      } catch (...) {  // the error was the waiter's to see; nothing may throw here
      }
    }
    fetch_mover_.reset();  // joins: no mover touches staging after this
    write_back_mover_.reset();
    if (staging_tier_ != nullptr) {
      for (void* buffer : all_staging_) {
        try {
          staging_tier_->deallocate_sync(buffer, staging_bytes_, 4096);
        } catch (...) {  // teardown must not throw: a failing free leaks the buffer
        }
      }
    }
  }

  /// Copies `bytes` of `source` (a block of the home tier) into `device_block`, after every transfer in `after`.
  transfer_type fetch(void* device_block, home_handle source, byte_count bytes,
                      std::span<const transfer_type> after = {}) {
    admit(bytes);
    ++stats_.fetches;
    stats_.bytes_fetched += bytes;
    transfer_type done;
    if constexpr (staged) {
      done = on_mover(*fetch_mover_, bytes, after, [this, device_block, source, bytes](void* staging) {
        home_.read(source, staging, bytes);
        backend_.copy_async(backend_.h2d(), device_block, staging, bytes);
        backend_.wait(backend_.record(backend_.h2d()));
      });
    } else {
      home_.note_read(bytes);
      done = copy_on(/*to_device=*/true, device_block, source, bytes, after);
    }
    outstanding_.push_back(done);
    return done;
  }

  /// Copies `bytes` of `device_block` into `target` (a block of the home tier), after every transfer in `after`.
  transfer_type write_back(home_handle target, const void* device_block, byte_count bytes,
                           std::span<const transfer_type> after = {}) {
    admit(bytes);
    ++stats_.write_backs;
    stats_.bytes_written_back += bytes;
    transfer_type done;
    if constexpr (staged) {
      done = on_mover(*write_back_mover_, bytes, after, [this, device_block, target, bytes](void* staging) {
        backend_.copy_async(backend_.d2h(), staging, device_block, bytes);
        backend_.wait(backend_.record(backend_.d2h()));
        home_.write(target, staging, bytes);
      });
    } else {
      home_.note_written(bytes);
      done = copy_on(/*to_device=*/false, target, device_block, bytes, after);
    }
    outstanding_.push_back(done);
    return done;
  }

  /// Bytes of transfers issued and not yet seen complete.
  [[nodiscard]] byte_count bytes_in_flight() {
    retire();
    return in_flight_bytes();
  }
  [[nodiscard]] const transfer_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const transfer_options& options() const noexcept { return options_; }
  Backend& backend() noexcept { return backend_; }
  Home& home() noexcept { return home_; }

 private:
  void check_options() const {
    if (options_.max_bytes_in_flight == 0)
      detail::raise(error_code::invalid_argument, "transfer_engine: max_bytes_in_flight is 0; allow at least a chunk");
  }

  byte_count in_flight_bytes() const noexcept {
    byte_count total = 0;
    for (const auto& entry : outstanding_) total += entry.bytes();
    return total;
  }
  void retire() {
    std::erase_if(outstanding_, [](const transfer_type& entry) { return entry.ready(); });
  }
  // Waits (oldest first) until `bytes` more fit under the bound; a transfer larger than the bound runs alone.
  void admit(byte_count bytes) {
    retire();
    if (outstanding_.empty() || in_flight_bytes() + bytes <= options_.max_bytes_in_flight) return;
    const auto start = std::chrono::steady_clock::now();
    while (!outstanding_.empty() && in_flight_bytes() + bytes > options_.max_bytes_in_flight) {
      transfer_type oldest = outstanding_.front();
      outstanding_.pop_front();
      try {
        oldest.wait();
      } catch (...) {  // its owner sees the error through its own handle
      }
      retire();
    }
    ++stats_.bound_stalls;
    stats_.bound_stall_time += std::chrono::steady_clock::now() - start;
  }

  // A direct copy on `stream`: event dependencies become stream waits; a dependency that completes on a host
  // thread (a staged move) routes the copy through a mover so the caller never blocks on it.
  transfer_type copy_on(bool to_device, void* dst, const void* src, byte_count bytes,
                        std::span<const transfer_type> after) {
    bool host_dependency = false;
    for (const auto& dependency : after) host_dependency |= !dependency.is_event() && !dependency.ready();
    if (host_dependency) {
      if (!dependency_mover_) dependency_mover_ = std::make_unique<worker_threads>(1);
      auto state = std::make_shared<completion>();
      std::vector<transfer_type> dependencies(after.begin(), after.end());
      dependency_mover_->push([this, to_device, dst, src, bytes, state, dependencies = std::move(dependencies)] {
        try {
          backend_.bind_thread();
          wait_for_order(dependencies);
          decltype(auto) stream = to_device ? backend_.h2d() : backend_.d2h();
          backend_.copy_async(stream, dst, src, bytes);
          backend_.wait(backend_.record(stream));
          state->complete();
        } catch (...) {
          state->complete(std::current_exception());
        }
      });
      return transfer_type(std::move(state), bytes);
    }
    decltype(auto) stream = to_device ? backend_.h2d() : backend_.d2h();
    for (const auto& dependency : after)
      if (dependency.is_event()) backend_.wait_on(stream, dependency.event());
    backend_.copy_async(stream, dst, src, bytes);
    return transfer_type(&backend_, backend_.record(stream), bytes);
  }

  template <class Move>
  transfer_type on_mover(worker_threads& mover, byte_count bytes, std::span<const transfer_type> after,
                         Move move) {
    auto state = std::make_shared<completion>();
    std::vector<transfer_type> dependencies(after.begin(), after.end());
    mover.push([this, state, move, dependencies = std::move(dependencies)] {
      void* staging = nullptr;
      try {
        backend_.bind_thread();
        wait_for_order(dependencies);
        staging = take_staging();
        move(staging);
        give_staging(staging);
        state->complete();
      } catch (...) {
        if (staging != nullptr) give_staging(staging);
        state->complete(std::current_exception());
      }
    });
    return transfer_type(std::move(state), bytes);
  }

  // Dependencies order moves; they do not taint them: a failed earlier move (its owner sees the error) still
  // counts as finished with the memory it touched.
  static void wait_for_order(const std::vector<transfer_type>& dependencies) noexcept {
    for (const auto& dependency : dependencies) {
      try {
        dependency.wait();
      } catch (...) {
      }
    }
  }

  void* take_staging() {
    std::unique_lock lock(staging_mutex_);
    staging_free_cv_.wait(lock, [this] { return !free_staging_.empty(); });
    void* buffer = free_staging_.back();
    free_staging_.pop_back();
    return buffer;
  }
  void give_staging(void* buffer) {
    {
      std::lock_guard lock(staging_mutex_);
      free_staging_.push_back(buffer);
    }
    staging_free_cv_.notify_one();
  }

  Backend& backend_;
  Home& home_;
  Staging* staging_tier_ = nullptr;
  transfer_options options_;
  byte_count staging_bytes_ = 0;
  std::mutex staging_mutex_;
  std::condition_variable staging_free_cv_;
  std::vector<void*> free_staging_;
  std::vector<void*> all_staging_;
  std::deque<transfer_type> outstanding_;
  transfer_stats stats_;
  // Declared last: destroyed (joined) first, while everything their tasks touch is alive.
  std::unique_ptr<worker_threads> dependency_mover_;
  std::unique_ptr<worker_threads> fetch_mover_;
  std::unique_ptr<worker_threads> write_back_mover_;
};

}  // namespace chunkwise
