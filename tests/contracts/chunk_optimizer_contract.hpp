#pragma once
// The chunk_optimizer contract (optim/concepts.hpp), for every optimizer: `optimizer_factory<O>` says how to build
// one and which configurations to check,
//   static std::unique_ptr<O> make(const typename O::config_type&, unsigned threads);
//   static std::vector<typename O::config_type> configs();
// and TEST_CASE_TEMPLATE_APPLY(chunk_optimizer_contract, std::tuple<O1, O2, ...>) runs the suite. The reference
// update is chosen by the config type (adam_config: torch's Adam/AdamW; sgd_config: torch's SGD), in double.
//
// What it holds an optimizer to:
// - several steps over random chunks of 0, 1, 15, 16, 17, 31, 33, 1000 and 4099 elements (not multiples of any
//   SIMD width; several chunks per call, several tiles per chunk), with fp32, bf16 and fp16 gradients, a loss
//   scale, and a bf16, fp16 or no working copy, equal a plain double-precision reference within a relative 2e-6;
//   a working copy is the round-to-nearest-even of the updated master weight, bit for bit;
// - the same bits for 1, 2 and 3 threads, for the updates and for grad_sum_of_squares;
// - grad_sum_of_squares equals the double sum of the stored gradients (relative 1e-12), is 0 for no elements, and
//   is infinite or NaN when any gradient is;
// - state_arrays is the number of fp32 state arrays an update reads and writes besides the master weights: exactly
//   that many of moment1, moment2 change, a null one of those is rejected, and the others are left alone;
// - bad chunks and step arguments throw invalid_argument naming the chunk or argument before any memory changes.
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/optim/concepts.hpp>
#include <chunkwise/optim/hyperparameters.hpp>

#include <doctest/doctest.h>

#include "expect_error.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace chunkwise::test {

template <class Optimizer>
struct optimizer_factory;  // static std::unique_ptr<O> make(const config_type&, unsigned threads); configs()

}  // namespace chunkwise::test

namespace chunkwise::test::optimizer_contract {

/// One chunk's arrays with random contents, and the view an optimizer gets. Gradients are stored in `grads`;
/// the arrays start one element into their storage (unaligned).
struct chunk_data {
  std::size_t count;
  dtype grad_type;
  dtype working_type;
  bool with_working;
  std::vector<float> master, m1, m2, grad32;
  std::vector<bf16> grad_bf16, work_bf16;
  std::vector<fp16> grad_fp16, work_fp16;

  chunk_data(std::size_t n, std::uint32_t seed, dtype grads, bool working, dtype working_as)
      : count(n), grad_type(grads), working_type(working_as), with_working(working), master(n + 1), m1(n + 1),
        m2(n + 1), grad32(n + 1), grad_bf16(n + 1), work_bf16(n + 1), grad_fp16(n + 1), work_fp16(n + 1) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = 0; i <= n; ++i) {
      master[i] = normal(rng);
      m1[i] = 0.1f * normal(rng);
      m2[i] = 0.01f * std::abs(normal(rng));
      work_bf16[i] = to_bf16(-7.0f);  // sentinels: a working copy must be rewritten
      work_fp16[i] = to_fp16(-7.0f);
    }
    new_gradients(seed + 1, 1.0f);
  }

  void new_gradients(std::uint32_t seed, float scale) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = 0; i <= count; ++i) set_grad_at(i, scale * normal(rng));
  }
  void set_grad_at(std::size_t storage_index, float g) {
    grad32[storage_index] = g;
    grad_bf16[storage_index] = to_bf16(g);
    grad_fp16[storage_index] = to_fp16(g);
  }
  void set_grad(std::size_t i, float g) { set_grad_at(i + 1, g); }

  /// The gradient as the optimizer reads it.
  [[nodiscard]] double grad(std::size_t i) const {
    switch (grad_type) {
      case dtype::bf16: return to_float(grad_bf16[i + 1]);
      case dtype::fp16: return to_float(grad_fp16[i + 1]);
      default: return grad32[i + 1];
    }
  }

  [[nodiscard]] optim::chunk_arrays view() {
    optim::chunk_arrays v;
    v.master = master.data() + 1;
    v.moment1 = m1.data() + 1;
    v.moment2 = m2.data() + 1;
    v.grad_type = grad_type;
    v.grad = grad_type == dtype::bf16   ? static_cast<const void*>(grad_bf16.data() + 1)
             : grad_type == dtype::fp16 ? static_cast<const void*>(grad_fp16.data() + 1)
                                        : static_cast<const void*>(grad32.data() + 1);
    v.working_type = working_type;
    if (with_working)
      v.working = working_type == dtype::bf16 ? static_cast<void*>(work_bf16.data() + 1)
                                              : static_cast<void*>(work_fp16.data() + 1);
    v.count = count;
    return v;
  }

  /// Every byte the optimizer may write (the padding element in front included).
  [[nodiscard]] bool same_memory(const chunk_data& o) const {
    const auto eq = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    return eq(master, o.master) && eq(m1, o.m1) && eq(m2, o.m2) && eq(work_bf16, o.work_bf16) &&
           eq(work_fp16, o.work_fp16) && eq(grad32, o.grad32);
  }
};

/// The double-precision reference of one chunk: torch.optim's formulas on the same float hyper-parameters.
struct reference {
  std::vector<double> p, m, v;
  explicit reference(const chunk_data& c) {
    for (std::size_t i = 0; i < c.count; ++i) {
      p.push_back(c.master[i + 1]);
      m.push_back(c.m1[i + 1]);
      v.push_back(c.m2[i + 1]);
    }
  }
  void step(const optim::adam_config& cfg, const chunk_data& c, const optim::step_args& args) {
    const double b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps, wd = cfg.weight_decay, lr = args.lr;
    const double t = static_cast<double>(args.step);
    const double bias1 = 1.0 - std::pow(b1, t), bias2 = 1.0 - std::pow(b2, t);
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = c.grad(i) * static_cast<double>(args.grad_scale);
      if (cfg.decay_mode == optim::weight_decay_mode::l2) g += wd * p[i];
      m[i] = b1 * m[i] + (1.0 - b1) * g;
      v[i] = b2 * v[i] + (1.0 - b2) * g * g;
      if (cfg.decay_mode == optim::weight_decay_mode::decoupled) p[i] *= 1.0 - lr * wd;
      p[i] -= lr / bias1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bias2) + eps);
    }
  }
  void step(const optim::sgd_config& cfg, const chunk_data& c, const optim::step_args& args) {
    const double momentum = cfg.momentum;
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = c.grad(i) * static_cast<double>(args.grad_scale) + static_cast<double>(cfg.weight_decay) * p[i];
      if (momentum != 0.0) {
        m[i] = args.step == 1 ? g : momentum * m[i] + (1.0 - static_cast<double>(cfg.dampening)) * g;
        g = cfg.nesterov ? g + momentum * m[i] : m[i];
      }
      p[i] -= static_cast<double>(args.lr) * g;
    }
  }
};

/// Largest |x - ref| / (|ref| + rms(ref)): relative where values are not tiny, relative to the array's typical
/// size where they are.
inline double worst_error(const std::vector<float>& actual, const std::vector<double>& ref) {
  if (ref.empty()) return 0.0;
  double squares = 0.0;
  for (const double r : ref) squares += r * r;
  const double rms = std::sqrt(squares / static_cast<double>(ref.size()));
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double error = std::abs(static_cast<double>(actual[i + 1]) - ref[i]) / (std::abs(ref[i]) + rms + 1e-30);
    worst = std::isnan(error) ? INFINITY : std::max(worst, error);
  }
  return worst;
}

/// The state arrays a config's updates use, of moment1 and moment2 (SGD without momentum uses none).
template <class Config>
std::size_t used_state_arrays(const Config& config) {
  if constexpr (std::is_same_v<Config, optim::sgd_config>) return config.momentum != 0.0f ? 1 : 0;
  else return 2;
}

inline constexpr std::size_t lengths[] = {0, 1, 15, 16, 17, 31, 33, 1000, 4099};
inline constexpr optim::step_args schedule[] = {{1e-2f, 1, 1.0f}, {3e-3f, 2, 0.5f}, {1e-3f, 3, 1.0f / 1024}};

/// A set of chunks of every length with one gradient type and working copy.
inline std::vector<chunk_data> make_chunks(std::uint32_t seed, dtype grads, int copy) {
  std::vector<chunk_data> chunks;
  for (std::size_t k = 0; k < std::size(lengths); ++k)
    chunks.emplace_back(lengths[k], seed + static_cast<std::uint32_t>(17 * k), grads, copy > 0,
                        copy == 2 ? dtype::fp16 : dtype::bf16);
  return chunks;
}
inline std::vector<optim::chunk_arrays> views_of(std::vector<chunk_data>& chunks) {
  std::vector<optim::chunk_arrays> views;
  for (auto& c : chunks) views.push_back(c.view());
  return views;
}

/// Updates against the reference, for one config, over every gradient type and working copy; thread counts agree.
template <class O>
void check_updates(const typename O::config_type& config) {
  for (const dtype grads : {dtype::fp32, dtype::bf16, dtype::fp16})
    for (int copy = 0; copy < 3; ++copy) {
      CAPTURE(to_string(grads));
      CAPTURE(copy);
      std::vector<std::vector<chunk_data>> runs;  // one per thread count
      std::vector<std::vector<double>> sums;
      for (const unsigned threads : {1u, 2u, 3u}) {
        auto optimizer = optimizer_factory<O>::make(config, threads);
        auto chunks = make_chunks(11, grads, copy);
        std::vector<reference> references;  // on the first run only
        if (threads == 1)
          for (const auto& c : chunks) references.emplace_back(c);
        sums.emplace_back();
        for (const optim::step_args& args : schedule) {
          // Gradients scaled up as a loss scale would, and grad_scale undoing part of it.
          for (std::size_t k = 0; k < chunks.size(); ++k)
            chunks[k].new_gradients(static_cast<std::uint32_t>(1000 * args.step + k), 1.0f / args.grad_scale / 8);
          const auto views = views_of(chunks);
          sums.back().push_back(optimizer->grad_sum_of_squares(std::span<const optim::chunk_arrays>(views)));
          optimizer->step(std::span<const optim::chunk_arrays>(views), args);
          for (std::size_t k = 0; k < references.size(); ++k) references[k].step(config, chunks[k], args);
        }
        if (threads == 1) {
          for (std::size_t k = 0; k < chunks.size(); ++k) {
            const chunk_data& c = chunks[k];
            CAPTURE(c.count);
            CHECK(worst_error(c.master, references[k].p) < 2e-6);
            if (used_state_arrays(config) >= 1) CHECK(worst_error(c.m1, references[k].m) < 2e-6);
            if (used_state_arrays(config) >= 2) CHECK(worst_error(c.m2, references[k].v) < 2e-6);
            std::size_t wrong_copies = 0;
            for (std::size_t i = 0; i < c.count; ++i) {
              const float p = c.master[i + 1];
              if (copy == 1 && c.work_bf16[i + 1].bits != to_bf16(p).bits) ++wrong_copies;
              if (copy == 2 && c.work_fp16[i + 1].bits != to_fp16(p).bits) ++wrong_copies;
            }
            CHECK(wrong_copies == 0);
            // Nothing outside the chunk is written.
            CHECK(c.work_bf16[0].bits == to_bf16(-7.0f).bits);
            CHECK(c.work_fp16[0].bits == to_fp16(-7.0f).bits);
          }
        }
        runs.push_back(std::move(chunks));
      }
      for (std::size_t t = 1; t < runs.size(); ++t) {
        CAPTURE(t + 1);  // threads
        for (std::size_t k = 0; k < runs[t].size(); ++k) CHECK(runs[t][k].same_memory(runs[0][k]));
        for (std::size_t s = 0; s < sums[t].size(); ++s)
          CHECK(std::bit_cast<std::uint64_t>(sums[t][s]) == std::bit_cast<std::uint64_t>(sums[0][s]));
      }
    }
}

/// grad_sum_of_squares: the double sum of the stored gradients, the same bits for every thread count, 0 for no
/// elements, inf or NaN when any gradient is.
template <class O>
void check_sum_of_squares(const typename O::config_type& config) {
  auto one = optimizer_factory<O>::make(config, 1);
  auto three = optimizer_factory<O>::make(config, 3);
  for (const dtype grads : {dtype::fp32, dtype::bf16, dtype::fp16}) {
    CAPTURE(to_string(grads));
    auto chunks = make_chunks(23, grads, 0);
    auto views = views_of(chunks);
    const std::span<const optim::chunk_arrays> all(views);
    double plain = 0.0;
    for (const auto& c : chunks)
      for (std::size_t i = 0; i < c.count; ++i) plain += c.grad(i) * c.grad(i);
    const double sum = one->grad_sum_of_squares(all);
    CHECK(sum == doctest::Approx(plain).epsilon(1e-12));
    CHECK(std::bit_cast<std::uint64_t>(three->grad_sum_of_squares(all)) == std::bit_cast<std::uint64_t>(sum));
    CHECK(one->grad_sum_of_squares(all.first(1)) == 0.0);  // the chunk of 0 elements
    CHECK(one->grad_sum_of_squares(std::span<const optim::chunk_arrays>()) == 0.0);

    // One bad element anywhere, in any chunk: the sum says so.
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t k = 1; k < chunks.size(); ++k)
      for (const std::size_t i : {std::size_t{0}, chunks[k].count / 2, chunks[k].count - 1})
        for (const float bad : {inf, -inf, nan}) {
          CAPTURE(chunks[k].count);
          CAPTURE(i);
          CAPTURE(bad);
          const double before = chunks[k].grad(i);
          chunks[k].set_grad(i, bad);
          const double s1 = one->grad_sum_of_squares(all), s3 = three->grad_sum_of_squares(all);
          if (std::isnan(bad)) {
            CHECK(std::isnan(s1));
            CHECK(std::isnan(s3));
          } else {
            CHECK((std::isinf(s1) && s1 > 0));
            CHECK((std::isinf(s3) && s3 > 0));
          }
          chunks[k].set_grad(i, static_cast<float>(before));
        }
    // A finite fp32 gradient whose square overflows fp32 is still summed in double.
    if (grads == dtype::fp32) {
      chunks[5].set_grad(3, 1e30f);
      CHECK(std::isfinite(one->grad_sum_of_squares(all)));
      CHECK(one->grad_sum_of_squares(all) >= 1e60);
    }
  }
}

/// state_arrays counts the fp32 arrays besides the master weights that an update reads and writes.
template <class O>
void check_state_arrays(const typename O::config_type& config) {
  const std::size_t used = used_state_arrays(config);
  CHECK(used <= O::state_arrays);
  auto optimizer = optimizer_factory<O>::make(config, 1);
  chunk_data chunk(100, 31, dtype::fp32, false, dtype::bf16);
  const chunk_data before = chunk;
  optimizer->step(chunk.view(), {1e-2f, 1, 1.0f});
  optimizer->step(chunk.view(), {1e-2f, 2, 1.0f});
  const bool m1_changed = chunk.m1 != before.m1, m2_changed = chunk.m2 != before.m2;
  CHECK(static_cast<std::size_t>(m1_changed) + static_cast<std::size_t>(m2_changed) == used);
  CHECK(chunk.master != before.master);
  // A null array of those it uses is rejected and names it; a null one it does not use is fine.
  for (const int array : {1, 2}) {
    CAPTURE(array);
    chunk_data c(50, 37, dtype::fp32, false, dtype::bf16);
    const chunk_data untouched = c;
    optim::chunk_arrays view = c.view();
    (array == 1 ? view.moment1 : view.moment2) = nullptr;
    const bool needed = array == 1 ? m1_changed : m2_changed;
    if (needed) {
      expect_error([&] { optimizer->step(view, {1e-2f, 1, 1.0f}); }, error_code::invalid_argument,
                   {array == 1 ? "moment1" : "moment2"});
      CHECK(c.same_memory(untouched));
    } else {
      optimizer->step(view, {1e-2f, 1, 1.0f});
      CHECK(c.master != untouched.master);
    }
  }
}

/// Bad chunks and step arguments: invalid_argument naming the chunk or the argument, before any memory changes
/// (a good chunk before the bad one in the same call is left alone too).
template <class O>
void check_errors(const typename O::config_type& config) {
  auto optimizer = optimizer_factory<O>::make(config, 2);
  chunk_data good(64, 41, dtype::fp32, true, dtype::bf16), bad(40, 43, dtype::fp32, true, dtype::bf16);
  const chunk_data good_before = good, bad_before = bad;
  const auto attempt = [&](optim::chunk_arrays broken, optim::step_args args,
                           std::initializer_list<std::string_view> parts) {
    const optim::chunk_arrays both[] = {good.view(), broken};
    expect_error([&] { optimizer->step(std::span<const optim::chunk_arrays>(both), args); },
                 error_code::invalid_argument, parts);
    CHECK(good.same_memory(good_before));
    CHECK(bad.same_memory(bad_before));
  };
  optim::chunk_arrays view = bad.view();
  view.master = nullptr;
  attempt(view, {1e-2f, 1, 1.0f}, {"chunk 1", "40 elements", "master"});
  view = bad.view();
  view.grad = nullptr;
  attempt(view, {1e-2f, 1, 1.0f}, {"chunk 1", "gradients"});
  view = bad.view();
  view.grad_type = dtype::int32;
  attempt(view, {1e-2f, 1, 1.0f}, {"chunk 1", "fp32, bf16 or fp16"});
  view = bad.view();
  view.working_type = dtype::fp32;
  attempt(view, {1e-2f, 1, 1.0f}, {"chunk 1", "bf16 or fp16"});
  attempt(bad.view(), {1e-2f, 0, 1.0f}, {"step"});
  attempt(bad.view(), {std::numeric_limits<float>::quiet_NaN(), 1, 1.0f}, {"lr"});
  attempt(bad.view(), {1e-2f, 1, std::numeric_limits<float>::infinity()}, {"grad_scale"});
  // grad_sum_of_squares reads only gradients, and rejects a chunk without them.
  view = bad.view();
  view.grad = nullptr;
  const optim::chunk_arrays both[] = {good.view(), view};
  expect_error([&] { (void)optimizer->grad_sum_of_squares(std::span<const optim::chunk_arrays>(both)); },
               error_code::invalid_argument, {"chunk 1", "gradients"});
  view = bad.view();
  view.master = view.moment1 = view.moment2 = nullptr;
  CHECK(std::isfinite(optimizer->grad_sum_of_squares(std::span<const optim::chunk_arrays>(&view, 1))));
  // A chunk of no elements is a no-op, whatever its pointers.
  optim::chunk_arrays empty;
  optimizer->step(empty, {1e-2f, 1, 1.0f});
  CHECK(optimizer->grad_sum_of_squares(std::span<const optim::chunk_arrays>(&empty, 1)) == 0.0);
}

}  // namespace chunkwise::test::optimizer_contract

TEST_CASE_TEMPLATE_DEFINE("chunk_optimizer contract: reference updates, deterministic norms, state and errors",
                          Optimizer, chunk_optimizer_contract) {
  using namespace chunkwise;
  namespace contract = chunkwise::test::optimizer_contract;
  static_assert(optim::chunk_optimizer<Optimizer>);
  static_assert(Optimizer::state_arrays >= 1 && Optimizer::state_arrays <= 2,
                "chunk_arrays has two fp32 state arrays (moment1, moment2)");
  const auto configs = chunkwise::test::optimizer_factory<Optimizer>::configs();
  REQUIRE(!configs.empty());
  // Some configuration uses every state array the optimizer counts.
  std::size_t most = 0;
  for (const auto& config : configs) most = std::max(most, contract::used_state_arrays(config));
  CHECK(most == Optimizer::state_arrays);
  for (std::size_t k = 0; k < configs.size(); ++k) {
    CAPTURE(k);
    const auto& config = configs[k];
    contract::check_updates<Optimizer>(config);
    contract::check_state_arrays<Optimizer>(config);
  }
  contract::check_sum_of_squares<Optimizer>(configs.front());
  contract::check_errors<Optimizer>(configs.back());
}
