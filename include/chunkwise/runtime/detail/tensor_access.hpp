#pragma once
// The runtime's checked lookups of a tensor: its chunk, its span inside a chunk's memory in the model's element
// type, and the states in which the trainer may read its parameters or write its gradient; copies of such spans
// between the host and device memory. Each refusal names what was asked and what would be legal.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/profile/model_profile.hpp>
#include <chunkwise/runtime/chunk_state.hpp>
#include <chunkwise/tier/concepts.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace chunkwise::detail {

inline std::uint32_t chunk_of(const model_profile& model, const chunk_map& map, std::uint32_t tensor) {
  if (tensor >= model.tensors.size())
    raise(error_code::invalid_argument, "runtime: tensor " + std::to_string(tensor) + " of " +
                                            std::to_string(model.tensors.size()));
  return map.locations[tensor].chunk;
}

/// Tensor t's elements inside a chunk's memory, as T (which must be the model's element type `type`).
template <class T>
std::span<T> tensor_span(const model_profile& model, const chunk_map& map, dtype type, std::uint32_t tensor,
                         std::byte* chunk_base) {
  if (dtype_of<T>() != type)
    raise(error_code::invalid_argument, "runtime: tensor '" + model.tensors[tensor].name.str() + "' is " +
                                            std::string(to_string(type)) + ", asked for as " +
                                            std::string(to_string(dtype_of<T>())) +
                                            "; use parameter<T> / gradient<T> with the model's type");
  return {reinterpret_cast<T*>(chunk_base + map.locations[tensor].offset), model.tensors[tensor].elements};
}

/// The trainer reads a chunk's parameters only while a pass holds it.
template <class Record>
void require_parameters(const Record& b) {
  if (b.life.state() != chunk_state::in_use)
    raise(error_code::illegal_state, "runtime: parameters of chunk " + std::to_string(b.index) + " read while " +
                                         std::string(to_string(b.life.state())) + "; acquire a pass that uses it first");
}
/// ... and writes its gradients only while a backward pass holds it.
template <class Record>
void require_gradient(const Record& b, std::uint32_t tensor) {
  if (b.life.state() != chunk_state::in_use || b.gradient.empty())
    raise(error_code::illegal_state, "runtime: gradient of tensor " + std::to_string(tensor) + " (chunk " +
                                         std::to_string(b.index) + ") asked for outside a backward pass that uses "
                                         "it; gradients exist from a chunk's first backward acquire until its "
                                         "reduction");
}

inline void check_same_size(std::size_t a, std::size_t b, const char* call) {
  if (a != b)
    raise(error_code::invalid_argument, std::string("runtime::") + call + ": spans of " + std::to_string(a) + " and " +
                                            std::to_string(b) + " elements; give both the same size");
}

/// Synchronous copies between host memory and a device tier's memory: through the tier where the host cannot
/// address it (host_staged_tier), plain copies where it can.
template <class DeviceTier, class T>
void copy_to_host(DeviceTier& device, std::span<T> host, std::span<const T> from) {
  check_same_size(host.size(), from.size(), "copy_to_host");
  if constexpr (host_staged_tier<DeviceTier>) device.copy_to_host(host.data(), from.data(), host.size_bytes());
  else std::copy(from.begin(), from.end(), host.begin());
}
template <class DeviceTier, class T>
void copy_to_device(DeviceTier& device, std::span<T> to, std::span<const T> host) {
  check_same_size(to.size(), host.size(), "copy_to_device");
  if constexpr (host_staged_tier<DeviceTier>) device.copy_from_host(to.data(), host.data(), host.size_bytes());
  else std::copy(host.begin(), host.end(), to.begin());
}

inline void check_pass(const model_profile& model, std::size_t pass, const char* call) {
  if (pass >= model.passes.size())
    raise(error_code::invalid_argument, std::string("runtime::") + call + ": pass " + std::to_string(pass) +
                                            " of a profile with " + std::to_string(model.passes.size()) + " passes");
}

}  // namespace chunkwise::detail
