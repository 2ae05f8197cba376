#pragma once
// nvme_update_pipeline: the optimizer updates of chunks whose states live in the NVMe store, pipelined as
// ZeRO-Infinity's and LoHan's out-of-core steps are: while one chunk's AdamW runs on its pinned scratch copy, the
// next chunk's blocks are read into another and the previous chunk's written back from a third, on one I/O thread.
// A step of n chunks then costs about max(n * (read + write), n * update) instead of n * (read + update + write).
// Each home block is read from the drive once a step where it can be: in bf16/fp16 an update that owns the chunk's
// whole home does not read its working block (it rewrites it); otherwise (fp32, whose working block holds the master
// weights, and ZeRO-2's partly owned blocks) the caller hands over the device cache's copy, fetched for backward,
// which is copied into a free scratch set, or else into a landing buffer that the set's read takes later.
//
//   prepare(c, copy)   reads chunk c's blocks ahead of its update, when a scratch set is free (any thread; the caller
//                knows the order: the optimizer stage prepares each chunk when its gradient is reduced, or the next
//                one of a deferred step's loop); `copy(destination)`, where given, writes the working block as it is
//                in the store (on the caller's thread, at once);
//   update(c, f, done)   f(home_view) on chunk c's state (its prepared copy, or read now), then written back behind
//                the caller; `done` completes once the bytes are on disk, or with the failure. One update at a time.
//   visit(c, write, f)   f outside the pipeline (initialisation, checkpoints, reads), after every write in flight;
//   drain()      waits for every read and write in flight and rethrows the first write failure.
//
// The I/O thread runs reads and writes in the order they were asked, so a read of a chunk always sees its last
// write, and a set whose write-back is still queued can take the next read at once (it runs after the write).
// Scratch sets come from the pinned tier; up to three are taken, fewer when its budget is short (one set: no
// overlap, nothing else changes).
#include <chunkwise/core/abi.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/worker_threads.hpp>
#include <chunkwise/plan/cost_model.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>
#include <chunkwise/runtime/home_view.hpp>
#include <chunkwise/runtime/nvme_update_stats.hpp>
#include <chunkwise/tier/nvme.hpp>
#include <chunkwise/tier/pinned_host.hpp>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace chunkwise::detail::inline CHUNKWISE_ABI {

/// One chunk's blocks in the NVMe store (master: bf16/fp16 only) and the geometry of its home view.
struct nvme_chunk_state {
  nvme_block param{}, master{}, moment1{}, moment2{};
  std::size_t param_elements = 0, state_elements = 0, owned_offset = 0;
};

class nvme_update_pipeline {
 public:
  static constexpr std::size_t max_sets = 3;  // one read ahead, one being updated, one being written back
  static constexpr std::size_t max_landings = 6;  // working blocks handed over while every set is busy
  static_assert(max_sets + max_landings == nvme_update_buffers, "the cost model counts these buffers");

  /// `pinned`: the backend's pinned host tier (page-aligned, so its blocks serve O_DIRECT).
  template <class PinnedTier>
  nvme_update_pipeline(nvme_tier& store, PinnedTier& pinned, std::vector<nvme_chunk_state> chunks, dtype type,
                       byte_count param_bytes, byte_count state_bytes)
      : store_(&store), chunks_(std::move(chunks)), type_(type), param_bytes_(param_bytes),
        state_bytes_(state_bytes) {
    for (std::size_t k = 0; k < max_sets; ++k) {
      try {
        sets_.push_back(std::make_unique<scratch>(pinned, param_bytes_, state_bytes_, type_ != dtype::fp32));
      } catch (const error& e) {
        if (e.code() != error_code::out_of_memory || sets_.empty()) throw;
        break;  // the pinned budget holds fewer sets: less overlap, the same results
      }
    }
    for (std::size_t k = 0; k < max_landings && sets_.size() == max_sets; ++k) {
      try {
        landings_.push_back({tier_buffer(pinned, round_up(param_bytes_, nvme_tier::io_alignment), dtype::uint8)});
      } catch (const error& e) {
        if (e.code() != error_code::out_of_memory) throw;
        break;  // fewer hand-overs: those blocks are read from the drive
      }
    }
  }
  nvme_update_pipeline(const nvme_update_pipeline&) = delete;
  nvme_update_pipeline& operator=(const nvme_update_pipeline&) = delete;
  ~nvme_update_pipeline() {
    for (auto& s : sets_)
      if (s->io.valid()) s->io.wait();  // never leave I/O running into freed buffers
  }

  [[nodiscard]] std::size_t scratch_sets() const noexcept { return sets_.size(); }
  [[nodiscard]] nvme_update_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  void prepare(std::uint32_t c) {
    std::lock_guard lock(mutex_);
    if (holding(c) != nullptr) return;
    if (scratch* s = idle_set()) start_read(*s, c);
  }
  // The copy (a block-sized memcpy, or a device-to-host copy) runs outside the lock, into a buffer claimed under
  // it: the I/O thread and the updates go on meanwhile. No read for c can look for the buffer before this returns:
  // c's read is queued here or by its own update, which is submitted after this call (on the same thread as
  // drain()).
  template <class CopyWorkingBlock>
  void prepare(std::uint32_t c, CopyWorkingBlock&& copy) {
    std::unique_lock lock(mutex_);
    if (holding(c) != nullptr) return;
    if (reads_working_block(c) && landed(c) == nullptr) {
      if (scratch* s = free_set()) {
        s->state = scratch::updating;  // claimed: no read ahead or update takes it while the copy runs
        copy_unlocked(lock, copy, s->param, [&] { s->state = scratch::idle; });
        ++stats_.params_handed_over;
        return start_read(*s, c, /*param_ready=*/true);
      }
      if (landing* l = free_landing()) {
        l->chunk = c;  // claimed
        copy_unlocked(lock, copy, l->param, [&] { l->chunk = landing::none; });
        ++stats_.params_handed_over;
      }
    }
    lock.unlock();
    prepare(c);
  }

  template <class F>
  void update(std::uint32_t c, F&& f, std::shared_ptr<completion> done) {
    try {
      scratch& s = take_for_update(c);
      s.io.get();  // its read (rethrows a failed one)
      f(view(s, c));
      std::lock_guard lock(mutex_);
      s.state = scratch::writing;
      s.io = io_.submit(std::packaged_task<void()>([this, &s, c, done] {
        try {
          transfer(s, c, /*write=*/true);
          if (done) done->complete();
        } catch (...) {
          if (done) done->complete(std::current_exception());
          std::lock_guard failure_lock(mutex_);
          if (!failure_) failure_ = std::current_exception();
        }
        // Written (no read was queued behind it: that would have made it `reading`): free for a hand-over's copy.
        std::lock_guard written_lock(mutex_);
        if (s.state == scratch::writing) s.state = scratch::idle;
      }));
    } catch (...) {
      if (done) done->complete(std::current_exception());
      throw;
    }
  }

  template <class F>
  void visit(std::uint32_t c, bool write, F&& f) {
    drain();
    scratch& s = *sets_.front();
    transfer(s, c, /*write=*/false);
    f(view(s, c));
    if (write) transfer(s, c, /*write=*/true);
  }

  void drain() {
    std::vector<std::future<void>> in_flight;
    {
      std::lock_guard lock(mutex_);
      for (auto& s : sets_)
        if (s->io.valid()) in_flight.push_back(std::move(s->io));
    }
    for (auto& io : in_flight) {
      try {
        io.get();
      } catch (...) {  // a read ahead that failed: its update never came (a write's failure is in failure_)
      }
    }
    std::exception_ptr failure;
    {
      std::lock_guard lock(mutex_);
      for (auto& s : sets_) s->state = scratch::idle;
      for (auto& l : landings_) l.chunk = landing::none;  // its update is done (or failed): the copy is old
      std::swap(failure, failure_);
    }
    if (failure) std::rethrow_exception(failure);
  }

 private:
  struct scratch {
    enum state_kind { idle, reading, updating, writing };
    // `separate_master`: bf16/fp16 (in fp32 the master weights are part of `param`).
    template <class PinnedTier>
    scratch(PinnedTier& pinned, byte_count param_bytes, byte_count state_bytes, bool separate_master)
        : param(pinned, round_up(param_bytes, nvme_tier::io_alignment), dtype::uint8),
          master(pinned, separate_master ? round_up(state_bytes, nvme_tier::io_alignment) : 0, dtype::uint8),
          moment1(pinned, round_up(state_bytes, nvme_tier::io_alignment), dtype::uint8),
          moment2(pinned, round_up(state_bytes, nvme_tier::io_alignment), dtype::uint8) {}
    tier_buffer param, master, moment1, moment2;
    state_kind state = idle;
    std::uint32_t chunk = 0;
    std::future<void> io;  // the read (reading) or write (writing) in flight
  };
  // A working block handed over while no set was free; the read of `chunk` for its update swaps it into its set.
  struct landing {
    static constexpr std::uint32_t none = ~std::uint32_t{0};
    tier_buffer param;
    std::uint32_t chunk = none;
  };

  // Whether the update of chunk c needs its working block: in bf16/fp16 it rewrites the block from the master weights
  // when it owns the whole home (replicated, ZeRO-3); fp32's block is the master weights.
  bool reads_working_block(std::uint32_t c) const {
    const auto& h = chunks_[c];
    return type_ == dtype::fp32 || h.owned_offset != 0 || h.state_elements != h.param_elements;
  }

  // Reads (or writes back) chunk c's blocks into (from) a scratch set: working parameters, master weights when
  // separate, the moments. `for_update`: a read for the optimizer, whose working block is either not needed (zeroed,
  // as the padding past the last tensor is on disk; see reads_working_block), already in the set (`param_ready`),
  // in a landing buffer (swapped in), or read.
  void transfer(scratch& s, std::uint32_t c, bool write, bool for_update = false, bool param_ready = false) {
    const auto& h = chunks_[c];
    const auto move = [&](nvme_block block, tier_buffer& buffer, byte_count bytes) {
      if (write) return store_->write(block, buffer.data<std::byte>(), bytes);
      store_->read(block, buffer.data<std::byte>(), bytes);
      if (!for_update) return;
      std::lock_guard lock(mutex_);
      stats_.bytes_read += bytes;
      stats_.params_read += &buffer == &s.param;
    };
    if (write || !for_update) move(h.param, s.param, param_bytes_);
    else if (!reads_working_block(c)) std::memset(s.param.data<std::byte>(), 0, param_bytes_);
    else if (!param_ready && !take_landing(s, c)) move(h.param, s.param, param_bytes_);
    if (type_ != dtype::fp32) move(h.master, s.master, state_bytes_);
    move(h.moment1, s.moment1, state_bytes_);
    move(h.moment2, s.moment2, state_bytes_);
  }
  home_view view(scratch& s, std::uint32_t c) const {
    const auto& h = chunks_[c];
    return home_view::of(s.param.data<std::byte>(), h.param_elements, type_, h.owned_offset, s.master.data(),
                         s.moment1.data(), s.moment2.data(), h.state_elements);
  }

  // With mutex_ held: the set holding (or reading) chunk c for its update; a set free for a read ahead.
  scratch* holding(std::uint32_t c) {
    for (auto& s : sets_)
      if (s->state == scratch::reading && s->chunk == c) return s.get();
    return nullptr;
  }
  // Idle, or writing back: the I/O thread runs a read queued now after that write (whose failure the write itself
  // keeps in failure_ and its completion).
  scratch* idle_set() {
    if (scratch* s = free_set()) return s;
    for (auto& s : sets_)
      if (s->state == scratch::writing) return s.get();
    return nullptr;
  }
  // Idle: no I/O touches it, so the caller may write into it now.
  scratch* free_set() {
    for (auto& s : sets_)
      if (s->state == scratch::idle) return s.get();
    return nullptr;
  }
  landing* free_landing() {
    for (auto& l : landings_)
      if (l.chunk == landing::none) return &l;
    return nullptr;
  }
  landing* landed(std::uint32_t c) {
    for (auto& l : landings_)
      if (l.chunk == c) return &l;
    return nullptr;
  }
  // With `lock` held on entry and on return: copy(destination) without it; a copy that throws gives the buffer back.
  template <class CopyWorkingBlock, class Release>
  void copy_unlocked(std::unique_lock<std::mutex>& lock, CopyWorkingBlock& copy, tier_buffer& destination,
                     Release release) {
    lock.unlock();
    try {
      copy(destination.data<std::byte>());
    } catch (...) {
      lock.lock();
      release();
      copied_.notify_all();
      throw;
    }
    lock.lock();
    copied_.notify_all();
  }
  // On the I/O thread, reading for chunk c's update: its handed-over working block, if any, becomes the set's.
  bool take_landing(scratch& s, std::uint32_t c) {
    std::lock_guard lock(mutex_);
    landing* l = landed(c);
    if (l == nullptr) return false;
    std::swap(s.param, l->param);
    l->chunk = landing::none;
    return true;
  }
  void start_read(scratch& s, std::uint32_t c, bool param_ready = false) {
    s.state = scratch::reading;
    s.chunk = c;
    s.io = io_.submit(std::packaged_task<void()>(
        [this, &s, c, param_ready] { transfer(s, c, /*write=*/false, /*for_update=*/true, param_ready); }));
  }
  // The set chunk c's update runs on: its read ahead, or a set read now (an idle or writing one, or one that read
  // ahead for another chunk: dropped, it changed nothing).
  scratch& take_for_update(std::uint32_t c) {
    std::unique_lock lock(mutex_);
    ++stats_.updates;
    if (holding(c) != nullptr) ++stats_.read_ahead;
    for (;;) {
      scratch* s = holding(c);
      if (s == nullptr && (s = idle_set()) != nullptr) start_read(*s, c);
      if (s != nullptr) {
        s->state = scratch::updating;
        return *s;
      }
      scratch* busy = nullptr;  // every set reads ahead for another chunk: drop the first
      for (auto& candidate : sets_)
        if (candidate->state == scratch::reading) {
          busy = candidate.get();
          break;
        }
      if (busy == nullptr) {  // the one set left is taking a hand-over's copy (prepare): its read comes next
        copied_.wait(lock);
        continue;
      }
      std::future<void> io = std::move(busy->io);
      busy->state = scratch::updating;  // held by this call while the lock is released
      lock.unlock();
      try {
        io.get();
      } catch (...) {  // its update reads again
      }
      lock.lock();
      busy->state = scratch::idle;
    }
  }

  nvme_tier* store_;
  std::vector<nvme_chunk_state> chunks_;
  dtype type_;
  byte_count param_bytes_, state_bytes_;
  std::vector<std::unique_ptr<scratch>> sets_;
  std::vector<landing> landings_;
  mutable std::mutex mutex_;
  std::condition_variable copied_;  // a hand-over's copy finished: the set it claimed is reading (or idle again)
  nvme_update_stats stats_;
  std::exception_ptr failure_;  // the first write-back that failed, until drain()
  worker_threads io_{1};        // last: destroyed first, after finishing what it was given
};

}  // namespace chunkwise::detail
