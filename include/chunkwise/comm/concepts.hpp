#pragma once
// The communicator seam: how ranks exchange chunk bytes. Three models: thread_comm (ranks as threads of one
// process), mpi_comm (processes, Open MPI) and nccl_comm (GPUs, stream-ordered).
//
// Buffer conventions follow NCCL's, so that every backend takes the same spans (n = elements per rank):
//   all_gather(in[n], out[n*size])      out[q*n, q*n+n) = in of rank q. In place when in == out + rank*n.
//   reduce_scatter(in[n*size], out[n])  out = op over ranks of block `rank` of in. In place when out == in + rank*n.
//   all_reduce(in[n], out[n])           out = op over ranks of in. In place when in == out.
//   broadcast(buffer[n], root)          buffer = root's buffer.
//   barrier()                           completes on a rank once every rank has called it.
//   split(color, key)                   a new communicator of the ranks with the same color, ordered by (key, rank);
//                                       a collective call, synchronous.
// Any other overlap of in and out is rejected. all_gather and broadcast move bytes and take any trivially copyable
// element; the reductions take float, bf16 and fp16.
//
// Reductions sum in fp32 whatever the element type and round back once, to nearest even (core's to_bf16 / to_fp16);
// `average` divides the fp32 sum by size() before rounding. The host communicators add in rank order
// (rank 0 + rank 1 + ...), so every rank gets the same bits whatever the order of arrival, and a single-rank
// reference that adds in the same order reproduces them exactly. nccl_comm uses NCCL's own reductions (its header
// says what that means for 16-bit types).
//
// Every operation is asynchronous: it returns a `request` that completes later (wait() blocks and rethrows the
// operation's error; test() polls). A default-constructed request is complete. A rank's operations, on one
// communicator and on every communicator split from it, take effect in the order that rank issued them, so an
// operation may consume the output of the one before without a wait in between. The caller keeps the buffers alive
// and untouched until the request completed. Under CUDA "take effect in order" is the communicator's stream order.
#include <chunkwise/core/dtype.hpp>

#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

namespace chunkwise {

enum class reduce_op : std::uint8_t { sum, average };

constexpr std::string_view to_string(reduce_op op) noexcept { return op == reduce_op::sum ? "sum" : "average"; }

/// Element types the reductions accept: fp32 and the two 16-bit floats (summed in fp32).
template <class T>
concept reducible_element = std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, fp16>;

/// Element types all_gather and broadcast accept: anything that may be copied as bytes.
template <class T>
concept transferable_element = std::is_trivially_copyable_v<T> && !std::is_const_v<T>;

template <reducible_element T>
constexpr dtype dtype_of() noexcept {
  if constexpr (std::same_as<T, float>) return dtype::fp32;
  else if constexpr (std::same_as<T, bf16>) return dtype::bf16;
  else return dtype::fp16;
}

/// Optional: an all-gather whose input is still being filled. `before` runs where the operation runs (a worker
/// thread, say) and returns once `in` holds its bytes, so the caller issues the gather now, in its place in the rank's
/// order, without waiting. Communicators without it: the caller waits first (chunk_collectives::gather_params).
template <class C, class T>
concept gathers_after_input = requires(C& comm, std::span<const T> in, std::span<T> out, std::function<void()> before) {
  { comm.all_gather_after(in, out, std::move(before)) } -> std::same_as<typename C::request>;
};

/// What an asynchronous operation returns.
template <class R>
concept completion_handle = std::movable<R> && std::default_initializable<R> && requires(R& request) {
  request.wait();
  { request.test() } -> std::same_as<bool>;
};

namespace detail {
template <class C, class T>
concept communicator_for = requires(C& comm, std::span<const T> in, std::span<T> out, reduce_op op, int root) {
  { comm.all_gather(in, out) } -> std::same_as<typename C::request>;
  { comm.reduce_scatter(in, out, op) } -> std::same_as<typename C::request>;
  { comm.all_reduce(in, out, op) } -> std::same_as<typename C::request>;
  { comm.broadcast(out, root) } -> std::same_as<typename C::request>;
};
}  // namespace detail

template <class C>
concept communicator =
    std::movable<C> && completion_handle<typename C::request> &&
    detail::communicator_for<C, float> && detail::communicator_for<C, bf16> && detail::communicator_for<C, fp16> &&
    requires(C& comm, const C& const_comm, int color, int key) {
      { const_comm.rank() } -> std::same_as<int>;
      { const_comm.size() } -> std::same_as<int>;
      { comm.barrier() } -> std::same_as<typename C::request>;
      { comm.split(color, key) } -> std::same_as<C>;
    };

/// Whether a communicator's collectives may be given device memory the host cannot address. The host communicators
/// touch chunk bytes on the host, so they need chunks the host can address. Specialise to true for a device
/// communicator whose runtime path is built (nccl_comm's is not yet: the runtime still gives its communicator host
/// buffers for plan agreement, the gradient norm and publication).
template <class C>
inline constexpr bool reaches_device_memory = false;

/// Whether a communicator's collectives run in order after the work queued on the backend's compute stream (a CUDA
/// stream that waits for the legacy default stream's work, as nccl_comm's must): a collective reading a buffer that
/// is filled in stream order (a cache block whose fetch the compute stream waits for) then needs no host wait.
template <class C>
inline constexpr bool follows_compute_stream = false;

}  // namespace chunkwise
