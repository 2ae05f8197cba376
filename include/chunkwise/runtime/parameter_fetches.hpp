#pragma once
// parameter_fetches: how a chunk's working parameters reach the compute and leave it. The home storage lends its
// device copy (the home itself, or a cache block fetched ahead along the profiled order); when the collective shards
// parameters (ZeRO-3, hybrid) this rank's shard is all-gathered into a full-chunk device buffer, prefetch_depth passes
// ahead of its use, and dropped after it. The chunk's record holds the gather in flight (`fetching`) and what the
// trainer reads (`compute`).
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/runtime/chunk_record.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>
#include <chunkwise/runtime/home_view.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace chunkwise {

template <class Collective, communicator Comm, class Homes, class Gradients, class DeviceTier>
class parameter_fetches {
 public:
  using record = chunk_record<Comm>;

  parameter_fetches(chunk_collectives<Collective, Comm>& ops, Homes& homes, Gradients& gradients, DeviceTier& device,
                    std::vector<record>& chunks, const std::vector<std::vector<std::uint32_t>>& pass_chunks,
                    std::size_t prefetch_depth, dtype type)
      : ops_(&ops), homes_(&homes), gradients_(&gradients), device_(&device), chunks_(&chunks),
        pass_chunks_(&pass_chunks), prefetch_depth_(prefetch_depth), type_(type) {}
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

  /// released -> fetching: the home's device copy, gathered into the full chunk when the collective shards
  /// parameters. The gather's buffer may make room by completing reductions (`reduced` hands them on); a prefetch
  /// skips a chunk the device tier has no room for now.
  template <class Reduced>
  void start(record& b, bool prefetch, Reduced&& reduced) {
    if constexpr (Collective::shards_parameters) {
      detail::tier_buffer full;
      if (!prefetch) full = gradients_->device_buffer(b.full_elements, reduced);
      else {
        try {
          full = detail::tier_buffer(*device_, b.full_elements, type_);
        } catch (const error& e) {
          if (e.code() == error_code::out_of_memory) return;
          throw;
        }
      }
      b.life.start_fetch();
      const std::byte* home = lend_home(b);
      b.full = std::move(full);
      visit_element(type_, "runtime", [&]<class T>(T) {
        b.fetch = ops_->template gather_params<T>(std::span<const T>(reinterpret_cast<const T*>(home), b.home_elements),
                                                  b.full.template span<T>());
      });
      gathered_bytes_ += (b.full_elements - b.home_elements) * size_of(type_);
      b.compute = b.full.template data<std::byte>();
    } else {
      b.life.start_fetch();
      b.compute = lend_home(b);
    }
  }
  /// fetching -> ready: the gather arrived; the gathered copy is what the trainer reads, the home block goes back.
  void finish(record& b) {
    b.fetch.wait();
    b.fetch = {};
    if constexpr (Collective::shards_parameters) return_home(b);
    b.life.arrived();
  }
  /// Gathers for the chunks of passes [first, first + prefetch_depth) ahead of their use (resident homes; a streamed
  /// home's block is taken at its acquire, so the cache's own prefetch along the order stays in charge of it).
  template <class Reduced>
  void prefetch(std::size_t first, Reduced&& reduced) {
    if constexpr (Collective::shards_parameters)
      for (std::size_t p = first; p < std::min(first + prefetch_depth_, pass_chunks_->size()); ++p)
        for (const auto c : (*pass_chunks_)[p])
          if ((*chunks_)[c].life.state() == chunk_state::released && !homes_->streamed(c))
            start((*chunks_)[c], /*prefetch=*/true, reduced);
  }
  /// Prefetched gathers complete and are dropped (before the homes change outside a step).
  void settle() {
    for (auto& b : *chunks_)
      if (b.life.state() == chunk_state::fetching) {
        finish(b);
        b.life.evict();
        drop(b);
      }
  }
  /// The gathered copy and the lent home block go back; only a whole resident chunk keeps computing on its home.
  void drop(record& b) {
    b.full = {};
    return_home(b);
    if (homes_->streamed(b.index) || Collective::shards_parameters) b.compute = nullptr;
  }

  /// Elements [first, first + count) of chunk b's working parameters as fp32, read from the home (and gathered when
  /// the collective shards parameters: a collective call).
  std::vector<float> read(const record& b, std::size_t first, std::size_t count) {
    std::vector<float> result(count);
    visit_element(type_, "runtime", [&]<class T>(T) {
      std::vector<T> values;
      homes_->read(b.index, [&](const home_view& home) {
        const auto working = home.working_as<T>();
        values.assign(working.begin(), working.end());
      });
      if constexpr (Collective::shards_parameters) {
        std::vector<T> gathered(b.full_elements);
        ops_->template gather_params<T>(std::span<const T>(values), std::span<T>(gathered)).wait();
        values = std::move(gathered);
      }
      for (std::size_t i = 0; i < count; ++i) result[i] = to_float(values[first + i]);
    });
    return result;
  }

 private:
  std::byte* lend_home(record& b) {
    b.home_held = homes_->streamed(b.index);
    return homes_->acquire(b.index);
  }
  void return_home(record& b) {
    if (b.home_held) homes_->release(b.index);
    b.home_held = false;
  }

  chunk_collectives<Collective, Comm>* ops_;
  Homes* homes_;
  Gradients* gradients_;
  DeviceTier* device_;
  std::vector<record>* chunks_;
  const std::vector<std::vector<std::uint32_t>>* pass_chunks_;
  std::size_t prefetch_depth_;
  dtype type_;
  byte_count gathered_bytes_ = 0;
};

}  // namespace chunkwise
