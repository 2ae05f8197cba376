#pragma once
// The collective_strategy contract (collective/concepts.hpp), for every strategy, on 1, 2 and 4 thread ranks
// (TEST_CASE_TEMPLATE_APPLY(collective_strategy_contract, std::tuple<S1, S2, ...>)).
//
// The strategy's operations run on a counting communicator that records every collective it is asked for, so the
// suite checks what the strategy does against what it says:
// - a world it does not support is refused at bind() with error_code::unsupported naming the strategy and the world;
// - owned ranges cut the padded chunk into equal shards in rank order within the ranks that share a chunk (the
//   group, or the world), the valid parts covering the chunk exactly once; home, full and owned sizes are the bytes
//   bytes_per_rank and working_bytes report;
// - gather_params gives every rank the whole chunk bit for bit, zeros in the padding;
// - reduce_grads gives every rank, over the range it owns, the sum (or mean) of all ranks' gradients: bit for bit
//   the rank-order fp32 reference where the strategy reduces in one rank-order pass, within a few ulps where
//   hybrid adds group sums, bit for bit on small integers always; zeros in the padding;
// - publish_update leaves in every rank's home what the strategy keeps there (the updated chunk, or its shard),
//   and the next gather sees the update;
// - traffic(), the bytes per rank a step moves by collective kind, equals the hand count (ring bus bytes) of the
//   collectives the strategy actually issued in one step: gathers_per_step parameter gathers, one gradient
//   reduction and one publication per chunk.
#include <chunkwise/collective/concepts.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/comm/thread_comm.hpp>
#include <chunkwise/core/dtype.hpp>

#include <doctest/doctest.h>

#include "../comm_support.hpp"
#include "expect_error.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace chunkwise::test::collective_contract {

enum class op_kind : std::uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier };

/// One collective a rank issued: its kind, the bytes of its full buffer (all_gather output, reduce_scatter input,
/// all_reduce / broadcast buffer), the size of the communicator, and whether that was a split-off part.
struct op_record {
  op_kind kind;
  byte_count bytes;
  int ranks;
  bool split;
};

/// A communicator that forwards to `Comm` and records every collective in its rank's log (shared with the parts
/// split from it). One log per rank: no locking.
template <communicator Comm>
class counting_comm {
 public:
  using request = typename Comm::request;
  using log_type = std::vector<op_record>;

  counting_comm(Comm inner, std::shared_ptr<log_type> log, bool split = false)
      : inner_(std::move(inner)), log_(std::move(log)), split_(split) {}

  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }

  template <transferable_element T>
  request all_gather(std::span<const T> in, std::span<T> out) {
    note(op_kind::all_gather, out.size_bytes());
    return inner_.all_gather(in, out);
  }
  template <reducible_element T>
  request reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    note(op_kind::reduce_scatter, in.size_bytes());
    return inner_.reduce_scatter(in, out, op);
  }
  template <reducible_element T>
  request all_reduce(std::span<const T> in, std::span<T> out, reduce_op op) {
    note(op_kind::all_reduce, out.size_bytes());
    return inner_.all_reduce(in, out, op);
  }
  template <transferable_element T>
  request broadcast(std::span<T> buffer, int root) {
    note(op_kind::broadcast, buffer.size_bytes());
    return inner_.broadcast(buffer, root);
  }
  request barrier() {
    note(op_kind::barrier, 0);
    return inner_.barrier();
  }
  counting_comm split(int color, int key) { return counting_comm(inner_.split(color, key), log_, true); }

  [[nodiscard]] const log_type& log() const { return *log_; }
  void clear_log() { log_->clear(); }

 private:
  void note(op_kind kind, std::size_t bytes) {
    log_->push_back(op_record{kind, static_cast<byte_count>(bytes), inner_.size(), split_});
  }
  Comm inner_;
  std::shared_ptr<log_type> log_;
  bool split_;
};

static_assert(communicator<counting_comm<thread_comm>>);

/// The hand count: ring bus bytes per rank (nccl-tests' convention) of the collectives in `log`; an all-reduce on a
/// split-off part is the cross-group one.
inline step_traffic hand_count(const std::vector<op_record>& log) {
  step_traffic traffic;
  for (const op_record& op : log) {
    const byte_count n = static_cast<byte_count>(op.ranks);
    const byte_count ring = op.ranks <= 1 ? 0 : op.bytes * (n - 1) / n;
    switch (op.kind) {
      case op_kind::all_gather: traffic.all_gather += ring; break;
      case op_kind::reduce_scatter: traffic.reduce_scatter += ring; break;
      case op_kind::all_reduce: (op.split ? traffic.cross_group_all_reduce : traffic.all_reduce) += 2 * ring; break;
      default: break;
    }
  }
  return traffic;
}

template <class S>
constexpr int gathers_per_step() {
  if constexpr (requires { S::gathers_per_step; }) return S::gathers_per_step;
  else return 1;
}

/// Ranks that share one chunk's shards: the group for hybrid, else the world (1: not cut).
template <class S>
int shard_group(int ranks) {
  if constexpr (!S::shards_gradients) return 1;
  else return S::group_size == 0 ? ranks : S::group_size;
}

/// Whether the strategy's reduction is one rank-order pass over the world (then it reproduces the reference bit
/// for bit); hybrid with 1 < G < ranks adds group sums instead.
template <class S>
bool reduces_in_rank_order(int ranks) {
  return S::group_size == 0 || S::group_size == 1 || S::group_size == ranks;
}

/// |got - want| within a few ulps of T, relative to the sum of the magnitudes that were added.
template <class T>
bool close(T got, T want, double magnitude) {
  const double ulp = std::is_same_v<T, float> ? 0x1p-23 : std::is_same_v<T, bf16> ? 0x1p-7 : 0x1p-10;
  const double g = test_support::to_float32(got), w = test_support::to_float32(want);
  return std::abs(g - w) <= 4 * ulp * (magnitude + std::abs(w)) + 1e-30;
}

/// What one rank saw, for the checks that compare ranks after they joined.
struct rank_view {
  std::vector<std::size_t> offsets, elements, valid;  // per chunk: the owned range (gradient type)
};

template <class T>
bool all_zero(std::span<const T> values) {
  for (const T& v : values)
    if (test_support::to_float32(v) != 0.0f || std::signbit(test_support::to_float32(v))) return false;
  return true;
}

/// What failed on one rank, as text, checked once on the test's thread after the ranks joined (one CHECK per
/// condition, instantiated for every strategy and element type, made this suite slow to compile).
struct findings {
  std::string context;
  std::string text;
  void expect(bool ok, const char* what, int line) {
    if (!ok) text += context + what + " (line " + std::to_string(line) + ")\n";
  }
};
#define CONTRACT_EXPECT(found, ...) (found).expect(static_cast<bool>(__VA_ARGS__), #__VA_ARGS__, __LINE__)

/// One step of chunk `c` (n elements) on one rank: P parameters, G gradients. What fails goes to `found`.
template <class S, class P, class G, class Ops>
void check_chunk(Ops& ops, int rank, int ranks, std::size_t c, std::size_t n, bool integers, reduce_op op,
                 rank_view& view, findings& found) {
  using test_support::from_float;
  found.context = "chunk " + std::to_string(c) + " (" + std::to_string(n) + " elements, " +
                  std::string(to_string(op)) + (integers ? ", small integers" : ", random reals") + "): ";
  const auto p_bytes = static_cast<byte_count>(n * sizeof(P));
  const auto g_bytes = static_cast<byte_count>(n * sizeof(G));
  const shard_range owned_p = ops.template owned<P>(n);
  const shard_range owned_g = ops.template owned<G>(n);
  const std::size_t home_n = ops.template home_elements<P>(n);
  const std::size_t full_p = ops.template full_elements<P>(n);
  const std::size_t full_g = ops.template full_elements<G>(n);
  view.offsets.push_back(owned_g.offset);
  view.elements.push_back(owned_g.elements);
  view.valid.push_back(owned_g.valid);

  // Sizes: what the cost model counts is what the buffers hold.
  CONTRACT_EXPECT(found, full_p >= n);
  CONTRACT_EXPECT(found, full_g >= n);
  CONTRACT_EXPECT(found, home_n * sizeof(P) == S::bytes_per_rank(tensor_role::parameter, p_bytes, 1, ranks));
  CONTRACT_EXPECT(found,
                  owned_g.elements * sizeof(G) == S::bytes_per_rank(tensor_role::gradient, g_bytes, 1, ranks));
  CONTRACT_EXPECT(found,
                  owned_p.elements * sizeof(P) == S::bytes_per_rank(tensor_role::optimizer_state, p_bytes, 1, ranks));
  if (S::working_bytes(tensor_role::gradient, g_bytes, ranks) != 0)
    CONTRACT_EXPECT(found, full_g * sizeof(G) == S::working_bytes(tensor_role::gradient, g_bytes, ranks));
  else
    CONTRACT_EXPECT(found, full_g == n);  // the gradient is reduced where it lies
  if constexpr (S::shards_parameters) {
    CONTRACT_EXPECT(found, full_p * sizeof(P) == S::working_bytes(tensor_role::parameter, p_bytes, ranks));
    CONTRACT_EXPECT(found, home_n == owned_p.elements);
  } else {
    // compute runs on the home
    CONTRACT_EXPECT(found, S::working_bytes(tensor_role::parameter, p_bytes, ranks) == 0);
    CONTRACT_EXPECT(found, home_n == full_p);
  }
  CONTRACT_EXPECT(found, owned_p.valid <= owned_p.elements);
  CONTRACT_EXPECT(found, owned_p.offset + owned_p.elements <= full_p);
  CONTRACT_EXPECT(found, owned_g.offset + owned_g.elements <= full_g);

  // Parameters: the chunk, then the home this rank keeps (the chunk, or its shard; zeros past the chunk).
  const std::vector<P> chunk = test_support::random_values<P>(n, static_cast<std::uint32_t>(900 + c));
  std::vector<P> home(home_n, from_float<P>(0.0f));
  const std::size_t home_begin = S::shards_parameters ? owned_p.offset : 0;
  for (std::size_t i = 0; i < home_n && home_begin + i < n; ++i) home[i] = chunk[home_begin + i];

  const auto gather = [&]() {
    std::vector<P> full;
    if constexpr (S::shards_parameters) {
      full.assign(full_p, from_float<P>(-1.0f));  // the gather must write every element
      auto done = ops.gather_params(std::span<const P>(home), std::span<P>(full));
      done.wait();
      CONTRACT_EXPECT(found, done.test());
    } else {
      ops.gather_params(std::span<const P>(home), std::span<P>(home)).wait();
      full = home;
    }
    return full;
  };
  if constexpr (!S::shards_parameters) {  // whole parameters: compute runs on the home, another buffer is a mistake
    std::vector<P> elsewhere(home_n);
    expect_error([&] { (void)ops.gather_params(std::span<const P>(home), std::span<P>(elsewhere)); },
                 error_code::invalid_argument, {std::string(S::name)});
  }
  {
    const auto full = gather();
    CONTRACT_EXPECT(found,
                    test_support::same_bits(std::span<const P>(full.data(), n), std::span<const P>(chunk)));
    CONTRACT_EXPECT(found, all_zero(std::span<const P>(full).subspan(n)));
  }

  // Gradients: every rank's, from its own seed; the reduction over ranks is the reference.
  std::vector<std::vector<G>> grads;
  for (int q = 0; q < ranks; ++q) {
    const auto seed = static_cast<std::uint32_t>(7000 + 131 * q + static_cast<int>(c));
    if (integers) {
      const auto small = test_support::random_integers(n, seed);
      std::vector<G> values(n);
      for (std::size_t i = 0; i < n; ++i) values[i] = from_float<G>(small[i] / 4.0f);  // [-16, 16): exact sums
      grads.push_back(std::move(values));
    } else {
      grads.push_back(test_support::random_values<G>(n, seed));
    }
  }
  const auto expected = test_support::rank_order_reduce(grads, 0, n, op);
  std::vector<G> full_grad(full_g, from_float<G>(0.0f));
  std::copy(grads[static_cast<std::size_t>(rank)].begin(), grads[static_cast<std::size_t>(rank)].end(),
            full_grad.begin());
  std::vector<G> owned_grad(owned_g.elements, from_float<G>(-1.0f));
  auto reduced = ops.reduce_grads(std::span<const G>(full_grad), std::span<G>(owned_grad), op);
  reduced.wait();
  CONTRACT_EXPECT(found, reduced.test());
  const bool exact = integers || reduces_in_rank_order<S>(ranks);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < owned_g.valid; ++i) {
    const G got = owned_grad[i], want = expected[owned_g.offset + i];
    if (exact) {
      if (!test_support::same_bits(std::span<const G>(&got, 1), std::span<const G>(&want, 1))) ++wrong;
    } else {
      double magnitude = 0.0;
      for (const auto& g : grads) magnitude += std::abs(test_support::to_float32(g[owned_g.offset + i]));
      if (!close(got, want, magnitude)) ++wrong;
    }
  }
  CONTRACT_EXPECT(found, wrong == 0);
  CONTRACT_EXPECT(found, all_zero(std::span<const G>(owned_grad).subspan(owned_g.valid)));

  // The update: the owner writes new values over its owned parameters, publishes; homes and the next gather agree.
  const std::vector<P> updated = test_support::random_values<P>(n, static_cast<std::uint32_t>(5100 + c));
  auto mine = ops.owned_params(std::span<P>(home));
  CONTRACT_EXPECT(found, mine.size() == owned_p.elements);
  for (std::size_t i = 0; i < owned_p.valid; ++i) mine[i] = updated[owned_p.offset + i];
  auto published = ops.publish_update(std::span<P>(home));
  published.wait();
  CONTRACT_EXPECT(found, published.test());
  if constexpr (S::shards_parameters) {
    CONTRACT_EXPECT(found, test_support::same_bits(std::span<const P>(home.data(), owned_p.valid),
                                  std::span<const P>(updated.data() + owned_p.offset, owned_p.valid)));
  } else {
    CONTRACT_EXPECT(found,
                    test_support::same_bits(std::span<const P>(home.data(), n), std::span<const P>(updated)));
  }
  const std::size_t kept = S::shards_parameters ? owned_p.valid : n;
  CONTRACT_EXPECT(found, all_zero(std::span<const P>(home).subspan(kept)));
  {
    const auto full = gather();
    CONTRACT_EXPECT(found,
                    test_support::same_bits(std::span<const P>(full.data(), n), std::span<const P>(updated)));
  }
}

/// One step over several chunks through `S` on `ranks` thread ranks, every rank checking what it sees; then the
/// ranks' owned ranges are compared with each other.
template <class S, class P, class G>
void check_strategy(int ranks, bool integers, reduce_op op) {
  using namespace std::chrono_literals;
  CAPTURE(ranks);
  CAPTURE(integers);
  const std::vector<std::size_t> chunks{1, 37, 1000, 4097};
  std::vector<rank_view> views(static_cast<std::size_t>(ranks));
  std::vector<findings> found(static_cast<std::size_t>(ranks));
  thread_world world(ranks, 5000ms);
  test_support::run_ranks(ranks, [&](int rank) {
    counting_comm<thread_comm> comm(world.comm(rank), std::make_shared<std::vector<op_record>>());
    findings& mine = found[static_cast<std::size_t>(rank)];
    if (!S::supports(ranks)) {
      expect_error([&] { (void)S::bind(comm); }, error_code::unsupported,
                   {std::string(S::name), std::to_string(ranks) + " ranks"});
      return;
    }
    auto ops = S::bind(comm);
    mine.expect(ops.rank() == rank && ops.ranks() == ranks, "bound to the rank and world size", __LINE__);
    mine.expect(ops.shard_ranks() == shard_group<S>(ranks), "shard_ranks() is the group size", __LINE__);
    for (std::size_t c = 0; c < chunks.size(); ++c)
      check_chunk<S, P, G>(ops, rank, ranks, c, chunks[c], integers, op, views[static_cast<std::size_t>(rank)],
                           mine);
  });
  for (int rank = 0; rank < ranks; ++rank) {
    CAPTURE(rank);
    CHECK(found[static_cast<std::size_t>(rank)].text == "");
  }
  if (!S::supports(ranks)) return;

  // Owned ranges: within each group of ranks sharing a chunk, shard after shard in rank order, equal lengths, the
  // valid parts covering the chunk exactly once; the same ranges in every group.
  const int group = shard_group<S>(ranks);
  findings ranges;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const std::size_t n = chunks[c];
    for (int r = 0; r < ranks; ++r) {
      ranges.context = "chunk " + std::to_string(c) + ", rank " + std::to_string(r) + ": ";
      const auto& v = views[static_cast<std::size_t>(r)];
      const auto& first = views[static_cast<std::size_t>(r - r % group)];  // the group's first rank
      CONTRACT_EXPECT(ranges, v.elements[c] == first.elements[c]);
      CONTRACT_EXPECT(ranges, v.offsets[c] == static_cast<std::size_t>(r % group) * v.elements[c]);
      const auto& same_place = views[static_cast<std::size_t>(r % group)];  // same place in group 0
      CONTRACT_EXPECT(ranges, v.offsets[c] == same_place.offsets[c]);
      const std::size_t valid = v.offsets[c] >= n ? 0 : std::min(v.elements[c], n - v.offsets[c]);
      CONTRACT_EXPECT(ranges, v.valid[c] == valid);
    }
    ranges.context = "chunk " + std::to_string(c) + ": ";
    std::size_t covered = 0;
    for (int r = 0; r < group; ++r) covered += views[static_cast<std::size_t>(r)].valid[c];
    CONTRACT_EXPECT(ranges, covered == n);
    if (!S::shards_gradients) CONTRACT_EXPECT(ranges, views[0].elements[c] == n);
  }
  CHECK(ranges.text == "");
}

/// The traffic of one step (gathers_per_step gathers, a reduction and a publication per chunk) as counted on the
/// wire of every rank, against S::traffic of those chunks.
template <class S>
void check_traffic(int ranks) {
  using namespace std::chrono_literals;
  if (!S::supports(ranks)) return;
  CAPTURE(ranks);
  const std::vector<std::size_t> chunks{1, 37, 1000, 4097};
  std::vector<findings> found(static_cast<std::size_t>(ranks));
  thread_world world(ranks, 5000ms);
  test_support::run_ranks(ranks, [&](int rank) {
    findings& mine = found[static_cast<std::size_t>(rank)];
    counting_comm<thread_comm> comm(world.comm(rank), std::make_shared<std::vector<op_record>>());
    auto ops = S::bind(comm);
    comm.clear_log();  // binding may split: that moves no chunk bytes
    step_traffic expected;
    for (const std::size_t n : chunks) {
      // bf16 parameters, fp32 gradients: a strategy that mixes up the two sizes is caught.
      std::vector<bf16> home(ops.template home_elements<bf16>(n), to_bf16(1.0f));
      std::vector<bf16> full(ops.template full_elements<bf16>(n));
      for (int k = 0; k < gathers_per_step<S>(); ++k) {
        if constexpr (S::shards_parameters)
          ops.gather_params(std::span<const bf16>(home), std::span<bf16>(full)).wait();
        else
          ops.gather_params(std::span<const bf16>(home), std::span<bf16>(home)).wait();
      }
      std::vector<float> full_grad(ops.template full_elements<float>(n), 1.0f);
      std::vector<float> owned_grad(ops.template owned<float>(n).elements);
      ops.reduce_grads(std::span<const float>(full_grad), std::span<float>(owned_grad), reduce_op::sum).wait();
      ops.publish_update(std::span<bf16>(home)).wait();
      const step_traffic one = S::traffic(static_cast<byte_count>(n * sizeof(bf16)),
                                          static_cast<byte_count>(n * sizeof(float)), 1, ranks);
      expected.all_gather += one.all_gather;
      expected.reduce_scatter += one.reduce_scatter;
      expected.all_reduce += one.all_reduce;
      expected.cross_group_all_reduce += one.cross_group_all_reduce;
    }
    const step_traffic counted = hand_count(comm.log());
    const auto describe = [](const step_traffic& t) {
      return "all_gather " + std::to_string(t.all_gather) + ", reduce_scatter " + std::to_string(t.reduce_scatter) +
             ", all_reduce " + std::to_string(t.all_reduce) + ", cross-group all_reduce " +
             std::to_string(t.cross_group_all_reduce);
    };
    if (!(counted == expected))
      mine.text += "traffic() says " + describe(expected) + " bytes; the collectives issued move " +
                   describe(counted) + "\n";
    // traffic() is linear in the chunk count for equal chunks
    mine.expect(S::traffic(4096, 8192, 3, ranks).total() == 3 * S::traffic(4096, 8192, 1, ranks).total(),
                "traffic of 3 equal chunks is 3 times that of one", __LINE__);
  });
  for (int rank = 0; rank < ranks; ++rank) {
    CAPTURE(rank);
    CHECK(found[static_cast<std::size_t>(rank)].text == "");
  }
}

#undef CONTRACT_EXPECT

}  // namespace chunkwise::test::collective_contract

TEST_CASE_TEMPLATE_DEFINE("collective_strategy contract: gathers, reductions, updates and byte counts", Strategy,
                          collective_strategy_contract) {
  using namespace chunkwise;
  namespace contract = chunkwise::test::collective_contract;
  static_assert(collective_strategy<Strategy>);
  static_assert(collective_strategy_for<Strategy, thread_comm>);
  static_assert(collective_strategy_for<Strategy, contract::counting_comm<thread_comm>>);
  static_assert(!Strategy::shards_parameters || Strategy::shards_gradients, "sharded parameters imply sharded grads");
  static_assert(Strategy::shards_gradients == Strategy::shards_optimizer_state);
  // usable in constant expressions (the search), and a world of one moves nothing
  static_assert(!Strategy::supports(1) || Strategy::traffic(1024, 1024, 2, 1).total() == 0);
  static_assert(Strategy::bytes_per_rank(tensor_role::parameter, 1024, 2, detail::smallest_world<Strategy>()) >= 2048 /
                                                                                   detail::smallest_world<Strategy>());
  CHECK(!Strategy::name.empty());

  for (const int ranks : {1, 2, 4}) {
    for (const reduce_op op : {reduce_op::sum, reduce_op::average}) {
      contract::check_strategy<Strategy, float, float>(ranks, true, op);
      contract::check_strategy<Strategy, float, float>(ranks, false, op);
      contract::check_strategy<Strategy, bf16, bf16>(ranks, true, op);
      contract::check_strategy<Strategy, bf16, bf16>(ranks, false, op);
    }
    contract::check_traffic<Strategy>(ranks);
  }
}
