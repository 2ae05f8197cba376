#pragma once
// A deterministic synthetic training workload run through a collective strategy on any communicator, and the
// plain single-rank reference it must reproduce. Shared by collective_test (thread ranks) and the MPI test.
//
// Chunks of seeded random parameters; at step s rank r's gradient of chunk c comes from a generator seeded with
// (s, r, c); gradients are reduced (sum or average) and an SGD step p -= lr * g (in fp32, rounded once to T) is
// applied by the owner of each element; then the strategy publishes the update. The runner records what compute
// sees (the gathered chunk) at every step, the reduced gradient of each owned range, and the final parameters.
#include "comm_support.hpp"

#include <chunkwise/collective.hpp>
#include <chunkwise/comm/concepts.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace test_support {

struct workload {
  std::vector<std::size_t> chunk_elements{1000, 37, 4097, 64};  // none a multiple of every rank count; 37 < a shard
  int steps = 3;
  bool integer_gradients = true;  // small integers: sums are exact in any order
  chunkwise::reduce_op op = chunkwise::reduce_op::sum;
  float learning_rate = 1.0f / 64;
};

template <class T>
struct workload_result {
  std::vector<std::vector<std::vector<T>>> seen;        // [step][chunk]: the chunk as compute saw it (n elements)
  std::vector<std::vector<std::vector<T>>> gradients;   // [step][chunk]: reduced gradient, whole chunk (reference)
                                                        // or this rank's owned valid range placed at its offset
  std::vector<std::vector<std::size_t>> owned_offset;   // [step][chunk] (runner) where its gradient range starts
  std::vector<std::vector<T>> final_params;             // [chunk]
};

inline std::uint32_t gradient_seed(int step, int rank, std::size_t chunk) {
  return static_cast<std::uint32_t>(1'000'003u * static_cast<unsigned>(step) + 7919u * static_cast<unsigned>(rank) +
                                    static_cast<unsigned>(chunk) + 17u);
}

template <class T>
std::vector<T> initial_params(std::size_t chunk, std::size_t elements) {
  return random_values<T>(elements, static_cast<std::uint32_t>(5000 + chunk));
}

template <class T>
std::vector<T> rank_gradient(const workload& w, int step, int rank, std::size_t chunk) {
  const std::size_t n = w.chunk_elements[chunk];
  if (!w.integer_gradients) return random_values<T>(n, gradient_seed(step, rank, chunk));
  std::vector<T> values(n);
  const auto integers = random_integers(n, gradient_seed(step, rank, chunk));
  for (std::size_t i = 0; i < n; ++i) values[i] = from_float<T>(integers[i]);
  return values;
}

template <class T>
T sgd(T param, T grad, float learning_rate) {
  return from_float<T>(to_float32(param) - learning_rate * to_float32(grad));
}

/// The single-rank reference for `ranks` ranks: reduce in rank order, update, repeat.
template <class T>
workload_result<T> run_reference(const workload& w, int ranks) {
  workload_result<T> result;
  std::vector<std::vector<T>> params;
  for (std::size_t c = 0; c < w.chunk_elements.size(); ++c) params.push_back(initial_params<T>(c, w.chunk_elements[c]));
  for (int step = 0; step < w.steps; ++step) {
    result.seen.push_back(params);
    result.gradients.emplace_back();
    for (std::size_t c = 0; c < params.size(); ++c) {
      std::vector<std::vector<T>> per_rank;
      for (int r = 0; r < ranks; ++r) per_rank.push_back(rank_gradient<T>(w, step, r, c));
      auto reduced = rank_order_reduce(per_rank, 0, params[c].size(), w.op);
      for (std::size_t i = 0; i < params[c].size(); ++i) params[c][i] = sgd(params[c][i], reduced[i], w.learning_rate);
      result.gradients.back().push_back(std::move(reduced));
    }
  }
  result.final_params = params;
  return result;
}

/// One rank's part of the workload through `Strategy` on `comm`. Every chunk's collectives of a step are issued
/// before any is waited for.
template <class Strategy, class T, chunkwise::communicator Comm>
workload_result<T> run_workload(Comm& comm, const workload& w) {
  using chunkwise::pending;
  auto ops = Strategy::bind(comm);
  const int rank = comm.rank();
  const std::size_t chunks = w.chunk_elements.size();
  workload_result<T> result;

  // Homes: the whole chunk (padded with zeros) or this rank's shard of it.
  std::vector<std::vector<T>> homes(chunks);
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t n = w.chunk_elements[c];
    const auto init = initial_params<T>(c, n);
    homes[c].assign(ops.template home_elements<T>(n), from_float<T>(0.0f));
    const std::size_t begin = Strategy::shards_parameters ? ops.template owned<T>(n).offset : 0;
    for (std::size_t i = 0; i < homes[c].size() && begin + i < n; ++i) homes[c][i] = init[begin + i];
  }

  const auto gather_all = [&](std::vector<std::vector<T>>& full) {
    std::vector<pending<Comm>> gathers;
    for (std::size_t c = 0; c < chunks; ++c) {
      if constexpr (Strategy::shards_parameters) {
        full[c].assign(ops.template full_elements<T>(w.chunk_elements[c]), from_float<T>(0.0f));
        gathers.push_back(ops.gather_params(std::span<const T>(homes[c]), std::span<T>(full[c])));
      } else {
        gathers.push_back(ops.gather_params(std::span<const T>(homes[c]), std::span<T>(homes[c])));
        full[c] = homes[c];
      }
    }
    for (auto& gather : gathers) gather.wait();
  };

  for (int step = 0; step < w.steps; ++step) {
    std::vector<std::vector<T>> full(chunks);
    gather_all(full);
    result.seen.emplace_back();
    for (std::size_t c = 0; c < chunks; ++c)
      result.seen.back().emplace_back(full[c].begin(), full[c].begin() + static_cast<std::ptrdiff_t>(w.chunk_elements[c]));

    // Backward: every chunk's gradient handed over, then reduced.
    std::vector<std::vector<T>> full_grads(chunks), owned_grads(chunks);
    std::vector<pending<Comm>> reductions;
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t n = w.chunk_elements[c];
      const auto grad = rank_gradient<T>(w, step, rank, c);
      full_grads[c].assign(ops.template full_elements<T>(n), from_float<T>(0.0f));
      std::copy(grad.begin(), grad.end(), full_grads[c].begin());
      owned_grads[c].assign(ops.template owned<T>(n).elements, from_float<T>(0.0f));
      reductions.push_back(
          ops.reduce_grads(std::span<const T>(full_grads[c]), std::span<T>(owned_grads[c]), w.op));
    }
    for (auto& reduction : reductions) reduction.wait();

    // Optimizer on the owned range, then publish.
    result.gradients.emplace_back();
    result.owned_offset.emplace_back();
    std::vector<pending<Comm>> publishes;
    for (std::size_t c = 0; c < chunks; ++c) {
      const auto owned = ops.template owned<T>(w.chunk_elements[c]);
      auto params = ops.owned_params(std::span<T>(homes[c]));
      for (std::size_t i = 0; i < owned.valid; ++i) params[i] = sgd(params[i], owned_grads[c][i], w.learning_rate);
      result.gradients.back().emplace_back(owned_grads[c].begin(),
                                           owned_grads[c].begin() + static_cast<std::ptrdiff_t>(owned.valid));
      result.owned_offset.back().push_back(owned.offset);
      publishes.push_back(ops.publish_update(std::span<T>(homes[c])));
    }
    for (auto& publish : publishes) publish.wait();
  }

  std::vector<std::vector<T>> full(chunks);
  gather_all(full);
  for (std::size_t c = 0; c < chunks; ++c)
    result.final_params.emplace_back(full[c].begin(), full[c].begin() + static_cast<std::ptrdiff_t>(w.chunk_elements[c]));
  return result;
}

/// Largest relative difference |a - b| / max(1, |b|) between two runs' values.
template <class T>
double max_relative_difference(std::span<const T> a, std::span<const T> b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double x = to_float32(a[i]), y = to_float32(b[i]);
    worst = std::max(worst, std::abs(x - y) / std::max(1.0, std::abs(y)));
  }
  return worst;
}

/// Compares one rank's run with the reference: exact (bitwise) or within `tolerance`. Returns a description of the
/// first mismatch, empty when all agree.
template <class T>
std::string compare_with_reference(const workload_result<T>& run, const workload_result<T>& reference, bool exact,
                                   double tolerance) {
  const auto agree = [&](std::span<const T> a, std::span<const T> b) {
    return exact ? same_bits(a, b) : max_relative_difference(a, b) <= tolerance;
  };
  for (std::size_t s = 0; s < reference.seen.size(); ++s)
    for (std::size_t c = 0; c < reference.seen[s].size(); ++c) {
      if (!agree(std::span<const T>(run.seen[s][c]), std::span<const T>(reference.seen[s][c])))
        return "parameters seen at step " + std::to_string(s) + ", chunk " + std::to_string(c) + " differ (max rel " +
               std::to_string(max_relative_difference<T>(run.seen[s][c], reference.seen[s][c])) + ")";
      const auto& mine = run.gradients[s][c];
      const std::span<const T> expected(reference.gradients[s][c].data() + run.owned_offset[s][c], mine.size());
      if (!agree(std::span<const T>(mine), expected))
        return "reduced gradient at step " + std::to_string(s) + ", chunk " + std::to_string(c) + " differs";
    }
  for (std::size_t c = 0; c < reference.final_params.size(); ++c)
    if (!agree(std::span<const T>(run.final_params[c]), std::span<const T>(reference.final_params[c])))
      return "final parameters of chunk " + std::to_string(c) + " differ (max rel " +
             std::to_string(max_relative_difference<T>(run.final_params[c], reference.final_params[c])) + ")";
  return {};
}

}  // namespace test_support
