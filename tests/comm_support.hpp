#pragma once
// Helpers shared by comm_test, collective_test and the MPI test: run a function on N thread ranks, seeded data,
// and the plain rank-order reference that the communicators must reproduce.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/dtype.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <algorithm>
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

template <class T>
std::span<const T> cview(const std::vector<T>& v) {
  return std::span<const T>(v);
}

/// Every collective on one rank of `comm` against the rank-order reference, bit for bit, out of place and in place.
template <class T, chunkwise::communicator Comm>
void check_all_collectives(Comm& comm, std::size_t count) {
  using namespace chunkwise;
  const int ranks = comm.size();
  const int rank = comm.rank();
  const auto n = static_cast<std::size_t>(ranks);
  std::vector<std::vector<T>> inputs(n), blocks(n);  // inputs: `count` per rank; blocks: count * ranks per rank
  for (std::size_t r = 0; r < n; ++r) {
    inputs[r] = random_values<T>(count, static_cast<std::uint32_t>(100 + r));
    blocks[r] = random_values<T>(count * n, static_cast<std::uint32_t>(200 + r));
  }
  {
    const auto r = static_cast<std::size_t>(rank);
    CHECK(comm.rank() == rank);
    CHECK(comm.size() == ranks);

    // all_gather, out of place and in place
    std::vector<T> gathered(count * n);
    comm.all_gather(cview(inputs[r]), std::span<T>(gathered)).wait();
    std::vector<T> expected_gather;
    for (const auto& input : inputs) expected_gather.insert(expected_gather.end(), input.begin(), input.end());
    CHECK(same_bits(gathered, expected_gather));
    std::vector<T> in_place(count * n);
    std::copy(inputs[r].begin(), inputs[r].end(), in_place.begin() + static_cast<std::ptrdiff_t>(r * count));
    comm.all_gather(std::span<const T>(in_place.data() + r * count, count), std::span<T>(in_place)).wait();
    CHECK(same_bits(in_place, expected_gather));

    for (const reduce_op op : {reduce_op::sum, reduce_op::average}) {
      // reduce_scatter: block `rank` of the inputs, reduced
      std::vector<T> shard(count);
      comm.reduce_scatter(cview(blocks[r]), std::span<T>(shard), op).wait();
      CHECK(same_bits(shard, rank_order_reduce(blocks, r * count, count, op)));
      std::vector<T> scattered_in_place = blocks[r];
      comm.reduce_scatter(cview(scattered_in_place), std::span<T>(scattered_in_place.data() + r * count, count),
                          op)
          .wait();
      CHECK(same_bits(std::span<const T>(scattered_in_place.data() + r * count, count),
                      cview(rank_order_reduce(blocks, r * count, count, op))));

      // all_reduce: the same bits on every rank
      const auto expected = rank_order_reduce(inputs, 0, count, op);
      std::vector<T> reduced(count);
      comm.all_reduce(cview(inputs[r]), std::span<T>(reduced), op).wait();
      CHECK(same_bits(reduced, expected));
      std::vector<T> reduced_in_place = inputs[r];
      comm.all_reduce(cview(reduced_in_place), std::span<T>(reduced_in_place), op).wait();
      CHECK(same_bits(reduced_in_place, expected));
    }

    // broadcast from the last rank
    std::vector<T> buffer = inputs[r];
    comm.broadcast(std::span<T>(buffer), ranks - 1).wait();
    CHECK(same_bits(buffer, inputs[n - 1]));
    comm.barrier().wait();
  }
}

}  // namespace test_support
