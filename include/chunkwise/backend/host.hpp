#pragma once
// The host backend: "device" memory is host memory, each stream is a worker thread running its queue in order, and
// events are completion flags. Every memory-limited scenario of the CUDA backend runs on a CPU-only machine this way.
#include <chunkwise/backend/concepts.hpp>
#include <chunkwise/core/worker_threads.hpp>
#include <chunkwise/core/bytes.hpp>

#include <cstring>
#include <string>
#include <memory>

namespace chunkwise {

/// An ordered queue of work run by one worker thread (the host stand-in for cudaStream_t); or, made with
/// `caller_thread`, the calling thread's own stream: each task runs at once, its error thrown to the caller (what a
/// trainer computing on its own thread has for a compute stream).
class host_stream {
 public:
  struct caller_thread_t {};
  static constexpr caller_thread_t caller_thread{};

  host_stream() : queue_(1) {}
  explicit host_stream(caller_thread_t) : queue_(0), on_caller_(true) {}
  template <class Task>
  void enqueue(Task&& task) {
    if (on_caller_) return static_cast<void>(std::forward<Task>(task)());
    queue_.push(std::forward<Task>(task));
  }
  /// Blocks until everything queued so far has run; rethrows a task's error.
  void synchronize() {
    queue_.drain();
    queue_.rethrow_if_failed();
  }

 private:
  worker_threads queue_;
  bool on_caller_ = false;
};

/// Completes when the work queued on its stream before it was recorded has run (cudaEvent_t's stand-in).
/// Copyable handle; an empty (default) event is complete.
class host_event {
 public:
  host_event() = default;
  explicit host_event(std::shared_ptr<completion> state) : state_(std::move(state)) {}
  [[nodiscard]] bool ready() const noexcept { return !state_ || state_->ready(); }
  void wait() const {
    if (state_) state_->wait();
  }

 private:
  std::shared_ptr<completion> state_;
};

class host_backend {
 public:
  using stream_ref = host_stream&;
  using event_type = host_event;
  static constexpr const char* name = "host";

  host_stream& h2d() noexcept { return h2d_; }
  host_stream& d2h() noexcept { return d2h_; }
  /// The trainer's compute stream: its own thread (the host backend's "kernels" run there).
  host_stream& compute() noexcept { return compute_; }

  /// Checked on the caller's thread: a null buffer would otherwise crash the stream's worker, far from the call.
  void copy_async(host_stream& stream, void* dst, const void* src, byte_count bytes) {
    if (bytes == 0) return;
    if (dst == nullptr || src == nullptr)
      throw_error(error_code::invalid_argument, std::string("host backend: copy_async of ") + std::to_string(bytes) +
                                                    " bytes " + (dst == nullptr ? "to" : "from") +
                                                    " a null buffer; give both buffers, or 0 bytes");
    stream.enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }
  host_event record(host_stream& stream) {
    auto state = std::make_shared<completion>();
    stream.enqueue([state] { state->complete(); });
    return host_event(std::move(state));
  }
  /// The stream's worker waits for the event before running later work: host-side, but off the caller's thread.
  void wait_on(host_stream& stream, const host_event& event) {
    if (event.ready()) return;
    stream.enqueue([event] { event.wait(); });
  }
  bool ready(const host_event& event) const noexcept { return event.ready(); }
  void wait(const host_event& event) const { event.wait(); }
  void synchronize(host_stream& stream) { stream.synchronize(); }
  void bind_thread() noexcept {}  // one "device": nothing to select

 private:
  host_stream h2d_;
  host_stream d2h_;
  host_stream compute_{host_stream::caller_thread};
};

static_assert(backend<host_backend>);

}  // namespace chunkwise
