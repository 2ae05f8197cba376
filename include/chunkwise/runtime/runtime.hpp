#pragma once
// runtime<Plan, Comm>: executes a plan's chunk life cycle for a trainer, on the host backend.
//
// The trainer runs the profiled passes in order; around each it calls acquire(pass) / release(pass) and reads
// parameter(t) / gradient(t) of the pass's tensors in between, then calls step(lr) once per iteration:
//   acquire   gathers the pass's chunks where the collective shards parameters (all-gather of the home shards into
//             the full chunk), counts the use;
//   release   after a chunk's last backward use its gradients are complete: they are reduced (all-reduce or
//             reduce-scatter, averaging over ranks) while the trainer goes on; a sharded chunk's gathered copy is
//             dropped after forward use (ZeRO-3 gathers again for backward);
//   step      waits for the reductions, runs AdamW (the SIMD CPU kernel) on each chunk's owned elements, and
//             publishes the update (ZeRO-2 all-gathers the updated shards).
// Every chunk moves through chunk_state's checked life cycle; statistics() sums the transitions.
//
// Memory comes from tiers with byte budgets. The device tier (host memory on the host backend) holds the resident
// chunks' parameters, the device cache's blocks, the gathered copies of chunks in use and the gradient accumulators
// (taken at a chunk's first backward use, given back when its reduction completes; a tight budget waits for the
// oldest reduction rather than fail), and the optimizer states of chunks updated on the device. The pinned host tier
// holds the owned gradients and Adam moments of chunks updated on the host (optimizer_offload, optimizer_auto:
// runtime_options::offloaded_chunks of the resident chunks, the last in first-use order) and of streamed chunks.
//
// Placements: `resident` keeps every chunk on the device. `cached<Space>` and `split<Space>` keep
// Placement::resident_chunks(n, device_blocks) chunks resident (the first in first-use order, as the cost model
// assumes) and stream the others from their home in Space (pinned host, host or NVMe) through a device cache of the
// remaining blocks, prefetched along the profiled order (runtime/detail/streamed_homes.hpp). A streamed chunk's
// optimizer runs where its states are: on its home. A budget that cannot hold a plan fails at construction with the
// tier's numbers.
#include <chunkwise/core/abi.hpp>
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/collective/concepts.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/hash.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/optim/cpu_adam.hpp>
#include <chunkwise/placement/concepts.hpp>
#include <chunkwise/plan/layout_candidates.hpp>
#include <chunkwise/plan/optimizer_execution.hpp>
#include <chunkwise/plan/plan.hpp>
#include <chunkwise/profile/model_profile.hpp>
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/runtime/checkpoint_file.hpp>
#include <chunkwise/runtime/chunk_state.hpp>
#include <chunkwise/runtime/detail/streamed_homes.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>
#include <chunkwise/tier/emulated_device.hpp>
#include <chunkwise/tier/pinned_host.hpp>
#include <chunkwise/core/checksum.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace chunkwise::inline CHUNKWISE_ABI {

/// Bytes this rank's collectives moved into its buffers: gathered parameters, reduced gradients, published updates.
struct runtime_traffic {
  byte_count gathered = 0;
  byte_count reduced = 0;
  byte_count published = 0;
  byte_count fetched = 0;       // streamed chunks: home -> device through the cache
  [[nodiscard]] constexpr byte_count total() const noexcept { return gathered + reduced + published + fetched; }
};

/// When a chunk's gradients are complete and its reduction may start.
enum class gradient_handover : std::uint8_t {
  profile,   // at the release of its last backward pass in the profile (one forward and backward per step())
  explicit_calls,  // when the trainer has called grad_ready for each of its tensors (gradient accumulation over
                   // micro-batches, or any order the profile does not know)
};

struct runtime_options {
  optim::adam_config adam{};
  unsigned optimizer_threads = 1;
  byte_count alignment = 256;
  byte_count device_budget = ~byte_count{0};  // bytes of the device tier per rank
  byte_count host_budget = ~byte_count{0};    // bytes of the pinned host tier per rank
  /// Chunks whose optimizer states live off the device; unset: none for optimizer_follows_home, all for
  /// optimizer_offload, the policy's smallest fraction for optimizer_auto (give the planner's knob).
  std::optional<std::size_t> offloaded_chunks{};
  /// cached<> and split<>: device blocks of one chunk's home part each (the planner's knob; resident chunks take one
  /// each, the cache the rest). Unset: cached<> streams through max(2, widest pass) blocks, split<> keeps half the
  /// chunks resident.
  std::optional<std::size_t> device_blocks{};
  /// The chunk capacity the search chose among the layout's candidates (prediction::knobs.chunk_bytes); unset: the
  /// layout's own choice.
  std::optional<byte_count> chunk_bytes{};
  std::size_t prefetch_depth = 2;  // accesses of the profiled order fetched ahead
  gradient_handover handover = gradient_handover::profile;
  std::filesystem::path nvme_directory = std::filesystem::temp_directory_path();  // NVMe homes: the store's directory
};

/// Fills a tensor's initial values: (tensor index, its elements).
using tensor_initializer = std::function<void(std::uint32_t, std::span<float>)>;

template <class Plan, communicator Comm>
class runtime {
  using collective = typename Plan::collective;
  using placement = typename Plan::placement;
  static constexpr bool streams = placement::uses_device_cache;
  struct no_streamed_homes {};
  using homes_type = std::conditional_t<streams, detail::streamed_homes<typename placement::home_space>, no_streamed_homes>;

 public:
  runtime(const model_profile& model, Comm& comm, const tensor_initializer& initialize, runtime_options options = {})
      : model_(model),
        comm_(&comm),
        plan_agreed_(agree_on_plan(model, comm, options)),
        ops_(collective::bind(comm)),
        map_(build_layout(model, {static_cast<std::uint32_t>(comm.size()), options.alignment}, options.chunk_bytes)),
        adam_(options.adam, {.threads = options.optimizer_threads}),
        device_(options.device_budget),
        host_(options.host_budget) {
    validate(model_);
    for (const auto& t : model_.tensors)
      if (t.type != dtype::fp32)
        detail::raise(error_code::unsupported, "runtime: tensor '" + t.name.str() + "' is " +
                                                   std::string(to_string(t.type)) +
                                                   "; this runtime holds fp32 parameters (mixed precision comes with "
                                                   "the optimizer's working copies)");
    const std::size_t chunk_count = map_.chunks.size();
    last_backward_.assign(chunk_count, no_pass);
    for (std::size_t s = 0; s < model_.passes.size(); ++s)
      if (model_.passes[s].kind == pass_kind::backward)
        for (const auto c : chunks_of(s)) last_backward_[c] = s;
    handover_ = options.handover;
    tensor_ready_.assign(model_.tensors.size(), 0);
    chunk_ready_.assign(chunk_count, 0);
    const std::size_t resident = resident_chunk_count(options);
    const auto default_offloaded = static_cast<std::size_t>(Plan::optimizer_execution::min_offload_fraction *
                                                                static_cast<double>(resident) + 0.5);
    const std::size_t offloaded = std::min(options.offloaded_chunks.value_or(default_offloaded), resident);
    if (Plan::optimizer_execution::max_offload_fraction == 0.0 && offloaded != 0)
      detail::raise(error_code::invalid_argument, "runtime: " + Plan::name() + " keeps every optimizer state on the "
                                                  "device; offloaded_chunks must be 0 (use optimizer_auto or "
                                                  "optimizer_offload to move states to the host)");
    for (std::uint32_t c = 0; c < chunk_count; ++c) {
      const std::size_t n = map_.chunks[c].capacity / sizeof(float);
      chunk_buffers b;
      b.index = c;
      b.owned = ops_.template owned<float>(n);
      b.full_elements = ops_.template full_elements<float>(n);
      b.home_elements = collective::shards_parameters ? b.owned.elements : b.full_elements;
      b.streamed = c >= resident;
      b.local = b.streamed ? c - static_cast<std::uint32_t>(resident) : 0;
      b.states_on_device = c < resident - offloaded;
      chunks_.push_back(std::move(b));
    }
    if constexpr (streams)
      if (resident < chunk_count) start_streaming(options, resident);
    std::vector<float> staging;
    for (auto& b : chunks_) {
      // The whole chunk, initialised tensor by tensor; this rank keeps its home part.
      staging.assign(b.full_elements, 0.0f);
      for (const auto& slot : map_.chunks[b.index].slots)
        initialize(slot.tensor, std::span<float>(staging.data() + slot.offset / sizeof(float), slot.bytes / sizeof(float)));
      const std::size_t first = b.home_first();
      const auto state_buffer = [&] {
        return b.states_on_device ? detail::tier_buffer(device_, b.owned.elements)
                                  : detail::tier_buffer(host_, b.owned.elements);
      };
      b.owned_gradient = state_buffer();
      if (b.streamed) {
        with_state(b, /*write=*/true, [&](std::span<float> home, std::span<float>, std::span<float>) {
          std::copy_n(staging.begin() + static_cast<std::ptrdiff_t>(first), b.home_elements, home.begin());
        });
        b.life = chunk_life(b.index);
        continue;
      }
      b.home = detail::tier_buffer(device_, b.home_elements);
      std::copy_n(staging.begin() + static_cast<std::ptrdiff_t>(first), b.home_elements, b.home.begin());
      b.moment1 = state_buffer();
      b.moment2 = state_buffer();
      b.life = chunk_life(b.index, collective::shards_parameters ? chunk_state::released : chunk_state::ready);
      b.compute = b.home.data();
    }
    if constexpr (streams)
      if (homes_) homes_->prefetch_ahead();
  }

  [[nodiscard]] const chunk_map& layout() const noexcept { return map_; }

  void acquire(std::size_t pass) {
    check_pass(pass, "acquire");
    reclaim_gradients(/*wait_for_oldest=*/false);
    const bool backward = model_.passes[pass].kind == pass_kind::backward;
    for (const auto c : chunks_of(pass)) {
      auto& b = chunks_[c];
      if (b.life.state() == chunk_state::released) {
        b.life.start_fetch();
        fetch_parameters(b);
        b.life.arrived();
      }
      if (backward && b.gradient.size() == 0) b.gradient = device_buffer(b.full_elements);
      b.life.acquire();
    }
  }

  void release(std::size_t pass) {
    check_pass(pass, "release");
    const bool backward = model_.passes[pass].kind == pass_kind::backward;
    for (const auto c : chunks_of(pass)) {
      auto& b = chunks_[c];
      const bool gradients_complete = handover_ == gradient_handover::profile && backward &&
                                      last_backward_[c] == pass && b.life.users() == 1;
      b.life.release(gradients_complete);
      if (gradients_complete) {
        start_reduction(b);
      } else if (b.life.state() == chunk_state::ready && (b.streamed || (collective::shards_parameters && !backward))) {
        // Streamed chunks give their cache block back; ZeRO-3 drops the gathered copy after forward (backward
        // gathers again).
        b.life.evict();
        drop_parameters(b);
      }
      if (handed_over(b)) {
        b.life.handed_over();
        start_reduction(b);
      }
    }
  }

  /// Explicit hand-over (runtime_options::handover = explicit_calls): tensor t's gradient is complete for this
  /// iteration. A chunk's reduction starts once all its tensors are handed over and no pass uses it.
  void grad_ready(std::uint32_t tensor) {
    const auto c = chunk_of(tensor);
    if (handover_ != gradient_handover::explicit_calls)
      detail::raise(error_code::illegal_state, "runtime::grad_ready: this runtime hands gradients over by the profile "
                                               "(at each chunk's last backward release); set runtime_options::"
                                               "handover = gradient_handover::explicit_calls to call grad_ready");
    if (tensor_ready_[tensor])
      detail::raise(error_code::illegal_state, "runtime::grad_ready: tensor " + std::to_string(tensor) + " ('" +
                                                   model_.tensors[tensor].name.str() +
                                                   "') was already handed over in this iteration");
    tensor_ready_[tensor] = 1;
    ++chunk_ready_[c];
    auto& b = chunks_[c];
    if (handed_over(b)) {
      b.life.handed_over();
      start_reduction(b);
    }
  }

  /// Acquires a pass's chunks for the guard's lifetime: `auto in_use = rt.use(pass);`.
  class pass_guard {
   public:
    pass_guard(const pass_guard&) = delete;
    pass_guard& operator=(const pass_guard&) = delete;
    /// Releases the pass, unless an exception is unwinding: a pass that failed midway has incomplete gradients,
    /// and releasing it could start a reduction the other ranks never join.
    ~pass_guard() noexcept(false) {
      if (std::uncaught_exceptions() == unwinding_) owner_.release(pass_);
    }

   private:
    friend class runtime;
    pass_guard(runtime& owner, std::size_t pass) : owner_(owner), pass_(pass) {}
    runtime& owner_;
    std::size_t pass_;
    int unwinding_ = std::uncaught_exceptions();
  };
  [[nodiscard]] pass_guard use(std::size_t pass) {
    acquire(pass);
    return pass_guard(*this, pass);
  }

  /// The parameters of tensor t: valid between acquire and release of a pass that touches it.
  std::span<float> parameter(std::uint32_t tensor) { return view(tensor, compute_parameters(chunk_of(tensor))); }
  /// Its gradient accumulator (the trainer adds into it): valid between acquire and release of a backward pass.
  std::span<float> gradient(std::uint32_t tensor) {
    const auto c = chunk_of(tensor);
    auto& b = chunks_[c];
    if (b.life.state() != chunk_state::in_use || b.gradient.size() == 0)
      detail::raise(error_code::illegal_state, "runtime: gradient of tensor " + std::to_string(tensor) + " (chunk " +
                                                   std::to_string(c) + ") asked for outside a backward pass that "
                                                   "uses it; gradients exist from a chunk's first backward acquire "
                                                   "until its reduction");
    return view(tensor, b.gradient.data());
  }

  /// Gradient accumulators start zeroed at each iteration's first backward use; this clears any left from an
  /// iteration that stopped midway.
  void zero_grad() {
    for (auto& b : chunks_) std::fill(b.gradient.begin(), b.gradient.end(), 0.0f);
  }

  /// One AdamW update of every chunk with learning rate lr, after the iteration's last release.
  void step(float lr) {
    ++steps_;
    for (auto& b : chunks_) {
      if (b.life.state() != chunk_state::grad_pending)
        detail::raise(error_code::illegal_state,
                      "runtime::step: chunk " + std::to_string(b.index) + " is " + std::string(to_string(b.life.state())) +
                          ", not grad_pending: run every backward pass (acquire and release) before step()");
      b.reduction.wait();
      b.reduction = {};
      b.gradient = {};
      b.life.reduced();
      with_state(b, /*write=*/true, [&](std::span<float> home, std::span<float> moment1, std::span<float> moment2) {
        const std::span<float> owned = ops_.template owned_params<float>(home);
        const optim::chunk_arrays state{owned.data(), b.owned_gradient.data(), dtype::fp32, moment1.data(),
                                       moment2.data(), nullptr, dtype::fp32, b.owned.valid};
        adam_.step(state, {.lr = lr, .step = steps_});
        ops_.template publish_update<float>(home).wait();
        if constexpr (collective::shards_gradients && !collective::shards_parameters)
          traffic_.published += (home.size() - owned.size()) * sizeof(float);
      });
      b.life.updated(/*on_device=*/!collective::shards_parameters && !b.streamed);
    }
    reducing_.clear();
    std::fill(tensor_ready_.begin(), tensor_ready_.end(), 0);
    std::fill(chunk_ready_.begin(), chunk_ready_.end(), 0);
    if constexpr (streams)
      if (homes_) homes_->prefetch_ahead();
  }

  /// A copy of tensor t's current parameters. A collective call for plans that shard parameters: every rank calls it,
  /// for the same tensors in the same order.
  std::vector<float> read_parameters(std::uint32_t tensor) {
    auto& b = chunks_[chunk_of(tensor)];
    std::vector<float> home;
    with_state(b, /*write=*/false, [&](std::span<float> values, std::span<float>, std::span<float>) {
      home.assign(values.begin(), values.end());
    });
    const float* base = home.data();
    std::vector<float> gathered;
    if constexpr (collective::shards_parameters) {
      gathered.assign(b.full_elements, 0.0f);
      ops_.template gather_params<float>(std::span<float>(home), std::span<float>(gathered)).wait();
      base = gathered.data();
    }
    const std::size_t first = map_.locations[tensor].offset / sizeof(float);
    return {base + first, base + first + model_.tensors[tensor].elements};
  }

  // ---- checkpoints (format and commit protocol: runtime/checkpoint_file.hpp) ----

  /// Saves the training state: each rank writes its owned pieces of every tensor, then rank 0 commits the step. A
  /// collective call between steps (after step()); if any rank fails, every rank throws and the previous checkpoint
  /// stays the committed one.
  void save_checkpoint(const std::filesystem::path& directory) {
    char step_name[32];
    std::snprintf(step_name, sizeof step_name, "step-%09llu", static_cast<unsigned long long>(steps_));
    const auto step_directory = directory / step_name;
    agree("save", directory, [&] {
      std::vector<checkpoint_piece> pieces;
      std::vector<std::vector<float>> values;
      for (auto& b : chunks_)
        with_state(b, /*write=*/false, [&](std::span<float> home, std::span<float> moment1, std::span<float> moment2) {
          const std::size_t owned_end = b.owned_end(), home_first = b.home_first();
          for (const auto& slot : map_.chunks[b.index].slots) {
            const std::size_t first = slot.offset / sizeof(float);
            const std::size_t lo = std::max(first, b.owned.offset);
            const std::size_t hi = std::min(first + model_.tensors[slot.tensor].elements, owned_end);
            if (lo >= hi) continue;
            const std::size_t n = hi - lo;
            std::vector<float> v(3 * n);
            std::copy_n(home.begin() + static_cast<std::ptrdiff_t>(lo - home_first), n, v.begin());
            std::copy_n(moment1.begin() + static_cast<std::ptrdiff_t>(lo - b.owned.offset), n, v.begin() + static_cast<std::ptrdiff_t>(n));
            std::copy_n(moment2.begin() + static_cast<std::ptrdiff_t>(lo - b.owned.offset), n, v.begin() + static_cast<std::ptrdiff_t>(2 * n));
            pieces.push_back({slot.tensor, lo - first, n});
            values.push_back(std::move(v));
          }
        });
      std::filesystem::create_directories(step_directory);
      write_file_atomically(checkpoint_rank_file(step_directory, static_cast<std::uint64_t>(ops_.rank()),
                                                 static_cast<std::uint64_t>(ops_.ranks())),
                            encode_checkpoint(identity(), std::move(pieces), values));
    });
    // Every rank's file is complete: commit, then drop older steps.
    agree("commit", directory, [&] {
      if (ops_.rank() != 0) return;
      write_file_atomically(directory / "LATEST", std::string(step_name) + " " + std::to_string(ops_.ranks()));
      for (const auto& entry : std::filesystem::directory_iterator(directory))
        if (entry.is_directory() && entry.path().filename().string().rfind("step-", 0) == 0 &&
            entry.path().filename() != step_name)
          std::filesystem::remove_all(entry.path());
    });
  }

  /// Restores the committed checkpoint of `directory`, saved with any rank count and any plan of the same model
  /// (resharding: each rank reads the pieces that overlap what it owns here). A collective call: the ranks agree on
  /// the outcome, so a file that one rank cannot load fails every rank (never a hang), and nothing is restored
  /// unless every rank has everything it needs.
  void load_checkpoint(const std::filesystem::path& directory) {
    std::vector<staged_chunk> staged;
    std::uint64_t steps = 0;
    agree("load", directory, [&] { staged = read_checkpoint(directory, steps); });
    for (auto& b : chunks_) {
      auto& from = staged[b.index];
      with_state(b, /*write=*/true, [&](std::span<float> home, std::span<float> moment1, std::span<float> moment2) {
        std::copy(from.home.begin(), from.home.end(), home.begin());
        std::copy(from.moment1.begin(), from.moment1.end(), moment1.begin());
        std::copy(from.moment2.begin(), from.moment2.end(), moment2.begin());
      });
      b.life = chunk_life(b.index, collective::shards_parameters || b.streamed ? chunk_state::released
                                                                               : chunk_state::ready);
    }
    steps_ = steps;
  }

  [[nodiscard]] runtime_traffic traffic() const noexcept {
    runtime_traffic t = traffic_;
    t.fetched = cache_stats().bytes_home_to_device;
    return t;
  }
  /// The device cache of streamed chunks: hits, misses, prefetches, bytes moved, time acquire stalled (all zero when
  /// every chunk is resident).
  [[nodiscard]] chunkwise::cache_stats cache_stats() const noexcept {
    if constexpr (streams)
      if (homes_) return homes_->stats();
    return {};
  }
  /// Peak and current bytes of the streamed chunks' home tier (pinned host, host or the NVMe store; zero when every
  /// chunk is resident).
  [[nodiscard]] tier_stats home_stats() const noexcept {
    if constexpr (streams)
      if (homes_) return homes_->home_stats();
    return {};
  }
  /// Chunks streamed from the placement's home (0 for resident placements).
  [[nodiscard]] std::size_t streamed_chunks() const noexcept {
    if constexpr (streams)
      if (homes_) return homes_->chunks();
    return 0;
  }
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }

  /// Peak and current bytes of this rank's device and pinned host tiers.
  [[nodiscard]] tier_stats device_stats() const noexcept { return device_.stats(); }
  [[nodiscard]] tier_stats host_stats() const noexcept { return host_.stats(); }

  [[nodiscard]] chunk_statistics statistics() const {
    chunk_statistics total;
    for (const auto& b : chunks_) total += b.life.statistics();
    return total;
  }

 private:
  /// Runs `body`; then the ranks agree: if any rank failed, every rank throws (its own error, or one naming how many
  /// other ranks failed).
  template <class Body>
  void agree(const char* what, const std::filesystem::path& directory, Body&& body) {
    std::exception_ptr failure;
    try {
      body();
    } catch (...) {  // every failure, out_of_memory included (it is no unambiguous std::exception)
      failure = std::current_exception();
    }
    const float failed = failure ? 1.0f : 0.0f;
    float failures = 0.0f;
    comm_->all_reduce(std::span<const float>(&failed, 1), std::span<float>(&failures, 1), reduce_op::sum).wait();
    if (failure) std::rethrow_exception(failure);
    if (failures > 0.0f)
      detail::raise(error_code::io_error, std::string("checkpoint ") + what + " '" + directory.string() + "': " +
                                              std::to_string(static_cast<int>(failures)) +
                                              " other rank(s) failed (their errors say why); " +
                                              (std::string_view(what) == "load" ? "nothing was restored"
                                                                                : "the previous checkpoint stays"));
  }

  /// What this rank restores into one chunk, and which of those elements the checkpoint covered.
  struct staged_chunk {
    std::vector<float> home, moment1, moment2;
    std::vector<unsigned char> have_home, have_moments;
  };

  // Reads every rank file of the committed step, taking the pieces that overlap this rank's home parameters and
  // owned moments in this run's layout; checks that every tensor element this rank needs was found.
  std::vector<staged_chunk> read_checkpoint(const std::filesystem::path& directory, std::uint64_t& steps) const {
    const checkpoint_commit commit = read_checkpoint_commit(directory);
    const checkpoint_identity mine = identity();
    std::vector<staged_chunk> staged(chunks_.size());
    for (const auto& b : chunks_) {
      auto& to = staged[b.index];
      to.home.assign(b.home_elements, 0.0f);
      to.moment1.assign(b.owned.elements, 0.0f);
      to.moment2.assign(b.owned.elements, 0.0f);
      to.have_home.assign(b.home_elements, 0);
      to.have_moments.assign(b.owned.elements, 0);
    }
    for (std::uint64_t q = 0; q < commit.ranks; ++q) {
      const auto file = checkpoint_rank_file(commit.step_directory, q, commit.ranks);
      if (!std::filesystem::exists(file))
        detail::raise(error_code::io_error, "checkpoint: '" + file.string() + "' is missing; LATEST names " +
                                                std::to_string(commit.ranks) + " rank files in '" +
                                                commit.step_directory.string() + "'");
      checkpoint_reader reader(file);
      const auto& id = reader.identity();
      if (id.model != mine.model || id.tensor_hash != mine.tensor_hash)
        detail::raise(error_code::invalid_argument, "checkpoint '" + file.string() + "' was saved for another model ('" +
                                                        id.model + "'; this run trains '" + mine.model +
                                                        "': its tensors' names or sizes differ)");
      if (id.ranks != commit.ranks || id.rank != q || (q > 0 && id.steps != steps))
        detail::raise(error_code::parse_error, "checkpoint '" + file.string() + "' says rank " + std::to_string(id.rank) +
                                                   " of " + std::to_string(id.ranks) + " after " +
                                                   std::to_string(id.steps) + " steps; LATEST and the other files "
                                                   "disagree (a mixed or partly overwritten checkpoint)");
      steps = id.steps;
      for (std::size_t k = 0; k < reader.pieces().size(); ++k) {
        const auto& piece = reader.pieces()[k];
        if (piece.tensor >= model_.tensors.size() || piece.first + piece.elements > model_.tensors[piece.tensor].elements)
          detail::raise(error_code::parse_error, "checkpoint '" + file.string() + "': piece " + std::to_string(k) +
                                                     " lies outside tensor " + std::to_string(piece.tensor));
        const auto& location = map_.locations[piece.tensor];
        const auto& b = chunks_[location.chunk];
        auto& to = staged[location.chunk];
        const std::size_t first = location.offset / sizeof(float) + piece.first, end = first + piece.elements;
        const std::size_t home_first = b.home_first(), home_end = b.home_end(), owned_end = b.owned_end();
        const auto missing = [&](std::size_t lo, std::size_t hi, std::size_t base, const std::vector<unsigned char>& have) {
          for (std::size_t i = lo; i < hi; ++i)
            if (!have[i - base]) return true;
          return false;
        };
        const std::size_t p_lo = std::max(first, home_first), p_hi = std::min(end, home_end);
        const std::size_t m_lo = std::max(first, b.owned.offset), m_hi = std::min(end, owned_end);
        const bool want_params = p_lo < p_hi && missing(p_lo, p_hi, home_first, to.have_home);
        const bool want_moments = m_lo < m_hi && missing(m_lo, m_hi, b.owned.offset, to.have_moments);
        if (!want_params && !want_moments) continue;
        const std::vector<float> values = reader.read(k);
        const std::size_t n = piece.elements;
        for (std::size_t i = p_lo; i < p_hi; ++i) {
          to.home[i - home_first] = values[i - first];
          to.have_home[i - home_first] = 1;
        }
        for (std::size_t i = m_lo; i < m_hi; ++i) {
          to.moment1[i - b.owned.offset] = values[n + i - first];
          to.moment2[i - b.owned.offset] = values[2 * n + i - first];
          to.have_moments[i - b.owned.offset] = 1;
        }
      }
    }
    // Every element of every tensor this rank keeps must have been found.
    for (const auto& b : chunks_) {
      const auto& to = staged[b.index];
      const std::size_t home_first = b.home_first(), home_end = b.home_end();
      for (const auto& slot : map_.chunks[b.index].slots) {
        const std::size_t first = slot.offset / sizeof(float), end = first + model_.tensors[slot.tensor].elements;
        bool complete = true;
        for (std::size_t i = std::max(first, home_first); i < std::min(end, home_end); ++i)
          complete = complete && to.have_home[i - home_first];
        for (std::size_t i = std::max(first, b.owned.offset); i < std::min(end, b.owned_end()); ++i)
          complete = complete && to.have_moments[i - b.owned.offset];
        if (!complete)
          detail::raise(error_code::parse_error, "checkpoint '" + commit.step_directory.string() + "' misses part of tensor '" +
                                                     model_.tensors[slot.tensor].name.str() + "'; its rank files do "
                                                     "not cover the model");
      }
    }
    return staged;
  }

  static constexpr std::size_t no_pass = ~std::size_t{0};

  struct chunk_buffers {
    std::uint32_t index = 0;
    std::size_t full_elements = 0;  // the gathered chunk
    std::size_t home_elements = 0;  // what this rank keeps between uses
    shard_range owned;
    chunk_life life{0};
    bool streamed = false;          // home off the device (cached<>, split<>): moves through the device cache
    std::uint32_t local = 0;        // its index among the streamed chunks
    bool cache_held = false;        // a cache block is acquired for it
    bool states_on_device = true;
    float* compute = nullptr;       // the parameters the trainer reads while the chunk is in use
    // home, moment1, moment2: resident chunks only (streamed ones keep them in homes_).
    detail::tier_buffer home, full, gradient, owned_gradient, moment1, moment2;
    pending<Comm> reduction;

    // Chunk element ranges: the home parameters [home_first, home_end) without padding, the owned elements
    // [owned.offset, owned_end).
    [[nodiscard]] std::size_t home_first() const noexcept { return collective::shards_parameters ? owned.offset : 0; }
    [[nodiscard]] std::size_t home_end() const noexcept {
      return collective::shards_parameters ? owned_end() : full_elements;
    }
    [[nodiscard]] std::size_t owned_end() const noexcept { return owned.offset + owned.valid; }
  };

  // Before any collective of the plan: every rank must run the same plan on the same model with the same layout
  // knobs, or the collectives would pair mismatched buffers (thread_comm notices, MPI and NCCL may not). One
  // all-gather of a fingerprint; a mismatch fails every rank with what this rank runs.
  static bool agree_on_plan(const model_profile& model, Comm& comm, const runtime_options& options) {
    const std::uint64_t mine = fnv1a(tensor_list_hash(model))  // continued over the plan and the knobs
                                   .add(Plan::name())
                                   .add(options.alignment)
                                   .add(options.chunk_bytes.value_or(0))
                                   .add(options.device_blocks.value_or(0))
                                   .value();
    std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
    comm.all_gather(std::span<const std::uint64_t>(&mine, 1), std::span<std::uint64_t>(all)).wait();
    for (std::size_t q = 0; q < all.size(); ++q)
      if (all[q] != all[0])
        detail::raise(error_code::invalid_argument,
                      "runtime: the ranks disagree on the plan: rank " + std::to_string(q) +
                          " differs from rank 0 in its plan, model or layout knobs (this is rank " +
                          std::to_string(comm.rank()) + ", running " + Plan::name() + " on '" + model.name.str() +
                          "'); every rank must choose the same plan from the same model and machine profile");
    return true;
  }

  // The layout's candidate with the searched chunk capacity (or the layout's own choice).
  static chunk_map build_layout(const model_profile& model, const layout_options& options,
                                std::optional<byte_count> chunk_bytes) {
    using candidates = layout_candidates<typename Plan::layout>;
    if (!chunk_bytes) return Plan::layout::build(model, options);
    std::string tried;
    for (std::size_t candidate = 0; candidate < candidates::count; ++candidate) {
      if (!candidates::can_pack(model, options, candidate)) continue;
      chunk_map map = candidates::build(model, options, candidate);
      if (map.summary().chunk_bytes == *chunk_bytes) return map;
      tried += (tried.empty() ? "" : ", ") + std::to_string(map.summary().chunk_bytes);
    }
    detail::raise(error_code::invalid_argument, "runtime: " + Plan::name() + " has no chunk size of " +
                                                    std::to_string(*chunk_bytes) + " bytes for this model and " +
                                                    std::to_string(options.ranks) + " ranks; its candidates: " +
                                                    tried + " (give the search's knob for the same rank count)");
  }

  // Device blocks (the planner's knob, or the fallback documented at runtime_options) and the resident chunks they
  // leave: Placement::resident_chunks, the first chunks in first-use order.
  std::size_t resident_chunk_count(const runtime_options& options) {
    const std::size_t n = map_.chunks.size();
    if constexpr (!streams) {
      device_blocks_ = n;
      return n;
    } else {
      std::size_t widest = 0;
      for (std::size_t s = 0; s < model_.passes.size(); ++s) widest = std::max(widest, chunks_of(s).size());
      std::size_t fallback = std::max<std::size_t>(2, widest);
      if constexpr (requires { placement::stream_blocks; }) fallback = n / 2 + placement::stream_blocks;
      device_blocks_ = options.device_blocks.value_or(fallback);
      if (device_blocks_ == 0)
        detail::raise(error_code::invalid_argument, "runtime: device_blocks = 0; " + std::string(placement::name) +
                                                        " needs at least one device block");
      return placement::resident_chunks(n, device_blocks_);
    }
  }

  // The streamed chunks' homes and a device cache of the blocks the resident chunks leave, enough for every pass.
  void start_streaming(const runtime_options& options, std::size_t resident) {
    if constexpr (streams) {
      detail::streamed_settings settings;
      settings.chunks = map_.chunks.size() - resident;
      settings.blocks = device_blocks_ - resident;
      settings.prefetch_depth = options.prefetch_depth;
      settings.nvme_directory = options.nvme_directory;
      std::size_t widest = 0;
      std::string widest_label;
      for (std::size_t s = 0; s < model_.passes.size(); ++s) {
        std::size_t streamed_here = 0;
        for (const auto c : chunks_of(s))
          if (chunks_[c].streamed) {
            settings.order.push_back(chunks_[c].local);
            ++streamed_here;
          }
        if (streamed_here > widest) {
          widest = streamed_here;
          widest_label = std::string(model_.passes[s].label.view());
        }
      }
      if (settings.blocks < widest)
        detail::raise(error_code::invalid_argument,
                      "runtime: " + Plan::name() + " with device_blocks = " + std::to_string(device_blocks_) +
                          " keeps " + std::to_string(resident) + " chunks resident and streams " +
                          std::to_string(settings.chunks) + " through " + std::to_string(settings.blocks) +
                          " blocks, but pass '" + widest_label + "' needs " + std::to_string(widest) +
                          " streamed chunks at once; use at least " + std::to_string(resident + widest) +
                          " device blocks");
      for (const auto& b : chunks_)
        if (b.streamed) {
          settings.param_elements.push_back(b.home_elements);
          settings.state_elements.push_back(b.owned.elements);
        }
      homes_ = std::make_unique<homes_type>(device_, host_, options.host_budget, std::move(settings));
    }
  }

  // Calls f(home parameters, moment1, moment2) of chunk b, wherever they live; `write`: f may change them.
  template <class F>
  void with_state(chunk_buffers& b, bool write, F&& f) {
    if constexpr (streams) {
      if (b.streamed) {
        if (write) homes_->update(b.local, f);
        else homes_->read(b.local, f);
        return;
      }
    }
    f(b.home.span(), b.moment1.span(), b.moment2.span());
  }

  // released -> the parameters the trainer reads: the home (resident), a cache block (streamed), gathered from
  // either when the collective shards parameters.
  void fetch_parameters(chunk_buffers& b) {
    float* home = b.home.data();
    if constexpr (streams) {
      if (b.streamed) {
        home = homes_->acquire(b.local);
        b.cache_held = true;
      }
    }
    if constexpr (collective::shards_parameters) {
      b.full = device_buffer(b.full_elements);
      ops_.template gather_params<float>(std::span<float>(home, b.home_elements), b.full.span()).wait();
      traffic_.gathered += (b.full_elements - b.home_elements) * sizeof(float);
      b.compute = b.full.data();
      release_cache_block(b);  // the gathered copy is what the trainer reads
    } else {
      b.compute = home;
    }
  }
  void drop_parameters(chunk_buffers& b) {
    b.full = {};
    release_cache_block(b);
    if (b.streamed || collective::shards_parameters) b.compute = nullptr;
  }
  void release_cache_block(chunk_buffers& b) {
    if constexpr (streams) {
      if (b.cache_held) {
        homes_->release(b.local);
        b.cache_held = false;
      }
    }
  }

  // Explicit hand-over: every tensor of the chunk handed over, and no pass holds it.
  bool handed_over(const chunk_buffers& b) const {
    return handover_ == gradient_handover::explicit_calls && chunk_ready_[b.index] == map_.chunks[b.index].slots.size() &&
           (b.life.state() == chunk_state::ready || b.life.state() == chunk_state::released);
  }
  // The chunk's gradients are complete: reduce them (averaging over ranks) while the trainer goes on.
  void start_reduction(chunk_buffers& b) {
    if (b.gradient.size() == 0) b.gradient = device_buffer(b.full_elements);  // no backward touched it: zeros
    b.reduction = ops_.template reduce_grads<float>(b.gradient.span(), b.owned_gradient.span(), reduce_op::average);
    traffic_.reduced += b.gradient.size() * sizeof(float);
    reducing_.push_back(b.index);
    drop_parameters(b);
  }

  // Device memory for a gathered chunk or a gradient accumulator. Past the budget, the gradients of finished
  // reductions go back first (waiting for the oldest if none has finished); out_of_memory only when none is left.
  detail::tier_buffer device_buffer(std::size_t elements) {
    for (;;) {
      try {
        return detail::tier_buffer(device_, elements);
      } catch (const error& e) {
        if (e.code() != error_code::out_of_memory || !reclaim_gradients(/*wait_for_oldest=*/true)) throw;
      }
    }
  }
  // Frees the accumulators of reductions that completed; true when one was freed.
  bool reclaim_gradients(bool wait_for_oldest) {
    bool freed = false;
    for (auto it = reducing_.begin(); it != reducing_.end();) {
      auto& b = chunks_[*it];
      const bool done = b.reduction.test() || (wait_for_oldest && !freed && it == reducing_.begin());
      if (!done) {
        ++it;
        continue;
      }
      b.reduction.wait();
      b.reduction = {};
      b.gradient = {};
      it = reducing_.erase(it);
      freed = true;
    }
    return freed;
  }

  std::vector<std::uint32_t> chunks_of(std::size_t pass) const {
    std::vector<std::uint32_t> chunks;
    for (const auto t : model_.passes[pass].tensors) {
      const auto c = map_.locations[t].chunk;
      if (std::find(chunks.begin(), chunks.end(), c) == chunks.end()) chunks.push_back(c);
    }
    return chunks;
  }
  std::uint32_t chunk_of(std::uint32_t tensor) const {
    if (tensor >= model_.tensors.size())
      detail::raise(error_code::invalid_argument, "runtime: tensor " + std::to_string(tensor) + " of " +
                                                      std::to_string(model_.tensors.size()));
    return map_.locations[tensor].chunk;
  }
  float* compute_parameters(std::uint32_t c) {
    auto& b = chunks_[c];
    if (b.life.state() != chunk_state::in_use)
      detail::raise(error_code::illegal_state, "runtime: parameters of chunk " + std::to_string(c) + " read while " +
                                                   std::string(to_string(b.life.state())) +
                                                   "; acquire a pass that uses it first");
    return b.compute;
  }
  std::span<float> view(std::uint32_t tensor, float* chunk_base) const {
    return {chunk_base + map_.locations[tensor].offset / sizeof(float), model_.tensors[tensor].elements};
  }
  void check_pass(std::size_t pass, const char* call) const {
    if (pass >= model_.passes.size())
      detail::raise(error_code::invalid_argument, std::string("runtime::") + call + ": pass " + std::to_string(pass) +
                                                      " of a profile with " + std::to_string(model_.passes.size()) +
                                                      " passes");
  }

  /// FNV-1a over the tensors' names and element counts: what a checkpoint and the plan agreement compare.
  static std::uint64_t tensor_list_hash(const model_profile& model) {
    fnv1a hash;
    for (const auto& t : model.tensors) hash.add(t.name.view()).add(t.elements);
    return hash.value();
  }
  checkpoint_identity identity() const {
    return {model_.name.str(), Plan::name(), tensor_list_hash(model_), static_cast<std::uint64_t>(ops_.ranks()),
            static_cast<std::uint64_t>(ops_.rank()), steps_};
  }

  model_profile model_;
  Comm* comm_;
  bool plan_agreed_;  // before ops_: binding the collective already talks to the other ranks
  chunk_collectives<collective, Comm> ops_;
  chunk_map map_;
  optim::cpu_adam adam_;
  emulated_device_tier device_;
  pinned_host_tier host_;
  std::unique_ptr<homes_type> homes_;  // streamed chunks (cached<>, split<>); after the tiers it allocates from
  std::vector<chunk_buffers> chunks_;  // after the tiers: destroyed first, returning their memory
  std::vector<std::size_t> last_backward_;
  std::list<std::uint32_t> reducing_;
  std::size_t device_blocks_ = 0;
  gradient_handover handover_ = gradient_handover::profile;
  std::vector<unsigned char> tensor_ready_;  // explicit hand-over: tensors handed over this iteration
  std::vector<std::size_t> chunk_ready_;     // and how many per chunk  // chunks whose gradient reduction may still run, oldest first
  std::uint64_t steps_ = 0;
  runtime_traffic traffic_;
};

}  // namespace chunkwise
