#pragma once
// Helpers shared by comm_test, collective_test and the MPI test: run a function on N thread ranks, seeded data,
// and the plain rank-order reference that the communicators must reproduce.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/dtype.hpp>

#include <cstdint>
#include <cstring>
#include <exception>
#include <random>
#include <span>
#include <thread>
#include <vector>

namespace test_support {

/// Runs body(rank) on `ranks` threads and rethrows the first rank's exception (by rank order) after joining all.
template <class Body>
void run_ranks(int ranks, Body body) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& thread : threads) thread.join();
  for (auto& error : errors)
    if (error) std::rethrow_exception(error);
}

template <class T>
T from_float(float value) {
  if constexpr (std::is_same_v<T, float>) return value;
  else if constexpr (std::is_same_v<T, chunkwise::bf16>) return chunkwise::to_bf16(value);
  else return chunkwise::to_fp16(value);
}

template <class T>
float to_float32(T value) {
  if constexpr (std::is_same_v<T, float>) return value;
  else return chunkwise::to_float(value);
}

/// `count` values in [-4, 4) from a generator seeded with `seed` (deterministic on every platform we build on:
/// mt19937 is specified bit for bit, and the conversion to float below is exact arithmetic on its output).
template <class T>
std::vector<T> random_values(std::size_t count, std::uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<T> values(count);
  for (auto& value : values)
    value = from_float<T>(static_cast<float>(static_cast<std::int32_t>(generator() >> 8) - (1 << 23)) /
                          static_cast<float>(1 << 21));
  return values;
}

/// Small integers in [-64, 64): their fp32 sums are exact, in any order.
inline std::vector<float> random_integers(std::size_t count, std::uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<float> values(count);
  for (auto& value : values) value = static_cast<float>(static_cast<int>(generator() % 128) - 64);
  return values;
}

/// The reference every host communicator must reproduce bit for bit: fp32 sum in rank order, average divides the
/// fp32 sum, one rounding at the end. Written independently of the library's reduction.
template <class T>
std::vector<T> rank_order_reduce(const std::vector<std::vector<T>>& inputs, std::size_t begin, std::size_t count,
                                 chunkwise::reduce_op op) {
  std::vector<T> result(count);
  for (std::size_t i = 0; i < count; ++i) {
    float sum = to_float32(inputs[0][begin + i]);
    for (std::size_t q = 1; q < inputs.size(); ++q) sum = sum + to_float32(inputs[q][begin + i]);
    if (op == chunkwise::reduce_op::average) sum = sum / static_cast<float>(inputs.size());
    result[i] = from_float<T>(sum);
  }
  return result;
}

/// Bitwise equality, so that -0 != +0 and NaN payloads count.
template <class T>
bool same_bits(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return same_bits(std::span<const T>(a), std::span<const T>(b));
}

}  // namespace test_support
