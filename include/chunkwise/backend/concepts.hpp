#pragma once
// The `backend` seam: ordered streams of copies and events, the way CUDA streams and events work. The host backend
// runs each stream on a worker thread; the CUDA backend (backend/cuda/backend.cuh) maps them to cudaStream_t and
// cudaEvent_t. The transfer engine and the device cache are written against this concept only.
//
//   backend.h2d() / backend.d2h()           the dedicated host-to-device and device-to-host copy streams
//   backend.compute()                       the stream the trainer's kernels run on (CUDA: the legacy default
//                                           stream; host: the calling thread): work queued there is ordered with
//                                           them without a host wait (the gradient accumulators' zeroing and freeing)
//   backend.copy_async(stream, dst, src, n) a copy ordered after earlier work on `stream`
//   backend.record(stream) -> event         completes when the work queued on `stream` before it has run
//   backend.wait_on(stream, event)          later work on `stream` waits for `event` (no host block)
//   backend.ready(event) / backend.wait(event)   poll / block the calling host thread
//   backend.bind_thread()                   makes the backend's device current on a worker thread (cudaSetDevice)
#include <chunkwise/core/bytes.hpp>

#include <concepts>

namespace chunkwise {

template <class B>
concept backend = requires(B& b, typename B::stream_ref stream, const typename B::event_type& event, void* dst,
                           const void* src, byte_count bytes) {
  { b.h2d() } -> std::convertible_to<typename B::stream_ref>;
  { b.d2h() } -> std::convertible_to<typename B::stream_ref>;
  { b.compute() } -> std::convertible_to<typename B::stream_ref>;
  b.copy_async(stream, dst, src, bytes);
  { b.record(stream) } -> std::same_as<typename B::event_type>;
  b.wait_on(stream, event);
  { b.ready(event) } -> std::same_as<bool>;
  b.wait(event);
  b.synchronize(stream);
  b.bind_thread();
  { B::name } -> std::convertible_to<const char*>;
};

}  // namespace chunkwise
