#pragma once
// runtime<Plan, Backend, Comm>: executes a plan's chunk life cycle for a trainer, on any backend and communicator.
//
// The trainer runs the profiled passes in order; around each it calls acquire(pass) / release(pass) (or holds
// use(pass)) and reads parameter(t) / gradient(t) of the pass's tensors in between, then calls step() once per
// iteration. This class only wires the parts the plan supplies and keeps each chunk's record (chunk_record.hpp):
//   home_storage       where parameters and moments live between uses (resident, or streamed through the device
//                      cache from pinned host, host or NVMe), fetched ahead along the profiled order;
//   parameter_fetches  the home's device copy lent to the compute, gathered (ZeRO-3) passes ahead, dropped after;
//   gradient_pipeline  gradient accumulators, hand-over, reductions overlapping compute;
//   optimizer_stage    AdamW where the states live, each chunk's update beside the rest of backward when it can;
//                      ZeRO-2's publication at step();
//   checkpoint.hpp     sharded, atomic checkpoints with resharding.
// Memory comes from tiers with byte budgets (backend_parts<Backend>): a budget that cannot hold a plan fails at
// construction with the tier's numbers.
// Precision is the model's: 16-bit tensors keep 16-bit working parameters and gradients in the chunks and fp32
// masters and moments where the states live (home_view.hpp); fp16 adds runtime_options::loss_scaling.
#include <chunkwise/backend/concepts.hpp>
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/abi.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/plan/plan.hpp>
#include <chunkwise/profile/model_profile.hpp>
#include <chunkwise/runtime/backend_parts.hpp>
#include <chunkwise/runtime/checkpoint.hpp>
#include <chunkwise/runtime/chunk_record.hpp>
#include <chunkwise/runtime/detail/assembly.hpp>
#include <chunkwise/runtime/detail/host_exchange.hpp>
#include <chunkwise/runtime/detail/rank_agreement.hpp>
#include <chunkwise/runtime/detail/tensor_access.hpp>
#include <chunkwise/runtime/gradient_pipeline.hpp>
#include <chunkwise/runtime/home_storage.hpp>
#include <chunkwise/runtime/nvme_update_stats.hpp>
#include <chunkwise/runtime/optimizer_stage.hpp>
#include <chunkwise/runtime/options.hpp>
#include <chunkwise/runtime/parameter_fetches.hpp>
#include <chunkwise/runtime/pass_guard.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

namespace chunkwise::inline CHUNKWISE_ABI {

template <class Plan, backend Backend, communicator Comm>
class runtime {
  using collective = typename Plan::collective;
  using placement = typename Plan::placement;
  using record = chunk_record<Comm>;
  using device_tier = typename backend_parts<Backend>::device_tier;
  using pinned_tier = typename backend_parts<Backend>::pinned_tier;
  using homes_type = home_storage<placement, Backend>;
  using gradients_type = gradient_pipeline<collective, Comm, Backend, device_tier>;

 public:
  runtime(const model_profile& model, Comm& comm, const tensor_initializer& initialize, runtime_options options = {})
      : model_(detail::checked_model(model)),
        comm_(&comm),
        device_(options.device_budget),
        host_(options.host_budget),
        exchange_(comm, device_),
        plan_agreed_(detail::agree_on_plan<Plan>(model, exchange_, options)),
        ops_(collective::bind(comm)),
        map_(detail::build_layout<Plan>(model, {static_cast<std::uint32_t>(comm.size()), options.alignment},
                                        options.chunk_bytes, options.layout_candidate)),
        pass_chunks_(detail::chunks_by_pass(model_, map_)),
        placement_(detail::place_chunks<Plan>(map_.chunks.size(), pass_chunks_, options)),
        chunks_(detail::make_records<Plan, Comm>(map_, ops_, placement_, type_, device_, host_, backend_)),
        homes_(backend_, device_, host_, options.host_budget,
               detail::make_home_layout<Plan>(model_, pass_chunks_, chunks_, placement_, options)),
        gradients_(ops_, backend_, device_, chunks_, model_, pass_chunks_, map_, options.handover,
                   options.micro_batches, type_, options.optimizer_threads),
        fetches_(ops_, homes_, gradients_, chunks_, pass_chunks_, options.prefetch_depth, type_),
        optimizer_({options.adam, options.optimizer_threads, options.learning_rate, options.clip_norm,
                    options.loss_scaling},
                   ops_, exchange_, homes_, chunks_, backend_, device_) {
    detail::check_device_reach<Plan, Backend>(comm);
    detail::initialize_homes(homes_, chunks_, map_, model_, initialize);
    start_iteration();
  }
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  [[nodiscard]] const chunk_map& layout() const noexcept { return map_; }

  void acquire(std::size_t pass) {
    detail::check_pass(model_, pass, "acquire");
    progress();
    const bool backward = model_.passes[pass].kind == pass_kind::backward;
    fetches_.drop_kept(pass);
    for (const auto c : pass_chunks_[pass]) {
      auto& b = chunks_[c];
      if (b.life.state() == chunk_state::released) fetches_.start(b, /*prefetch=*/false, reduced_sink());
      if (b.life.state() == chunk_state::fetching) fetches_.finish(b);
      if (backward) gradients_.backward_acquire(b, reduced_sink());
      b.life.acquire();
    }
    fetches_.prefetch(pass + 1, reduced_sink());
  }

  /// Ends a pass. Where the chunks are device memory, the copies that refill or write back its chunks' blocks wait
  /// for the work queued on the backend's compute stream before this call (on a GPU, the legacy default stream,
  /// which is ordered after every blocking stream): kernels on a non-blocking stream need release(pass, computed).
  void release(std::size_t pass) {
    if constexpr (!chunks_on_host) {
      const auto computed = backend_.record(backend_.compute());
      release(pass, computed);
    } else {
      release_chunks(pass);
    }
  }

  /// release(pass) for a trainer whose kernels on the pass's chunks may still be queued (a GPU's): `computed`
  /// completes after them. The runtime's copy streams wait for it, the trainer's thread does not; its collectives and
  /// device optimizer must queue behind it (train_gpt2: all on the default stream, where it records `computed`).
  void release(std::size_t pass, const typename Backend::event_type& computed) {
    backend_.wait_on(backend_.h2d(), computed);
    backend_.wait_on(backend_.d2h(), computed);
    release_chunks(pass);
  }

  /// Explicit hand-over (runtime_options::handover = explicit_calls): tensor t's gradient is complete for this
  /// iteration. A chunk's reduction starts once all its tensors are handed over and no pass uses it.
  void grad_ready(std::uint32_t tensor) {
    auto& b = chunks_[chunk_of(tensor)];
    gradients_.grad_ready(tensor, b, model_.tensors[tensor].name.view());
    reduce_if_handed_over(b);
  }

  /// Acquires a pass's chunks for the guard's lifetime: `auto in_use = rt.use(pass);` (runtime/pass_guard.hpp).
  using pass_guard = chunkwise::pass_guard<runtime>;
  [[nodiscard]] pass_guard use(std::size_t pass) {
    acquire(pass);
    return pass_guard(*this, pass);
  }

  /// The working parameters of tensor t, in the model's element type T (float, bf16 or fp16): valid between acquire
  /// and release of a pass that touches it.
  template <class T = float>
  std::span<T> parameter(std::uint32_t tensor) {
    auto& b = chunks_[chunk_of(tensor)];
    detail::require_parameters(b);
    return detail::tensor_span<T>(model_, map_, type_, tensor, b.compute);
  }
  /// Its gradient accumulator in T (the trainer adds into it): valid between acquire and release of a backward pass.
  template <class T = float>
  std::span<T> gradient(std::uint32_t tensor) {
    auto& b = chunks_[chunk_of(tensor)];
    detail::require_gradient(b, tensor);
    return detail::tensor_span<T>(model_, map_, type_, tensor, b.gradient.template data<std::byte>());
  }
  /// The element type of parameters and gradients (the model's tensors').
  [[nodiscard]] dtype element_type() const noexcept { return type_; }

  /// Whether parameter(t) and gradient(t) are host memory. False on a device the host cannot address (a GPU's):
  /// they are device addresses for the backend's kernels, and a CPU trainer copies them (fp32_compute does), with:
  static constexpr bool chunks_on_host = backend_parts<Backend>::device_is_host_memory;
  template <class T>
  void copy_to_host(std::span<T> host, std::span<const T> device) { detail::copy_to_host(device_, host, device); }
  template <class T>
  void copy_to_device(std::span<T> device, std::span<const T> host) { detail::copy_to_device(device_, device, host); }

  /// The trainer's own device memory (its activations, which the plan charged to the device) from the device tier,
  /// counted in device_stats(); out_of_memory with the tier's numbers past its budget. Return it before the runtime.
  using workspace = detail::tier_buffer;  // fp32 elements (data() is a float*), left as the tier gives them
  [[nodiscard]] workspace device_workspace(byte_count bytes) {
    return {device_, (bytes + sizeof(float) - 1) / sizeof(float), dtype::fp32, workspace::unfilled};
  }

  /// Gradient accumulators start zeroed at each iteration's first backward use; this clears any left from an
  /// iteration that stopped midway.
  void zero_grad() { for (auto& b : chunks_) b.gradient.zero(); }

  /// Ends the iteration with learning rate lr: every chunk's AdamW update (runtime_options::learning_rate unset).
  void step(float lr) { optimizer_.check_step_call(/*scheduled=*/false); finish_step(lr); }
  /// Ends the iteration at the scheduled learning rate; updates that started during backward are waited for.
  void step() { optimizer_.check_step_call(/*scheduled=*/true); finish_step(std::nullopt); }

  /// A copy of tensor t's current working parameters, as fp32 (what the trainer computes with). A collective call
  /// for plans that shard parameters: every rank calls it, for the same tensors in the same order.
  std::vector<float> read_parameters(std::uint32_t tensor) {
    return fetches_.read(chunks_[chunk_of(tensor)], map_.locations[tensor].offset / size_of(type_),
                         model_.tensors[tensor].elements, reduced_sink());
  }

  /// Saves the training state (runtime/checkpoint.hpp): a collective call between steps; if any rank fails, every
  /// rank throws and the previous checkpoint stays the committed one.
  void save_checkpoint(const std::filesystem::path& directory) { chunkwise::save_checkpoint(site(), directory); }
  /// Restores the committed checkpoint of `directory`, saved with any rank count and any plan of the same model.
  void load_checkpoint(const std::filesystem::path& directory) {
    fetches_.settle();
    for (auto& b : chunks_) homes_.invalidate(b.index);
    steps_ = chunkwise::load_checkpoint(site(), directory);
    ++parameter_writes_;
    for (auto& b : chunks_) b.life = chunk_life(b.index, initial_state(b.index));
    start_iteration();
  }

  [[nodiscard]] runtime_traffic traffic() const {
    return {fetches_.gathered_bytes(), gradients_.bytes_reduced(), optimizer_.bytes_published(),
            cache_stats().bytes_home_to_device, fetches_.gathers_ahead()};
  }
  /// The device cache of streamed chunks: hits, misses, prefetches, bytes moved, time acquire stalled (all zero when
  /// every chunk is resident).
  [[nodiscard]] chunkwise::cache_stats cache_stats() const { return homes_.stats(); }
  /// Peak and current bytes of the streamed chunks' home tier (zero when every chunk is resident).
  [[nodiscard]] tier_stats home_stats() const { return homes_.home_stats(); }
  /// NVMe homes: the optimizer updates and where their working blocks came from (zero for other homes).
  [[nodiscard]] nvme_update_stats nvme_updates() const { return homes_.nvme_updates(); }
  /// Chunks streamed from the placement's home (0 for resident placements).
  [[nodiscard]] std::size_t streamed_chunks() const noexcept { return homes_.streamed_chunks(); }
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  /// Changes whenever the runtime writes the parameters (an applied step, a loaded checkpoint), unlike steps(), which
  /// a checkpoint can set back to a count it had: what a copy of them taken elsewhere (a device mirror) is checked by.
  [[nodiscard]] std::uint64_t parameters_version() const noexcept { return parameter_writes_; }
  /// The global gradient norm of the last step, unscaled and before clipping (NaN unless runtime_options::clip_norm
  /// or loss_scaling is set).
  [[nodiscard]] double last_grad_norm() const noexcept { return optimizer_.last_grad_norm(); }
  /// What the trainer multiplies its loss by before backward (runtime_options::loss_scaling; 1 without it).
  [[nodiscard]] float loss_scale() const noexcept { return optimizer_.loss_scale(); }
  /// Whether the last step() skipped its update: the gradients overflowed under loss scaling (steps() did not count it).
  [[nodiscard]] bool last_step_skipped() const noexcept { return optimizer_.last_step_skipped(); }
  /// Whether each chunk's optimizer update runs beside the rest of backward (runtime/optimizer_stage.hpp).
  [[nodiscard]] bool updates_overlap_backward() const noexcept { return optimizer_.overlaps(); }

  /// Peak and current bytes of this rank's device and pinned host tiers.
  [[nodiscard]] tier_stats device_stats() const noexcept { return device_.stats(); }
  [[nodiscard]] tier_stats host_stats() const noexcept { return host_.stats(); }

  [[nodiscard]] chunk_statistics statistics() const { return detail::total_statistics<Comm>(chunks_); }

 private:
  void release_chunks(std::size_t pass) {
    detail::check_pass(model_, pass, "release");
    const bool backward = model_.passes[pass].kind == pass_kind::backward;
    for (const auto c : pass_chunks_[pass]) {
      auto& b = chunks_[c];
      const bool gradients_complete = gradients_.completes_at_release(b, pass, backward);
      b.life.release(gradients_complete);
      if (gradients_complete) {
        start_reduction(b);
      } else if (b.life.state() == chunk_state::ready &&
                 (homes_.streamed(c) ||
                  (collective::shards_parameters && (!backward || !gradients_.used_later_in_backward(b, pass))))) {
        // Unless the next pass uses it too, a streamed chunk gives its cache block back, and ZeRO-3 drops the
        // gathered copy after forward (backward gathers again) and after a micro-batch's last backward use.
        fetches_.drop_unless_used(b, pass + 1);
      }
      reduce_if_handed_over(b);
    }
    progress();
  }
  void start_reduction(record& b) { gradients_.start(b, reduced_sink()); fetches_.drop(b); }
  void reduce_if_handed_over(record& b) {
    if (!gradients_.handed_over(b)) return;
    b.life.handed_over();
    start_reduction(b);
  }
  // Each reduced chunk goes to the optimizer stage at once (its update may start beside backward).
  auto reduced_sink() { return [this](record& b) { optimizer_.reduced(b, steps_ + 1); }; }
  void progress() { gradients_.progress(reduced_sink()); }

  void finish_step(std::optional<float> lr) {
    detail::require_backward_done<Comm>(chunks_);
    gradients_.finish(reduced_sink());
    if (optimizer_.finish(steps_ + 1, lr)) {  // a step skipped for overflow does not count
      ++steps_;
      ++parameter_writes_;
    }
    for (auto& b : chunks_) b.life.updated(/*on_device=*/!collective::shards_parameters && !homes_.streamed(b.index));
    gradients_.next_step();
    start_iteration();
  }
  // Before the first pass of an iteration: resident whole chunks compute on their home; the cache and the gathers
  // fetch the first passes ahead.
  void start_iteration() {
    for (auto& b : chunks_)
      if (initial_state(b.index) == chunk_state::ready) b.compute = homes_.acquire(b.index);
    homes_.prefetch_ahead();
    fetches_.prefetch(0, reduced_sink());
  }
  // Whole resident chunks are ready from the start (their home is on the device); the others are fetched.
  chunk_state initial_state(std::uint32_t c) const noexcept {
    return !collective::shards_parameters && c < placement_.resident ? chunk_state::ready : chunk_state::released;
  }

  std::uint32_t chunk_of(std::uint32_t tensor) const { return detail::chunk_of(model_, map_, tensor); }
  checkpoint_site<record, homes_type, Comm> site() {
    return {model_, map_, chunks_, homes_, exchange_,
            {model_.name.str(), Plan::name(), detail::tensor_list_hash(model_), static_cast<std::uint64_t>(ops_.ranks()),
             static_cast<std::uint64_t>(ops_.rank()), steps_}};
  }

  model_profile model_;
  dtype type_ = detail::compute_type(model_);  // the working parameters' and gradients' element type
  Comm* comm_;
  Backend backend_;
  device_tier device_;
  pinned_tier host_;
  detail::host_exchange<Comm> exchange_;  // agreements and norms over host values (through device_ where need be)
  bool plan_agreed_;  // before ops_: binding the collective already talks to the other ranks
  chunk_collectives<collective, Comm> ops_;
  chunk_map map_;
  detail::pass_chunk_lists pass_chunks_;  // the chunks each pass touches, in first-touch order
  detail::chunk_placement placement_;     // device blocks, resident and offloaded chunks
  std::vector<record> chunks_;      // after the tiers: destroyed first, returning their memory
  homes_type homes_;                // after the records (its layout comes from them)
  gradients_type gradients_;
  parameter_fetches<collective, Comm, homes_type, gradients_type> fetches_;
  optimizer_stage<collective, Comm, homes_type> optimizer_;  // last: its running updates use everything above
  std::uint64_t steps_ = 0;
  std::uint64_t parameter_writes_ = 0;  // parameters_version()
};

}  // namespace chunkwise
