#pragma once
// host_exchange: the runtime's collectives over small host arrays (the plan agreement, checkpoint outcomes, the
// gradient norm), blocking, whatever memory the communicator takes. A communicator that reaches only device memory
// (reaches_device_memory, as NCCL's) gets them through a device buffer of the runtime's device tier: copied up,
// exchanged, copied down. A few bytes, a few times a step.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/runtime/detail/tier_buffer.hpp>
#include <chunkwise/tier/concepts.hpp>

#include <cstddef>
#include <span>

namespace chunkwise::detail {

template <communicator Comm>
class host_exchange {
 public:
  template <class DeviceTier>
  host_exchange(Comm& comm, DeviceTier& device) : comm_(&comm) {
    if constexpr (reaches_device_memory<Comm> && host_staged_tier<DeviceTier>) {
      tier_ = &device;
      allocate_ = [](void* tier, std::size_t bytes) {
        return tier_buffer(*static_cast<DeviceTier*>(tier), (bytes + sizeof(float) - 1) / sizeof(float), dtype::fp32,
                           tier_buffer::unfilled);
      };
    }
  }

  [[nodiscard]] int rank() const { return comm_->rank(); }
  [[nodiscard]] int size() const { return comm_->size(); }

  template <transferable_element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    exchange(in, out, [this](auto from, auto to) { return comm_->all_gather(from, to); });
  }
  template <reducible_element T>
  void all_reduce(std::span<const T> in, std::span<T> out, reduce_op op) {
    exchange(in, out, [this, op](auto from, auto to) { return comm_->all_reduce(from, to, op); });
  }

 private:
  template <class T, class Collective>
  void exchange(std::span<const T> in, std::span<T> out, Collective&& collective) {
    if (allocate_ == nullptr) return collective(in, out).wait();
    const std::size_t out_at = round_up(in.size_bytes(), byte_count{64});
    auto staging = allocate_(tier_, out_at + out.size_bytes());
    staging.copy_from_host(0, in.data(), in.size_bytes());
    auto* base = staging.template data<std::byte>();
    collective(std::span<const T>(reinterpret_cast<const T*>(base), in.size()),
               std::span<T>(reinterpret_cast<T*>(base + out_at), out.size()))
        .wait();
    staging.copy_to_host(out.data(), out_at, out.size_bytes());
  }

  Comm* comm_;
  void* tier_ = nullptr;
  tier_buffer (*allocate_)(void* tier, std::size_t bytes) = nullptr;  // set where the exchange goes through the device
};

}  // namespace chunkwise::detail
