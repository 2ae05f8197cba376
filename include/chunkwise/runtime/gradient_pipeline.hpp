#pragma once
// gradient_pipeline: a chunk's gradients from the first backward use to the optimizer. It takes the full-chunk
// accumulator from the device tier at the chunk's first backward acquire; decides when the gradients are complete
// (by the profile: the release of the chunk's last backward pass, after `micro_batches` of them; or by the trainer's
// grad_ready calls); starts the reduction (all-reduce or reduce-scatter, averaging over ranks) while the trainer goes
// on; polls the reductions at every pass boundary, and hands each reduced chunk to the optimizer stage at once,
// giving its accumulator back. When the device tier is full, the oldest reduction is completed to make room.
// A gradient whose states live in a host tier while the accumulator is device memory the host cannot address (a
// GPU's) goes down on the backend's device-to-host stream once reduced, and is handed on when that copy's event
// completes: the trainer's thread never waits for it, and the accumulator goes back only after it.
// On such a device the accumulators are stream-ordered on the backend's compute stream, where the trainer's kernels
// run (a GPU's legacy default stream): allocated, zeroed and given back there, with no host wait (tier_buffer.hpp).
#include <chunkwise/backend/concepts.hpp>
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/worker_threads.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/profile/model_profile.hpp>
#include <chunkwise/runtime/chunk_record.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <string>
#include <vector>

namespace chunkwise {

/// When a chunk's gradients are complete and its reduction may start.
enum class gradient_handover : std::uint8_t {
  profile,         // at the release of its last backward pass in the profile (after runtime_options::micro_batches
                   // forward and backward passes per step())
  explicit_calls,  // when the trainer has called grad_ready for each of its tensors (any order the profile does not
                   // know)
};

template <class Collective, communicator Comm, backend Backend, class DeviceTier>
class gradient_pipeline {
 public:
  using record = chunk_record<Comm>;
  static constexpr std::size_t no_pass = ~std::size_t{0};

  gradient_pipeline(chunk_collectives<Collective, Comm>& ops, Backend& backend, DeviceTier& device,
                    std::vector<record>& chunks, const model_profile& model,
                    const std::vector<std::vector<std::uint32_t>>& pass_chunks, const chunk_map& map,
                    gradient_handover handover, std::uint32_t micro_batches, dtype type, unsigned threads = 1)
      : ops_(&ops), backend_(&backend), device_(&device), chunks_(&chunks), handover_(handover),
        micro_batches_(micro_batches), type_(type), zeroing_(threads > 1 ? threads - 1 : 0) {
    if (micro_batches_ == 0)
      detail::raise(error_code::invalid_argument, "runtime: micro_batches = 0; give at least 1 forward and backward "
                                                  "per step");
    last_backward_.assign(chunks.size(), no_pass);
    for (std::size_t s = 0; s < model.passes.size(); ++s)
      if (model.passes[s].kind == pass_kind::backward)
        for (const auto c : pass_chunks[s]) last_backward_[c] = s;
    slots_.resize(chunks.size());
    for (std::size_t c = 0; c < chunks.size(); ++c) slots_[c] = map.chunks[c].slots.size();
    tensor_ready_.assign(model.tensors.size(), 0);
    chunk_ready_.assign(chunks.size(), 0);
    copy_down_.resize(chunks.size());
  }
  gradient_pipeline(const gradient_pipeline&) = delete;
  gradient_pipeline& operator=(const gradient_pipeline&) = delete;
  ~gradient_pipeline() {
    for (auto& b : *chunks_) {  // reductions and copies still writing into this rank's buffers
      try {
        b.reduction.wait();
      } catch (...) {  // the run already failed; its own error was reported
      }
      try {
        if (copy_down_[b.index]) backend_->wait(*copy_down_[b.index]);
      } catch (...) {
      }
    }
  }

  [[nodiscard]] gradient_handover handover() const noexcept { return handover_; }
  [[nodiscard]] byte_count bytes_reduced() const noexcept { return reduced_bytes_; }

  /// Device memory for a gathered chunk or a gradient accumulator (in the compute type), not zeroed. Past the
  /// budget, the accumulators of finished reductions go back first (completing the oldest if none has finished);
  /// out_of_memory only when none is left.
  template <class Reduced>
  detail::tier_buffer device_buffer(std::size_t elements, Reduced&& reduced) {
    return making_room(reduced, [&] {
      return detail::tier_buffer(*device_, elements, type_, detail::tier_buffer::unfilled);
    });
  }

  /// device_buffer for a chunk's gathered parameters, which the trainer's kernels read: in stream order on the
  /// compute stream where the host cannot address the device, so a gather's start and its copy's drop after the
  /// pass wait for no kernel on the host.
  template <class Reduced>
  detail::tier_buffer gathered_buffer(std::size_t elements, Reduced&& reduced) {
    return making_room(reduced, [&] { return detail::compute_buffer(*device_, backend_->compute(), elements, type_); });
  }

  /// A backward pass acquires chunk b: its accumulator exists from now on (zeros).
  template <class Reduced>
  void backward_acquire(record& b, Reduced&& reduced) {
    give_accumulator(b, reduced);
  }

  /// Profile hand-over: whether releasing `pass` completes chunk b's gradients for this step (its last backward
  /// pass, no other user, the step's last micro-batch). Counts the micro-batch.
  bool completes_at_release(record& b, std::size_t pass, bool backward) {
    if (handover_ != gradient_handover::profile || !backward || last_backward_[b.index] != pass || b.life.users() != 1)
      return false;
    if (++b.micro_batches_done < micro_batches_) return false;
    b.micro_batches_done = 0;
    return true;
  }
  /// Whether chunk b's gradient accumulator is still needed after releasing `pass` (a later backward pass of this
  /// micro-batch uses it).
  [[nodiscard]] bool used_later_in_backward(const record& b, std::size_t pass) const noexcept {
    return last_backward_[b.index] != no_pass && last_backward_[b.index] > pass;
  }

  /// Explicit hand-over: tensor t of chunk b is complete. True when every tensor of the chunk is.
  bool grad_ready(std::uint32_t tensor, const record& b, std::string_view tensor_name) {
    if (handover_ != gradient_handover::explicit_calls)
      detail::raise(error_code::illegal_state, "runtime::grad_ready: this runtime hands gradients over by the profile "
                                               "(at each chunk's last backward release); set runtime_options::"
                                               "handover = gradient_handover::explicit_calls to call grad_ready");
    if (tensor_ready_[tensor])
      detail::raise(error_code::illegal_state, "runtime::grad_ready: tensor " + std::to_string(tensor) + " ('" +
                                                   std::string(tensor_name) +
                                                   "') was already handed over in this iteration");
    tensor_ready_[tensor] = 1;
    return ++chunk_ready_[b.index] == slots_[b.index];
  }
  /// Explicit hand-over: every tensor of chunk b handed over and no pass holds it.
  [[nodiscard]] bool handed_over(const record& b) const noexcept {
    return handover_ == gradient_handover::explicit_calls && chunk_ready_[b.index] == slots_[b.index] &&
           (b.life.state() == chunk_state::ready || b.life.state() == chunk_state::released);
  }

  /// Chunk b's gradients are complete (grad_pending): reduce them, averaging over ranks, while the trainer goes on.
  template <class Reduced>
  void start(record& b, Reduced&& reduced) {
    give_accumulator(b, reduced);  // when no backward touched it
    reduced_bytes_ += b.gradient.bytes();
    reducing_.push_back(b.index);
    if (ops_->ranks() == 1 && b.gradient.bytes() == b.owned_gradient.bytes() &&
        b.gradient.same_tier(b.owned_gradient)) {
      // One rank: the reduction is the identity. The accumulator becomes the owned gradient (no copy of the chunk on
      // the trainer's thread); the old owned buffer goes back with the accumulator at the hand-on.
      std::swap(b.gradient, b.owned_gradient);
      return;
    }
    if (lands_on_host(b) && ops_->ranks() == 1) {
      start_copy_down(b, 0);  // one rank: the reduction is the copy down
      return;
    }
    visit_element(type_, "runtime", [&]<class T>(T) {
      const auto full = b.gradient.template span<T>();
      // Landing on the host from device collectives: reduced in place in the accumulator, copied down once complete.
      const auto owned = lands_on_host(b) ? full.subspan(b.owned.offset, b.owned.elements)
                                          : b.owned_gradient.template span<T>();
      b.reduction = ops_->template reduce_grads<T>(full, owned, reduce_op::average);
    });
  }

  /// At a pass boundary: hands every finished reduction on (reduced(b), accumulator returned), oldest first.
  template <class Reduced>
  void progress(Reduced&& reduced) {
    while (complete(/*wait_for_oldest=*/false, reduced)) {
    }
  }
  /// Before the optimizer's last wait: every reduction finished and handed on, in the order they started.
  template <class Reduced>
  void finish(Reduced&& reduced) {
    while (complete(/*wait_for_oldest=*/true, reduced)) {
    }
  }

  /// A new step: nothing handed over yet.
  void next_step() {
    std::fill(tensor_ready_.begin(), tensor_ready_.end(), 0);
    std::fill(chunk_ready_.begin(), chunk_ready_.end(), 0);
  }

 private:
  // A device the host cannot address and the owned gradient in a host tier (offloaded or streamed states): the
  // reduced gradient goes down through the device tier (only a communicator that reaches device memory gets here
  // with several ranks: runtime's check_device_reach).
  static bool lands_on_host(const record& b) noexcept {
    return !b.gradient.host_accessible() && b.owned_gradient.host_accessible();
  }
  // make(), making room past the budget as device_buffer says.
  template <class Reduced, class Make>
  detail::tier_buffer making_room(Reduced& reduced, Make&& make) {
    for (;;) {
      try {
        return make();
      } catch (const error& e) {
        if (e.code() != error_code::out_of_memory || !complete(/*wait_for_oldest=*/true, reduced)) throw;
      }
    }
  }
  // Chunk b's accumulator, zeroed, unless it has one; in stream order on the compute stream where the host cannot
  // address the device.
  template <class Reduced>
  void give_accumulator(record& b, Reduced& reduced) {
    if (!b.gradient.empty()) return;
    if constexpr (host_staged_tier<DeviceTier>) {
      b.gradient = making_room(reduced, [&] {
        return detail::gradient_buffer(*device_, backend_->compute(), b.full_elements, type_);
      });
    } else {
      b.gradient = device_buffer(b.full_elements, reduced);
      b.gradient.zero(zeroing_);
    }
  }

  // The owned part of chunk b's reduced accumulator to its host-tier gradient, on the device-to-host stream.
  void start_copy_down(record& b, std::size_t first_element) {
    // After the accumulator's zeroing on the compute stream, whatever event the trainer gave (or none, with a plain
    // release: its kernels are done, but a chunk no kernel wrote has only the zeroing before it).
    backend_->wait_on(backend_->d2h(), backend_->record(backend_->compute()));
    backend_->copy_async(backend_->d2h(), b.owned_gradient.template data<std::byte>(),
                         b.gradient.template data<std::byte>() + first_element * size_of(type_),
                         b.owned_gradient.bytes());
    copy_down_[b.index] = backend_->record(backend_->d2h());
  }
  // Whether chunk b's reduction has finished (with `wait`, once it has); a finished one of several ranks that lands
  // on the host then starts its copy down (one rank's started with the reduction).
  bool reduction_finished(record& b, bool wait) {
    if (copy_down_[b.index]) return true;
    if (!wait && !b.reduction.test()) return false;
    b.reduction.wait();
    b.reduction = {};
    if (lands_on_host(b) && ops_->ranks() > 1) start_copy_down(b, b.owned.offset);
    return true;
  }

  // Hands on the oldest reduction if it finished (or, with wait_for_oldest, once it does); true when one was.
  // Oldest first keeps the hand-over order the same on every rank whatever the timing.
  template <class Reduced>
  bool complete(bool wait_for_oldest, Reduced& reduced) {
    if (reducing_.empty()) return false;
    if constexpr (host_staged_tier<DeviceTier>)  // the finished ones' copies down queue, in order, meanwhile
      if (ops_->ranks() > 1)
        for (const auto c : reducing_)
          if (!reduction_finished((*chunks_)[c], /*wait=*/false)) break;
    record& b = (*chunks_)[reducing_.front()];
    if (!reduction_finished(b, wait_for_oldest)) return false;
    if (auto& copy = copy_down_[b.index]) {
      if (!wait_for_oldest && !backend_->ready(*copy)) return false;
      backend_->wait(*copy);
      copy.reset();
    }
    b.gradient = {};
    reducing_.pop_front();
    b.life.reduced();
    reduced(b);
    return true;
  }

  chunk_collectives<Collective, Comm>* ops_;
  Backend* backend_;
  DeviceTier* device_;
  std::vector<record>* chunks_;
  gradient_handover handover_;
  std::uint32_t micro_batches_;
  dtype type_;
  std::vector<std::size_t> last_backward_;
  std::vector<std::size_t> slots_;           // tensors per chunk
  std::vector<unsigned char> tensor_ready_;  // explicit hand-over: tensors handed over this step
  std::vector<std::size_t> chunk_ready_;     // and how many per chunk
  std::deque<std::uint32_t> reducing_;       // chunks whose reduction is in flight, oldest first
  std::vector<std::optional<typename Backend::event_type>> copy_down_;  // per chunk: its copy down, while queued
  worker_threads zeroing_;                   // with the caller, the threads that zero new accumulators
  byte_count reduced_bytes_ = 0;
};

}  // namespace chunkwise
