#pragma once
// The host reduction every host communicator shares: fp32 accumulation in rank order, one rounding at the end.
// Keeping it in one place is what makes thread_comm and mpi_comm agree bit for bit.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace chunkwise::detail {

template <reducible_element T>
constexpr float widen(T value) noexcept {
  if constexpr (std::same_as<T, float>) return value;
  else return to_float(value);
}

template <reducible_element T>
constexpr T narrow(float value) noexcept {
  if constexpr (std::same_as<T, float>) return value;
  else if constexpr (std::same_as<T, bf16>) return to_bf16(value);
  else return to_fp16(value);
}

/// out[i] = round(((src[0][i] + src[1][i]) + src[2][i]) + ...), divided by `ranks` first for `average`; all in fp32.
/// `out` may be one of the sources (same positions): each block is read completely before it is written.
template <reducible_element T>
void reduce_in_rank_order(std::span<const T* const> sources, T* out, std::size_t count, reduce_op op, int ranks) {
  // One rank's reduction is its input: widening, dividing by 1 and rounding an exact value change no bit (a 16-bit
  // signalling NaN stays signalling). One copy, where the loop below would take three passes over the elements.
  if (sources.size() == 1 && ranks == 1) {
    if (sources[0] != out) std::memmove(out, sources[0], count * sizeof(T));
    return;
  }
  constexpr std::size_t block = 2048;  // 8 KiB of fp32 partial sums: stays in L1 while the sources stream through
  float partial[block];
  const float divisor = static_cast<float>(ranks);
  for (std::size_t base = 0; base < count; base += block) {
    const std::size_t length = std::min(block, count - base);
    const T* first = sources[0] + base;
    for (std::size_t i = 0; i < length; ++i) partial[i] = widen(first[i]);
    for (std::size_t q = 1; q < sources.size(); ++q) {
      const T* source = sources[q] + base;
      for (std::size_t i = 0; i < length; ++i) partial[i] += widen(source[i]);
    }
    if (op == reduce_op::average)
      for (std::size_t i = 0; i < length; ++i) partial[i] /= divisor;
    T* target = out + base;
    for (std::size_t i = 0; i < length; ++i) target[i] = narrow<T>(partial[i]);
  }
}

/// True when the byte ranges [a, a+a_bytes) and [b, b+b_bytes) share a byte.
inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

/// Checks the NCCL buffer conventions of comm/concepts.hpp; throws invalid_argument naming the operation.
/// Returns whether the call is in place.
template <class T>
bool check_all_gather(std::string_view who, std::span<const T> in, std::span<T> out, int rank, int ranks) {
  if (out.size() != in.size() * static_cast<std::size_t>(ranks))
    raise(error_code::invalid_argument, std::string(who) + ": all_gather of " + std::to_string(in.size()) +
                                            " elements per rank over " + std::to_string(ranks) +
                                            " ranks needs an output of " +
                                            std::to_string(in.size() * static_cast<std::size_t>(ranks)) +
                                            " elements; it has " + std::to_string(out.size()));
  const bool in_place = in.data() == out.data() + static_cast<std::size_t>(rank) * in.size();
  if (!in_place && overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes()))
    raise(error_code::invalid_argument, std::string(who) + ": all_gather input overlaps the output; in place means "
                                                           "input == output + rank * count");
  return in_place;
}

template <class T>
bool check_reduce_scatter(std::string_view who, std::span<const T> in, std::span<T> out, int rank, int ranks) {
  if (in.size() != out.size() * static_cast<std::size_t>(ranks))
    raise(error_code::invalid_argument, std::string(who) + ": reduce_scatter to " + std::to_string(out.size()) +
                                            " elements per rank over " + std::to_string(ranks) +
                                            " ranks needs an input of " +
                                            std::to_string(out.size() * static_cast<std::size_t>(ranks)) +
                                            " elements; it has " + std::to_string(in.size()));
  const bool in_place = out.data() == in.data() + static_cast<std::size_t>(rank) * out.size();
  if (!in_place && overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes()))
    raise(error_code::invalid_argument, std::string(who) + ": reduce_scatter output overlaps the input; in place "
                                                           "means output == input + rank * count");
  return in_place;
}

template <class T>
bool check_all_reduce(std::string_view who, std::span<const T> in, std::span<T> out) {
  if (in.size() != out.size())
    raise(error_code::invalid_argument, std::string(who) + ": all_reduce input has " + std::to_string(in.size()) +
                                            " elements and output " + std::to_string(out.size()) +
                                            "; they must be equal");
  const bool in_place = in.data() == out.data();
  if (!in_place && overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes()))
    raise(error_code::invalid_argument, std::string(who) + ": all_reduce output overlaps the input without being "
                                                           "the same buffer");
  return in_place;
}

inline void check_root(std::string_view who, int root, int ranks) {
  if (root < 0 || root >= ranks)
    raise(error_code::invalid_argument, std::string(who) + ": broadcast from root " + std::to_string(root) +
                                            ", but ranks are 0.." + std::to_string(ranks - 1));
}

}  // namespace chunkwise::detail
