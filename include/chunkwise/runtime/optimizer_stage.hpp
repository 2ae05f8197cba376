#pragma once
// optimizer_stage: the plan's optimizer execution over the chunks' home states. AdamW runs where a chunk's moments
// live (home_storage::update hands it the home parameters and moments: device tier, pinned host, host or NVMe):
// states in the device tier go to the backend's device optimizer (backend_parts<Backend>::device_optimizer: the
// fused CUDA Adam on a GPU), states in host tiers to the SIMD CPU Adam (Elixir's hybrid). On the host backend the
// device tier is host memory and the CPU Adam updates them all.
//
// When the update of a chunk can start: as soon as its gradient is reduced, on the stage's own worker thread, while
// backward goes on with the chunks before it (LoHan/Fuyou's "active gradient offloading", ZeRO-Offload's delayed
// update without its staleness), provided the update depends on nothing but that chunk: the learning rate must be
// known before step() (runtime_options::learning_rate, a schedule of the step number) and neither global gradient-norm
// clipping nor fp16 loss scaling be asked for. Both need every gradient before any update (the norm; the overflow
// check, which skips the whole step on every rank); this stage keeps them exact by deferring: the updates then run at
// step(), after the norm (one all-gather of a double per rank). That costs the overlap, not correctness (we chose it
// over update-then-roll-back, which is not bit-exact in fp32); bench/compare/overlap.sh measures it.
//
// Mixed precision: the update reads the reduced bf16/fp16 gradient, updates the fp32 master weights and moments, and
// rewrites the chunk's working copy from the master weights in the same pass (home_view.hpp). Loss-scaled fp16
// gradients are unscaled there too (grad_scale = clip coefficient / loss scale).
//
// Publication (ZeRO-2's all-gather of the updated shards) is a collective, so it runs on the caller's thread at
// step(), in chunk order, the same on every rank whatever the timing of the updates. Over a communicator that takes
// only device memory (NCCL's) it gathers a resident home in place on the device, and a streamed home (host memory)
// through a device buffer.
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/worker_threads.hpp>
#include <chunkwise/optim/cpu_adam.hpp>
#include <chunkwise/optim/loss_scaler.hpp>
#include <chunkwise/optim/mixed_precision.hpp>
#include <chunkwise/runtime/backend_parts.hpp>
#include <chunkwise/runtime/chunk_record.hpp>
#include <chunkwise/runtime/detail/host_exchange.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>
#include <chunkwise/runtime/home_view.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace chunkwise {

/// The learning rate of each step (counting from 1): a schedule known before the step, so updates can overlap backward.
using learning_rate_schedule = std::function<float(std::uint64_t step)>;

struct optimizer_settings {
  optim::adam_config adam{};
  unsigned threads = 1;              // threads of the SIMD Adam (the caller counted)
  learning_rate_schedule schedule{}; // given: updates start as soon as each chunk's gradient is reduced
  float clip_norm = 0.0f;            // > 0: scale the gradients so their global L2 norm is at most this
  std::optional<optim::loss_scaler_config> loss_scaling{};  // dynamic loss scaling (fp16): overflowed steps skip
};

template <class Collective, communicator Comm, class Homes>
class optimizer_stage {
  using backend_type = typename Homes::backend_type;
  using parts = backend_parts<backend_type>;
  // The device tier's optimizer, when the device is not host memory (else the CPU Adam serves both).
  using device_optimizer = std::conditional_t<parts::device_is_host_memory, std::monostate,
                                              typename parts::device_optimizer>;
  using device_tier = typename Homes::device_tier;
  // The collectives take device memory only (NCCL's on a GPU): publication goes through the device.
  static constexpr bool collectives_on_device = reaches_device_memory<Comm> && !parts::device_is_host_memory;

 public:
  using record = chunk_record<Comm>;

  optimizer_stage(const optimizer_settings& settings, chunk_collectives<Collective, Comm>& ops,
                  detail::host_exchange<Comm>& exchange, Homes& homes, std::vector<record>& chunks,
                  backend_type& backend, device_tier& device)
      : settings_(settings), adam_(settings.adam, {.threads = settings.threads}),
        device_adam_(make_device_optimizer(backend, settings)), ops_(&ops), exchange_(&exchange), homes_(&homes),
        chunks_(&chunks), device_(&device) {
    if (!(settings_.clip_norm >= 0.0f) || !std::isfinite(settings_.clip_norm))
      detail::raise(error_code::invalid_argument, "runtime: clip_norm must be a finite number >= 0 (0: no clipping), "
                                                  "got " + std::to_string(settings_.clip_norm));
    if (settings_.loss_scaling) scaler_.emplace(*settings_.loss_scaling);
    if (overlaps()) {
      // The worker runs device updates: a GPU's current device is per thread, and a new thread's is device 0.
      worker_.emplace(1);
      worker_->submit(std::packaged_task<void()>([&backend] { backend.bind_thread(); })).get();
    }
  }
  optimizer_stage(const optimizer_stage&) = delete;
  optimizer_stage& operator=(const optimizer_stage&) = delete;
  ~optimizer_stage() {
    for (auto& b : *chunks_)
      if (b.update.valid()) b.update.wait();  // never leave an update running on freed memory
  }

  /// Whether each chunk's update overlaps the rest of backward (see the header).
  [[nodiscard]] bool overlaps() const noexcept {
    return settings_.schedule && settings_.clip_norm == 0.0f && !settings_.loss_scaling;
  }
  [[nodiscard]] bool has_schedule() const noexcept { return static_cast<bool>(settings_.schedule); }
  /// runtime::step() goes with a schedule, step(lr) without one.
  void check_step_call(bool scheduled) const {
    if (scheduled && !has_schedule())
      detail::raise(error_code::illegal_state, "runtime::step(): no learning-rate schedule was given; set "
                                               "runtime_options::learning_rate or call step(lr)");
    if (!scheduled && has_schedule())
      detail::raise(error_code::illegal_state, "runtime::step(lr): this runtime takes its learning rate from "
                                               "runtime_options::learning_rate; call step()");
  }
  /// The global gradient norm of the last step, unscaled (computed only when clipping or loss scaling; NaN otherwise;
  /// infinite or NaN for an overflowed step).
  [[nodiscard]] double last_grad_norm() const noexcept { return last_norm_; }
  /// The factor the trainer multiplies its loss by before backward (1 without loss scaling).
  [[nodiscard]] float loss_scale() const noexcept { return scaler_ ? scaler_->scale() : 1.0f; }
  /// Whether the last step was skipped: its gradients overflowed (loss scaling), nothing was updated.
  [[nodiscard]] bool last_step_skipped() const noexcept { return skipped_; }
  [[nodiscard]] byte_count bytes_published() const noexcept { return published_bytes_; }

  /// Chunk b's gradient is reduced (on the caller's thread): with overlap, its update starts now on the worker.
  void reduced(record& b, std::uint64_t step) {
    if (!overlaps()) return;
    // The cache is driven from this thread; it fetches the chunk again (for the next step) only after the update.
    // It completes `updated` once the new state is in the home (NVMe: written back).
    auto updated = std::make_shared<completion>();
    // NVMe homes: read its state while the update before it runs; its working block from the cached copy, before
    // that is dropped.
    homes_->prepare_update(b.index);
    homes_->invalidate(b.index, updated);
    const optim::step_args args{.lr = settings_.schedule(step), .step = step};
    b.update = worker_->submit(std::packaged_task<void()>([this, &b, args, updated] { update(b, args, updated); }));
  }

  /// Ends step `step` once every chunk is reduced: the deferred updates (after the clipping norm), or the wait for
  /// the overlapped ones; then the publications in chunk order. `lr`: the step's rate when there is no schedule.
  /// Returns false when the step was skipped (overflowed gradients under loss scaling: nothing changed anywhere).
  bool finish(std::uint64_t step, std::optional<float> lr) {
    auto& chunks = *chunks_;
    if (overlaps()) {
      std::exception_ptr failure;
      for (auto& b : chunks) {  // wait for all before rethrowing: no update may outlive this call
        try {
          if (b.update.valid()) b.update.get();
        } catch (...) {
          if (!failure) failure = std::current_exception();
        }
      }
      if (failure) {
        homes_->drain_updates();
        std::rethrow_exception(failure);
      }
    } else {
      const float rate = lr ? *lr : settings_.schedule(step);
      const auto scale = gradient_scale();
      skipped_ = !scale;
      if (scaler_) scaler_->update(skipped_);
      if (skipped_) return false;
      if (!chunks.empty()) homes_->prepare_update(chunks.front().index);
      for (std::size_t i = 0; i < chunks.size(); ++i) {
        if (i + 1 < chunks.size()) homes_->prepare_update(chunks[i + 1].index);  // read ahead while this one updates
        homes_->invalidate(chunks[i].index);
        update(chunks[i], {.lr = rate, .step = step, .grad_scale = *scale}, nullptr);
      }
    }
    homes_->drain_updates();  // every write-back is in the home before the next fetch or read
    if constexpr (Collective::shards_gradients && !Collective::shards_parameters) publish(chunks);
    return true;
  }

 private:
  // ZeRO-2's all-gathers of the updated shards, issued in chunk order (the same on every rank). Where a home is
  // changed in place they are all in flight before the first wait (measured at 2 thread ranks, toy GPT-2 of 128
  // channels: 0.79 ms a step waited one by one, 0.33-0.65 ms together); a home read into a copy and written back
  // (NVMe, a device the host cannot address) waits for its own gather before the write-back.
  void publish(std::vector<record>& chunks) {
    std::vector<pending<Comm>> in_flight;
    for (auto& b : chunks) {
      // An update beside backward let the cache fetch the chunk again once its own shard was written: that copy
      // lacks the other ranks' shards published here.
      homes_->invalidate(b.index);
      if constexpr (collectives_on_device) {
        publish_on_device(b, in_flight);
        continue;
      }
      homes_->update(b.index, [&](const home_view& home) {
        visit_element(home.type, "runtime", [&]<class T>(T) {
          const auto working = home.working_as<T>();
          auto gathered = ops_->template publish_update<T>(working);
          if (homes_->changes_in_place(b.index)) in_flight.push_back(std::move(gathered));
          else gathered.wait();
          count_published(working);
        });
      });
    }
    for (auto& gathered : in_flight) gathered.wait();
  }
  void publish_on_device(record& b, std::vector<pending<Comm>>& in_flight) {
    visit_element(homes_->type(), "runtime", [&]<class T>(T) {
      if (!homes_->streamed(b.index)) {  // the home's device memory is the working parameters: gathered in place
        const std::span<T> working(reinterpret_cast<T*>(homes_->acquire(b.index)), b.home_elements);
        in_flight.push_back(ops_->template publish_update<T>(working));
        return count_published(working);
      }
      homes_->update(b.index, [&](const home_view& home) {
        const auto working = home.working_as<T>();
        detail::tier_buffer staging(*device_, working.size(), home.type, detail::tier_buffer::unfilled);
        staging.copy_from_host(0, working.data(), working.size_bytes());
        ops_->template publish_update<T>(staging.template span<T>()).wait();
        staging.copy_to_host(working.data(), 0, working.size_bytes());
        count_published(working);
      });
    });
  }
  template <class T>
  void count_published(std::span<T> working) {
    published_bytes_ += (working.size() - ops_->template owned_params<T>(working).size()) * sizeof(T);
  }

  static device_optimizer make_device_optimizer(backend_type& backend, const optimizer_settings& settings) {
    if constexpr (parts::device_is_host_memory) return {};
    else return parts::make_optimizer(backend, settings.adam, settings.threads);
  }
  // Where chunk b's states live decides its optimizer: a resident chunk's states in a device tier the host cannot
  // address go to the device's; states in host tiers (offloaded, streamed, or the host backend's device) to the CPU's.
  bool device_updates(const record& b) const noexcept {
    return !parts::device_is_host_memory && !homes_->streamed(b.index) && b.states_on_device;
  }
  template <class F>
  void with_optimizer_for(const record& b, F&& f) {
    if constexpr (!parts::device_is_host_memory)
      if (device_updates(b)) return f(device_adam_);
    f(adam_);
  }

  void update(record& b, const optim::step_args& args, std::shared_ptr<completion> done) {
    homes_->update_async(b.index, [&](const home_view& home) {
      const optim::chunk_arrays state{home.master.data(), b.owned_gradient.template data<std::byte>(), home.type,
                                      home.moment1.data(), home.moment2.data(), home.owned_working(), home.type,
                                      b.owned.valid};
      with_optimizer_for(b, [&](auto& optimizer) {
        optimizer.step(std::span<const optim::chunk_arrays>(&state, 1), args);
      });
    }, std::move(done));
  }

  // What every gradient is multiplied by at this step: 1 / loss scale, times the clipping factor; empty when the
  // gradients overflowed under loss scaling (the step is skipped).
  std::optional<float> gradient_scale() {
    if (settings_.clip_norm == 0.0f && !scaler_) return 1.0f;
    const auto scaling = optim::scale_step(global_sum_of_squares(), loss_scale(), settings_.clip_norm);
    last_norm_ = scaling.grad_norm;
    if (scaling.skipped) {
      if (scaler_) return std::nullopt;
      detail::raise(error_code::illegal_state, "runtime: the global gradient norm is " + std::to_string(last_norm_) +
                                                   "; the gradients hold inf or NaN (fp16 runs: set "
                                                   "runtime_options::loss_scaling to skip such steps)");
    }
    return scaling.grad_scale;
  }

  // The sum of squares of the owned gradients (as stored, loss-scaled) of every rank: the square of
  // torch.nn.utils.clip_grad_norm_'s norm. Replicas of a shard (replicated chunks, hybrid groups) are counted once.
  double global_sum_of_squares() {
    std::vector<optim::chunk_arrays> on_host, on_device;  // by the optimizer that can read them
    for (auto& b : *chunks_) {
      const optim::chunk_arrays owned{nullptr, b.owned_gradient.template data<std::byte>(), homes_->type(), nullptr,
                                      nullptr, nullptr, dtype::fp32, b.owned.valid};
      (device_updates(b) ? on_device : on_host).push_back(owned);
    }
    double mine = adam_.grad_sum_of_squares(on_host);
    if constexpr (!parts::device_is_host_memory) mine += device_adam_.grad_sum_of_squares(on_device);
    double total = mine;
    if (ops_->ranks() > 1 && Collective::shards_gradients) {
      // An all-gather of each rank's double, summed in rank order: the same norm on every rank, bit for bit.
      std::vector<double> all(static_cast<std::size_t>(ops_->ranks()));
      exchange_->all_gather(std::span<const double>(&mine, 1), std::span<double>(all));
      total = 0.0;
      for (const double s : all) total += s;
      total /= static_cast<double>(ops_->ranks() / ops_->shard_ranks());  // each group holds the whole gradient
    }
    return total;
  }

  optimizer_settings settings_;
  optim::cpu_adam adam_;            // states in host tiers (all of them on the host backend)
  device_optimizer device_adam_;    // states in a device tier the host cannot address
  chunk_collectives<Collective, Comm>* ops_;
  detail::host_exchange<Comm>* exchange_;
  Homes* homes_;
  std::vector<record>* chunks_;
  device_tier* device_;  // staging for publications over device collectives
  std::optional<worker_threads> worker_;  // overlapped updates, one at a time, in hand-over order
  std::optional<optim::loss_scaler> scaler_;
  bool skipped_ = false;
  double last_norm_ = std::nan("");
  byte_count published_bytes_ = 0;
};

}  // namespace chunkwise
