#pragma once
// isolated_comm: thread ranks whose collectives take only isolated device memory (tier/isolated_device.hpp), as
// NCCL's take only GPU memory. It runs thread_comm's collectives on the blocks' aliases and refuses, naming the
// operation, any buffer that is not inside one isolated block: a runtime over it (runtime<Plan, isolated_backend,
// isolated_comm>) shows that every collective of several ranks is given device memory, as nccl_comm needs, on a
// machine without a GPU.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/comm/thread_comm.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/tier/isolated_device.hpp>

#include <functional>
#include <span>
#include <string>
#include <utility>

namespace chunkwise {

class isolated_comm {
 public:
  using request = thread_comm::request;

  explicit isolated_comm(thread_comm comm) : comm_(std::move(comm)) {}

  [[nodiscard]] int rank() const noexcept { return comm_.rank(); }
  [[nodiscard]] int size() const noexcept { return comm_.size(); }

  template <transferable_element T>
  request all_gather(std::span<const T> in, std::span<T> out) {
    return comm_.all_gather(device("all_gather", in), device("all_gather", out));
  }
  template <transferable_element T>
  request all_gather_after(std::span<const T> in, std::span<T> out, std::function<void()> before) {
    return comm_.all_gather_after(device("all_gather", in), device("all_gather", out), std::move(before));
  }
  template <reducible_element T>
  request reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    return comm_.reduce_scatter(device("reduce_scatter", in), device("reduce_scatter", out), op);
  }
  template <reducible_element T>
  request all_reduce(std::span<const T> in, std::span<T> out, reduce_op op) {
    return comm_.all_reduce(device("all_reduce", in), device("all_reduce", out), op);
  }
  template <transferable_element T>
  request broadcast(std::span<T> buffer, int root) {
    return comm_.broadcast(device("broadcast", buffer), root);
  }
  request barrier() { return comm_.barrier(); }
  isolated_comm split(int color, int key) { return isolated_comm(comm_.split(color, key)); }

 private:
  // The alias of a span that lies inside one isolated block; anything else is refused.
  template <class T>
  static std::span<T> device(const char* operation, std::span<T> buffer) {
    if (buffer.empty()) return buffer;
    auto* first = static_cast<std::byte*>(host_alias(buffer.data()));
    const auto* last = static_cast<const std::byte*>(host_alias(reinterpret_cast<const std::byte*>(buffer.data()) +
                                                                buffer.size_bytes() - 1));
    if (static_cast<const void*>(first) == static_cast<const void*>(buffer.data()) ||
        last != first + buffer.size_bytes() - 1)
      detail::raise(error_code::invalid_argument,
                    std::string("isolated_comm: ") + operation + " was given " + std::to_string(buffer.size_bytes()) +
                        " bytes of host memory; this communicator (as NCCL) takes only device memory");
    return {reinterpret_cast<T*>(first), buffer.size()};
  }

  thread_comm comm_;
};

static_assert(communicator<isolated_comm>);

template <>
inline constexpr bool reaches_device_memory<isolated_comm> = true;

}  // namespace chunkwise
