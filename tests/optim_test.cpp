// Optimizers over chunk memory: against a double-precision reference, across instruction sets and thread counts,
// mixed precision (write-back rounding, loss scaling, clipping) and state checkpoints.
#include <chunkwise/optim.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <sstream>
#include <type_traits>
#include <vector>

using namespace chunkwise;
using namespace chunkwise::optim;

static_assert(chunk_optimizer<cpu_adam>);
static_assert(chunk_optimizer<cpu_sgd>);
static_assert(cpu_adam::state_arrays == 2 && cpu_sgd::state_arrays == 1);
static_assert(!chunk_optimizer<int>);

namespace {

// fp32 results are compared with the double reference as |x - ref| <= rel_tolerance * (|ref| + rms(ref)): relative
// where values are not tiny, and relative to the array's typical size where they are (first moments pass near 0).
constexpr double rel_tolerance = 1e-6;

std::vector<cpu_isa> supported_isas() {
  std::vector<cpu_isa> isas{cpu_isa::scalar};
  if (cpu_supports(cpu_isa::avx2)) isas.push_back(cpu_isa::avx2);
  if (cpu_supports(cpu_isa::avx512)) isas.push_back(cpu_isa::avx512);
  return isas;
}

/// Owns the arrays of one chunk; `offset` elements of padding in front make every array start unaligned.
struct owned_chunk {
  std::size_t count, offset;
  dtype grad_type, working_type;
  bool with_working;
  std::vector<float> master, m1, m2, grad32;
  std::vector<bf16> grad_bf16, working_bf16;
  std::vector<fp16> grad_fp16, working_fp16;

  owned_chunk(std::size_t n, std::uint32_t seed, dtype grads = dtype::fp32, bool working = false,
              dtype working_as = dtype::bf16, std::size_t pad = 1, float grad_multiplier = 1.0f)
      : count(n), offset(pad), grad_type(grads), working_type(working_as), with_working(working),
        master(n + pad), m1(n + pad), m2(n + pad), grad32(n + pad), grad_bf16(n + pad), working_bf16(n + pad),
        grad_fp16(n + pad), working_fp16(n + pad) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = 0; i < n + pad; ++i) {
      master[i] = normal(rng);
      m1[i] = 0.1f * normal(rng);
      m2[i] = 0.01f * std::abs(normal(rng));
    }
    randomize_grads(seed + 1000, grad_multiplier);
  }

  void randomize_grads(std::uint32_t seed, float multiplier = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = 0; i < count + offset; ++i) {
      const float g = multiplier * normal(rng);
      grad32[i] = g;
      grad_bf16[i] = to_bf16(g);
      grad_fp16[i] = to_fp16(g);
    }
  }

  /// The gradient the kernel sees, as a float.
  [[nodiscard]] float grad(std::size_t i) const {
    switch (grad_type) {
      case dtype::bf16: return to_float(grad_bf16[offset + i]);
      case dtype::fp16: return to_float(grad_fp16[offset + i]);
      default: return grad32[offset + i];
    }
  }
  void set_grad(std::size_t i, float g) {
    grad32[offset + i] = g;
    grad_bf16[offset + i] = to_bf16(g);
    grad_fp16[offset + i] = to_fp16(g);
  }

  [[nodiscard]] chunk_arrays view() {
    chunk_arrays c;
    c.master = master.data() + offset;
    c.moment1 = m1.data() + offset;
    c.moment2 = m2.data() + offset;
    c.grad_type = grad_type;
    c.grad = grad_type == dtype::bf16   ? static_cast<const void*>(grad_bf16.data() + offset)
             : grad_type == dtype::fp16 ? static_cast<const void*>(grad_fp16.data() + offset)
                                        : static_cast<const void*>(grad32.data() + offset);
    c.working_type = working_type;
    if (with_working)
      c.working = working_type == dtype::bf16 ? static_cast<void*>(working_bf16.data() + offset)
                                              : static_cast<void*>(working_fp16.data() + offset);
    c.count = count;
    return c;
  }

  [[nodiscard]] bool same_memory(const owned_chunk& o) const {
    const auto eq = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    return eq(master, o.master) && eq(m1, o.m1) && eq(m2, o.m2) && eq(working_bf16, o.working_bf16) &&
           eq(working_fp16, o.working_fp16);
  }
};

/// Double-precision Adam/AdamW (torch.optim formulas), on the float hyper-parameters the kernel gets.
struct reference_adam {
  std::vector<double> p, m, v;
  explicit reference_adam(const owned_chunk& c) {
    for (std::size_t i = 0; i < c.count; ++i) {
      p.push_back(c.master[c.offset + i]);
      m.push_back(c.m1[c.offset + i]);
      v.push_back(c.m2[c.offset + i]);
    }
  }
  void step(const adam_config& cfg, const owned_chunk& c, float lr, std::uint64_t t, double grad_scale = 1.0) {
    const double b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps, wd = cfg.weight_decay, rate = lr;
    const double bias1 = 1.0 - std::pow(b1, static_cast<double>(t)), bias2 = 1.0 - std::pow(b2, static_cast<double>(t));
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = static_cast<double>(c.grad(i)) * grad_scale;
      if (cfg.decay_mode == weight_decay_mode::l2) g += wd * p[i];
      m[i] = b1 * m[i] + (1.0 - b1) * g;
      v[i] = b2 * v[i] + (1.0 - b2) * g * g;
      const double denom = std::sqrt(v[i]) / std::sqrt(bias2) + eps;
      if (cfg.decay_mode == weight_decay_mode::decoupled) p[i] *= 1.0 - rate * wd;
      p[i] -= rate / bias1 * m[i] / denom;
    }
  }
};

struct reference_sgd {
  std::vector<double> p, b;
  explicit reference_sgd(const owned_chunk& c) {
    for (std::size_t i = 0; i < c.count; ++i) {
      p.push_back(c.master[c.offset + i]);
      b.push_back(0.0);
    }
  }
  void step(const sgd_config& cfg, const owned_chunk& c, float lr, std::uint64_t t) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = static_cast<double>(c.grad(i)) + static_cast<double>(cfg.weight_decay) * p[i];
      if (cfg.momentum != 0.0f) {
        b[i] = t == 1 ? g : cfg.momentum * b[i] + (1.0 - static_cast<double>(cfg.dampening)) * g;
        g = cfg.nesterov ? g + cfg.momentum * b[i] : b[i];
      }
      p[i] -= static_cast<double>(lr) * g;
    }
  }
};

/// Largest |x - ref| / (|ref| + rms(ref)) over the chunk's elements.
double worst_error(const std::vector<float>& actual, std::size_t offset, const std::vector<double>& ref) {
  double square_sum = 0.0;
  for (const double r : ref) square_sum += r * r;
  const double rms = std::sqrt(square_sum / static_cast<double>(ref.size()));
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(actual[offset + i]) - ref[i]) / (std::abs(ref[i]) + rms));
  return worst;
}

constexpr float schedule[] = {1e-2f, 3e-3f, 1e-3f, 5e-4f};  // a learning-rate schedule, one entry per step

}  // namespace

TEST_CASE("fp32 Adam and AdamW match a double-precision reference within 1e-6 relative") {
  const adam_config configs[] = {adamw_config(0.1f), adam_config{0.9f, 0.999f, 1e-8f, 0.05f, weight_decay_mode::l2},
                                 adam_config{0.8f, 0.95f, 1e-6f, 0.0f, weight_decay_mode::decoupled}};
  for (const auto& config : configs)
    for (const cpu_isa isa : supported_isas()) {
      CAPTURE(to_string(isa));
      owned_chunk chunk(10007, 7);
      reference_adam ref(chunk);
      cpu_adam adam(config, {.threads = 2, .isa = isa, .tile_elements = 1024, .pool = nullptr});
      for (std::uint64_t t = 1; t <= 4; ++t) {
        chunk.randomize_grads(static_cast<std::uint32_t>(100 + t));
        adam.step(chunk.view(), {schedule[t - 1], t, 1.0f});
        ref.step(config, chunk, schedule[t - 1], t);
      }
      CHECK(worst_error(chunk.master, chunk.offset, ref.p) < rel_tolerance);
      CHECK(worst_error(chunk.m1, chunk.offset, ref.m) < rel_tolerance);
      CHECK(worst_error(chunk.m2, chunk.offset, ref.v) < rel_tolerance);
    }
}

TEST_CASE("SGD with momentum, Nesterov and weight decay matches a double-precision reference") {
  const sgd_config configs[] = {{}, {0.9f, 0.0f, 0.01f, false}, {0.9f, 0.0f, 0.0f, true}, {0.5f, 0.25f, 0.0f, false}};
  for (const auto& config : configs)
    for (const cpu_isa isa : supported_isas()) {
      CAPTURE(to_string(isa));
      owned_chunk chunk(4099, 11);
      reference_sgd ref(chunk);
      cpu_sgd sgd(config, {.threads = 1, .isa = isa});
      for (std::uint64_t t = 1; t <= 4; ++t) {
        chunk.randomize_grads(static_cast<std::uint32_t>(200 + t));
        sgd.step(chunk.view(), {schedule[t - 1], t, 1.0f});
        ref.step(config, chunk, schedule[t - 1], t);
      }
      CHECK(worst_error(chunk.master, chunk.offset, ref.p) < rel_tolerance);
      if (config.momentum != 0.0f) CHECK(worst_error(chunk.m1, chunk.offset, ref.b) < rel_tolerance);
    }
}

TEST_CASE("every instruction set gives bit-identical results for all gradient and working-copy types") {
  const std::size_t lengths[] = {1, 7, 15, 16, 17, 33, 1000, 4097};
  const dtype grad_types[] = {dtype::fp32, dtype::bf16, dtype::fp16};
  for (const std::size_t n : lengths)
    for (const dtype grads : grad_types)
      for (int copy = 0; copy < 3; ++copy) {
        CAPTURE(n);
        CAPTURE(to_string(grads));
        CAPTURE(copy);
        const bool working = copy > 0;
        const dtype working_as = copy == 2 ? dtype::fp16 : dtype::bf16;
        const auto isas = supported_isas();
        std::vector<owned_chunk> adam_results, sgd_results;
        std::vector<double> norms;
        for (const cpu_isa isa : isas) {
          owned_chunk a(n, 3, grads, working, working_as, 3);
          cpu_adam adam(adamw_config(), {.threads = 1, .isa = isa});
          for (std::uint64_t t = 1; t <= 2; ++t) adam.step(a.view(), {1e-2f, t, 0.5f});
          const chunk_arrays view = a.view();
          norms.push_back(adam.grad_sum_of_squares(std::span(&view, 1)));
          adam_results.push_back(std::move(a));
          owned_chunk s(n, 5, grads, working, working_as, 1);
          cpu_sgd sgd({0.9f, 0.1f, 0.01f, false}, {.threads = 1, .isa = isa});
          for (std::uint64_t t = 1; t <= 2; ++t) sgd.step(s.view(), {1e-2f, t, 2.0f});
          sgd_results.push_back(std::move(s));
        }
        for (std::size_t k = 1; k < isas.size(); ++k) {
          CAPTURE(to_string(isas[k]));
          CHECK(adam_results[k].same_memory(adam_results[0]));
          CHECK(sgd_results[k].same_memory(sgd_results[0]));
          CHECK(std::bit_cast<std::uint64_t>(norms[k]) == std::bit_cast<std::uint64_t>(norms[0]));
        }
      }
}

TEST_CASE("widen and accumulate_scaled: every instruction set, the scalar definition, bit for bit") {
  // Ordinary values and special ones: subnormals, bf16/fp16 ties, fp16 overflow, signed zero, infinity, NaN.
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float specials[] = {0.0f, -0.0f, 1e-40f, -3e-39f, 1.00390625f, 1.01171875f, 65520.0f, 1e-8f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 6.1e-5f};
  const auto check = [&]<class T>(T) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{1003}}) {
      CAPTURE(n);
      std::vector<float> g(n);
      std::vector<T> start(n);
      for (std::size_t i = 0; i < n; ++i) {
        g[i] = i < std::size(specials) ? specials[i] : normal(random);
        start[i] = from_float<T>(i + 3 < std::size(specials) ? specials[(i + 3) % std::size(specials)] : normal(random));
      }
      std::vector<std::vector<std::uint16_t>> sums;
      std::vector<std::vector<std::uint32_t>> wides;
      for (const cpu_isa isa : supported_isas()) {
        std::vector<T> acc = start;
        accumulate_scaled<T>(acc, g, 0.5f, isa);
        std::vector<float> wide(n);
        widen<T>(acc, wide, isa);
        std::vector<std::uint16_t> sum_bits(n);
        std::vector<std::uint32_t> wide_bits(n);
        for (std::size_t i = 0; i < n; ++i) {
          sum_bits[i] = acc[i].bits;
          wide_bits[i] = std::bit_cast<std::uint32_t>(wide[i]);
          // The definition: one fused multiply-add in fp32, rounded to nearest even; widening is exact.
          CHECK(acc[i].bits == from_float<T>(std::fma(0.5f, g[i], to_float(start[i]))).bits);
          CHECK(wide_bits[i] == std::bit_cast<std::uint32_t>(to_float(acc[i])));
        }
        sums.push_back(std::move(sum_bits));
        wides.push_back(std::move(wide_bits));
      }
      for (std::size_t k = 1; k < sums.size(); ++k) {
        CHECK(sums[k] == sums[0]);
        CHECK(wides[k] == wides[0]);
      }
    }
  };
  check(bf16{});
  check(fp16{});
  std::vector<bf16> acc(3);
  std::vector<float> g(4);
  CHECK_THROWS_WITH_AS(accumulate_scaled<bf16>(acc, g, 1.0f), doctest::Contains("3 and 4 elements"), error);
}

TEST_CASE("bf16 and fp16 working copies are the round-to-nearest-even of the updated fp32 weights") {
  // Ordinary values after a real update, and special ones kept by a zero update (lr 0, zero gradients):
  // subnormals, ties, fp16 overflow and underflow, signed zero, infinity, NaN.
  const std::uint32_t specials[] = {0x00000001, 0x80400000, 0x00700000, 0x3f808000, 0x3f818000, 0x3f808001,
                                    0x477ff000, 0x477fefff, 0x33800000, 0x33000001, 0x32ffffff, 0x80000000,
                                    0x7f800000, 0xff800000, 0x7fc00123, 0x7f7fffff, 0x38800000, 0x387fe000};
  for (const cpu_isa isa : supported_isas())
    for (const dtype working_as : {dtype::bf16, dtype::fp16}) {
      CAPTURE(to_string(isa));
      CAPTURE(to_string(working_as));
      owned_chunk updated(1031, 17, dtype::fp32, true, working_as, 1);
      cpu_adam adam(adamw_config(), {.threads = 1, .isa = isa});
      adam.step(updated.view(), {1e-2f, 1, 1.0f});
      owned_chunk kept(std::size(specials), 19, dtype::fp32, true, working_as, 2);
      for (std::size_t i = 0; i < kept.count; ++i) {
        kept.master[kept.offset + i] = std::bit_cast<float>(specials[i]);
        kept.set_grad(i, 0.0f);
      }
      cpu_sgd sgd({}, {.threads = 1, .isa = isa});
      sgd.step(kept.view(), {0.0f, 1, 1.0f});
      for (const owned_chunk* c : {&updated, &kept})
        for (std::size_t i = 0; i < c->count; ++i) {
          const float p = c->master[c->offset + i];
          CAPTURE(std::bit_cast<std::uint32_t>(p));
          if (working_as == dtype::bf16) CHECK(c->working_bf16[c->offset + i].bits == to_bf16(p).bits);
          else CHECK(c->working_fp16[c->offset + i].bits == to_fp16(p).bits);
        }
      // A zero update leaves finite master weights bit for bit (an infinite one becomes NaN: 0 * inf in the
      // always-applied weight-decay term).
      for (std::size_t i = 0; i < kept.count; ++i)
        if (std::isfinite(std::bit_cast<float>(specials[i])))
          CHECK(std::bit_cast<std::uint32_t>(kept.master[kept.offset + i]) == specials[i]);
    }
}

TEST_CASE("multi-threaded steps and norms equal single-threaded ones bit for bit") {
  const std::size_t n = 300007;
  owned_chunk one(n, 23, dtype::bf16, true, dtype::bf16), three(n, 23, dtype::bf16, true, dtype::bf16);
  owned_chunk small_one(77, 29), small_three(77, 29);  // a second chunk shorter than a tile
  cpu_adam single(adamw_config(), {.threads = 1, .isa = cpu_isa::best, .tile_elements = 2048});
  cpu_adam multi(adamw_config(), {.threads = 3, .isa = cpu_isa::best, .tile_elements = 2048});
  const chunk_arrays views_one[] = {one.view(), small_one.view()};
  const chunk_arrays views_three[] = {three.view(), small_three.view()};
  for (std::uint64_t t = 1; t <= 3; ++t) {
    single.step(views_one, {schedule[t - 1], t, 1.0f});
    multi.step(views_three, {schedule[t - 1], t, 1.0f});
  }
  CHECK(one.same_memory(three));
  CHECK(small_one.same_memory(small_three));
  const double s1 = single.grad_sum_of_squares(views_one), s3 = multi.grad_sum_of_squares(views_three);
  CHECK(std::bit_cast<std::uint64_t>(s1) == std::bit_cast<std::uint64_t>(s3));
  double reference = 0.0;
  for (std::size_t i = 0; i < n; ++i) reference += static_cast<double>(one.grad(i)) * one.grad(i);
  for (std::size_t i = 0; i < small_one.count; ++i) reference += static_cast<double>(small_one.grad(i)) * small_one.grad(i);
  CHECK(s1 == doctest::Approx(reference).epsilon(1e-12));
}

TEST_CASE("an inf or NaN fp16 gradient skips the step, leaves memory alone and halves the loss scale") {
  const loss_scaler_config scaling{.initial_scale = 1024.0f, .growth_factor = 2.0f, .backoff_factor = 0.5f,
                                   .growth_interval = 3, .min_scale = 1.0f, .max_scale = 65536.0f};
  cpu_adam adam(adamw_config(), {.threads = 2});
  mixed_precision_step driver(adam, {.max_grad_norm = 0.0f, .loss_scaling = scaling});
  owned_chunk a(1000, 31, dtype::fp16, true, dtype::fp16, 1, 1024.0f), b(333, 37, dtype::fp16, true, dtype::fp16, 1, 1024.0f);
  const chunk_arrays views[] = {a.view(), b.view()};
  CHECK(driver.loss_scale() == 1024.0f);

  // A good step uses the gradients divided by the scale: the same as a plain step on the unscaled gradients.
  owned_chunk expected(1000, 31, dtype::fp32, true, dtype::fp16, 1);
  for (std::size_t i = 0; i < expected.count; ++i) expected.set_grad(i, a.grad(i) / 1024.0f);
  cpu_adam plain(adamw_config());
  plain.step(expected.view(), {1e-3f, 1, 1.0f});
  auto report = driver.step(views, 1e-3f);
  CHECK_FALSE(report.skipped);
  CHECK(report.step == 1);
  CHECK(std::memcmp(a.master.data(), expected.master.data(), a.master.size() * 4) == 0);
  CHECK(std::memcmp(a.working_fp16.data(), expected.working_fp16.data(), a.count * 2) == 0);

  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    const owned_chunk a_before = a, b_before = b;
    const float scale_before = driver.loss_scale();
    b.set_grad(100, bad);
    report = driver.step(views, 1e-3f);
    CHECK(report.skipped);
    CHECK(report.step == 1);
    CHECK_FALSE(std::isfinite(report.grad_norm));
    CHECK(driver.loss_scale() == scale_before / 2.0f);
    CHECK(a.same_memory(a_before));
    CHECK(b.same_memory(b_before));
    b.set_grad(100, 1.0f);
  }
  CHECK(driver.loss_scale() == 256.0f);
  for (int good = 1; good <= 3; ++good) {
    report = driver.step(views, 1e-3f);
    CHECK_FALSE(report.skipped);
    CHECK(driver.loss_scale() == (good < 3 ? 256.0f : 512.0f));  // grows after growth_interval good steps
  }
  CHECK(driver.steps_taken() == 4);
  CHECK(driver.scaler()->good_steps() == 0);
}

TEST_CASE("the loss scale never backs off below min_scale nor grows above max_scale, and bad settings throw") {
  loss_scaler scaler({.initial_scale = 4.0f, .growth_factor = 2.0f, .backoff_factor = 0.5f, .growth_interval = 1,
                      .min_scale = 2.0f, .max_scale = 8.0f});
  scaler.update(true);
  scaler.update(true);
  CHECK(scaler.scale() == 2.0f);
  for (int i = 0; i < 5; ++i) scaler.update(false);
  CHECK(scaler.scale() == 8.0f);
  CHECK_THROWS_AS(loss_scaler({.growth_factor = 1.0f}), error);
  CHECK_THROWS_AS(loss_scaler({.backoff_factor = 1.5f}), error);
  CHECK_THROWS_AS(loss_scaler({.growth_interval = 0}), error);
}

TEST_CASE("clipping by global norm reports the reference norm and applies the clip coefficient") {
  const adam_config config = adamw_config(0.01f);
  owned_chunk a(5003, 41), b(999, 43);
  reference_adam ref_a(a), ref_b(b);
  double sum = 0.0;
  for (const owned_chunk* c : {&a, &b})
    for (std::size_t i = 0; i < c->count; ++i) sum += static_cast<double>(c->grad(i)) * c->grad(i);
  const double norm = std::sqrt(sum);
  const float max_norm = 5.0f;  // the random gradients have a norm of about 77
  cpu_adam adam(config, {.threads = 2, .tile_elements = 512});
  mixed_precision_step driver(adam, {.max_grad_norm = max_norm, .loss_scaling = std::nullopt});
  const chunk_arrays views[] = {a.view(), b.view()};
  const auto report = driver.step(views, 1e-2f);
  CHECK_FALSE(report.skipped);
  CHECK(report.grad_norm == doctest::Approx(norm).epsilon(1e-12));
  const double coefficient = max_norm / (norm + 1e-6);
  CHECK(report.clip_coefficient == doctest::Approx(coefficient).epsilon(1e-7));
  ref_a.step(config, a, 1e-2f, 1, static_cast<double>(report.clip_coefficient));
  ref_b.step(config, b, 1e-2f, 1, static_cast<double>(report.clip_coefficient));
  CHECK(worst_error(a.master, a.offset, ref_a.p) < rel_tolerance);
  CHECK(worst_error(b.m1, b.offset, ref_b.m) < rel_tolerance);
  CHECK(worst_error(b.m2, b.offset, ref_b.v) < rel_tolerance);

  // Below the limit nothing is clipped.
  mixed_precision_step loose(adam, {.max_grad_norm = 1000.0f, .loss_scaling = std::nullopt});
  CHECK(loose.step(views, 1e-2f).clip_coefficient == 1.0f);
}

TEST_CASE("the squared norm is summed across ranks, and an overflow on another rank skips this one too") {
  owned_chunk a(2048, 47);
  const chunk_arrays view = a.view();
  cpu_adam adam;
  const double local = std::sqrt(adam.grad_sum_of_squares(std::span(&view, 1)));
  // Two ranks holding the same gradients: the all-reduce doubles the squared norm.
  const auto two_ranks = [](double& value) { value *= 2.0; };
  mixed_precision_step<cpu_adam, decltype(two_ranks)> driver(adam, {.max_grad_norm = 1e6f, .loss_scaling = std::nullopt}, two_ranks);
  CHECK(driver.step(std::span(&view, 1), 1e-3f).grad_norm == doctest::Approx(std::sqrt(2.0) * local));

  const auto other_overflowed = [](double& value) { value += std::numeric_limits<double>::infinity(); };
  mixed_precision_step<cpu_adam, decltype(other_overflowed)> scaled(
      adam, {.max_grad_norm = 0.0f, .loss_scaling = loss_scaler_config{}}, other_overflowed);
  const owned_chunk before = a;
  CHECK(scaled.step(std::span(&view, 1), 1e-3f).skipped);
  CHECK(a.same_memory(before));
  CHECK(scaled.loss_scale() == 32768.0f);
}

TEST_CASE("bad chunks and arguments are rejected before any memory changes") {
  owned_chunk a(100, 53);
  const owned_chunk before = a;
  cpu_adam adam;
  chunk_arrays view = a.view();
  view.moment2 = nullptr;
  CHECK_THROWS_WITH_AS(adam.step(view, {1e-3f, 1, 1.0f}), doctest::Contains("second-moment"), error);
  view = a.view();
  view.grad_type = dtype::int32;
  CHECK_THROWS_WITH_AS(adam.step(view, {1e-3f, 1, 1.0f}), doctest::Contains("fp32, bf16 or fp16"), error);
  view = a.view();
  view.working = a.working_bf16.data();
  view.working_type = dtype::fp32;
  CHECK_THROWS_AS(adam.step(view, {1e-3f, 1, 1.0f}), error);
  CHECK_THROWS_WITH_AS(adam.step(a.view(), {1e-3f, 0, 1.0f}), doctest::Contains("step counts from 1"), error);
  CHECK(a.same_memory(before));
  CHECK_THROWS_AS(cpu_adam(adam_config{.beta1 = 1.0f}), error);
  CHECK_THROWS_AS(cpu_sgd(sgd_config{.momentum = 0.0f, .nesterov = true}), error);
  CHECK_THROWS_AS(cpu_adam({}, {.threads = 0}), error);
  CHECK_THROWS_AS(cpu_adam({}, {.tile_elements = 1000}), error);
  chunk_arrays empty;  // a chunk of no elements is a no-op, whatever its pointers
  adam.step(empty, {1e-3f, 1, 1.0f});
}

TEST_CASE("optimizer state survives a save and load round trip, and damaged files are rejected clearly") {
  owned_chunk a(1234, 59);
  std::stringstream file;
  save_state(file, a.view(), optimizer_kind::adam, 42);
  const std::string bytes = file.str();
  CHECK(bytes.size() == 136 + 3 * 1234 * 4);  // header: 64-byte prefix, 24-byte identity, 3 16-byte piece entries
  CHECK(bytes.size() == state_file_bytes(1234, optimizer_kind::adam));

  owned_chunk b(1234, 61);
  std::istringstream in(bytes);
  CHECK(load_state(in, b.view(), optimizer_kind::adam) == 42);
  CHECK(std::memcmp(a.master.data() + 1, b.master.data() + 1, 1234 * 4) == 0);
  CHECK(std::memcmp(a.m1.data() + 1, b.m1.data() + 1, 1234 * 4) == 0);
  CHECK(std::memcmp(a.m2.data() + 1, b.m2.data() + 1, 1234 * 4) == 0);

  const auto load_damaged = [&](std::string damaged, optimizer_kind kind = optimizer_kind::adam, std::size_t count = 1234) {
    owned_chunk target(count, 67);
    std::istringstream damaged_in(damaged);
    load_state(damaged_in, target.view(), kind);
  };
  std::string flipped = bytes;
  flipped[64 + 5000] ^= 0x10;
  CHECK_THROWS_WITH_AS(load_damaged(flipped), doctest::Contains("checksum mismatch"), error);
  std::string magic = bytes;
  magic[0] = 'X';
  CHECK_THROWS_WITH_AS(load_damaged(magic), doctest::Contains("magic"), error);
  std::string version = bytes;
  version[8] = 9;
  CHECK_THROWS_WITH_AS(load_damaged(version), doctest::Contains("version 9"), error);
  CHECK_THROWS_WITH_AS(load_damaged(bytes.substr(0, 40)), doctest::Contains("inside the 64-byte header"), error);
  CHECK_THROWS_WITH_AS(load_damaged(bytes.substr(0, bytes.size() - 4)), doctest::Contains("truncated"), error);
  CHECK_THROWS_WITH_AS(load_damaged(bytes, optimizer_kind::adam, 1000), doctest::Contains("the chunk has 1000"), error);
  CHECK_THROWS_WITH_AS(load_damaged(bytes, optimizer_kind::sgd_momentum), doctest::Contains("expects sgd_momentum"),
                       error);
  std::string step = bytes;
  step[24] ^= 1;  // the header is checksummed too
  CHECK_THROWS_WITH_AS(load_damaged(step), doctest::Contains("checksum"), error);
  std::string version_1("CWOPTST\0\x01\0\0\0", 12);  // the optimizer state's own format before the shared one
  version_1 += bytes.substr(12);
  CHECK_THROWS_WITH_AS(load_damaged(version_1), doctest::Contains("format version 1"), error);
  CHECK_THROWS_WITH_AS(load_damaged(version_1), doctest::Contains("this build reads format version 3"), error);

  // Through a file, for SGD with momentum (master + one buffer).
  const auto path = std::filesystem::temp_directory_path() / "chunkwise_optim_state_test.bin";
  save_state(path, a.view(), optimizer_kind::sgd_momentum, 7);
  CHECK(std::filesystem::file_size(path) == 120 + 2 * 1234 * 4);
  owned_chunk c(1234, 71);
  CHECK(load_state(path, c.view(), optimizer_kind::sgd_momentum) == 7);
  CHECK(std::memcmp(a.m1.data() + 1, c.m1.data() + 1, 1234 * 4) == 0);
  std::filesystem::remove(path);
  CHECK_THROWS_WITH_AS(load_state(path, c.view(), optimizer_kind::sgd_momentum), doctest::Contains("cannot open"),
                       error);
}

TEST_CASE("optimizers can share the caller's worker threads") {
  worker_threads pool(1);  // and the caller: 2 threads
  cpu_adam adam(adamw_config(), {.threads = 1, .isa = cpu_isa::best, .tile_elements = 1024, .pool = &pool});
  cpu_sgd sgd({}, {.threads = 1, .isa = cpu_isa::best, .tile_elements = 1024, .pool = &pool});
  CHECK(adam.threads() == 2);
  owned_chunk a(10000, 83), b(10000, 83);
  adam.step(a.view(), {1e-3f, 1, 1.0f});
  cpu_adam alone(adamw_config(), {.threads = 1, .isa = cpu_isa::best, .tile_elements = 1024, .pool = nullptr});
  alone.step(b.view(), {1e-3f, 1, 1.0f});
  CHECK(a.same_memory(b));
  sgd.step(a.view(), {1e-3f, 1, 1.0f});
}

TEST_CASE("worker threads run every parallel_for task exactly once, for any task count") {
  worker_threads pool(2);
  CHECK(pool.parallel_width() == 3);
  for (const std::size_t tasks : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{1000}}) {
    std::vector<int> hits(tasks, 0);
    pool.parallel_for(tasks, [&](std::size_t i) noexcept { ++hits[i]; });
    CHECK(std::count(hits.begin(), hits.end(), 1) == static_cast<std::ptrdiff_t>(tasks));
  }
}

// The chunk_optimizer contract, for every CPU optimizer.
TEST_CASE_TEMPLATE("a chunk_optimizer steps several chunks in one call exactly as one chunk at a time", Optimizer,
                   cpu_adam, cpu_sgd) {
  using config_type = typename Optimizer::config_type;
  config_type config{};
  if constexpr (std::is_same_v<config_type, sgd_config>) config.momentum = 0.9f;
  Optimizer together(config, {.threads = 2, .isa = cpu_isa::best, .tile_elements = 256});
  Optimizer apart(config, {.threads = 1, .isa = cpu_isa::best, .tile_elements = 256});
  owned_chunk a1(1000, 73), b1(37, 79), a2(1000, 73), b2(37, 79);
  const chunk_arrays both[] = {a1.view(), b1.view()};
  for (std::uint64_t t = 1; t <= 2; ++t) {
    together.step(both, {1e-2f, t, 1.0f});
    apart.step(a2.view(), {1e-2f, t, 1.0f});
    apart.step(b2.view(), {1e-2f, t, 1.0f});
  }
  CHECK(a1.same_memory(a2));
  CHECK(b1.same_memory(b2));
  const chunk_arrays view_a = a2.view(), view_b = b2.view();
  const double sum = together.grad_sum_of_squares(both);
  // Chunks are summed one after another: the total is the in-order sum of the per-chunk sums (for the same tile
  // size, which fixes how each chunk's sum is grouped).
  CHECK(sum == apart.grad_sum_of_squares(std::span(&view_a, 1)) + apart.grad_sum_of_squares(std::span(&view_b, 1)));
  CHECK_THROWS_AS(together.step(both, {1e-2f, 0, 1.0f}), error);
  CHECK(Optimizer::state_arrays >= 1);
}

// ---- the chunk_optimizer contract (tests/contracts/chunk_optimizer_contract.hpp) for every CPU optimizer ----
#include "contracts/chunk_optimizer_contract.hpp"

namespace chunkwise::test {
// Tiles of 256 elements, so that the longer chunks are cut into several and threads share them.
template <>
struct optimizer_factory<cpu_adam> {
  static std::unique_ptr<cpu_adam> make(const adam_config& config, unsigned threads) {
    return std::make_unique<cpu_adam>(config,
                                      cpu_options{.threads = threads, .isa = cpu_isa::best, .tile_elements = 256});
  }
  static std::vector<adam_config> configs() {
    return {adam_config{}, adamw_config(0.1f), adam_config{0.8f, 0.95f, 1e-6f, 0.05f, weight_decay_mode::l2}};
  }
};
template <>
struct optimizer_factory<cpu_sgd> {
  static std::unique_ptr<cpu_sgd> make(const sgd_config& config, unsigned threads) {
    return std::make_unique<cpu_sgd>(config,
                                      cpu_options{.threads = threads, .isa = cpu_isa::best, .tile_elements = 256});
  }
  static std::vector<sgd_config> configs() {
    return {sgd_config{}, sgd_config{0.9f, 0.0f, 0.01f, false}, sgd_config{0.9f, 0.0f, 0.0f, true},
            sgd_config{0.5f, 0.25f, 0.01f, false}};
  }
};
}  // namespace chunkwise::test

TEST_CASE_TEMPLATE_APPLY(chunk_optimizer_contract, std::tuple<cpu_adam, cpu_sgd>);

TEST_CASE("warm-up then cosine decay gives llm.c's rates, and bad settings say what is wrong") {
  const optim::warmup_cosine s{.peak = 6e-4f, .warmup = 10, .total = 110, .final_fraction = 0.1f};
  CHECK(s(1) == doctest::Approx(6e-5));
  CHECK(s(10) == doctest::Approx(6e-4));
  CHECK(s(60) == doctest::Approx(6e-5 + (6e-4 - 6e-5) * 0.5));  // half-way: cos(pi/2) = 0
  CHECK(s(110) == doctest::Approx(6e-5));
  CHECK(s(500) == doctest::Approx(6e-5));  // past the end: the final rate
  for (std::uint64_t step = 11; step < 110; ++step) CHECK(s(step + 1) < s(step));
  const optim::warmup_cosine constant{.peak = 1e-3f, .total = 50};
  CHECK(constant(1) == 1e-3f);
  CHECK(constant(50) == 1e-3f);
  CHECK_THROWS_WITH_AS((optim::warmup_cosine{.peak = 1e-3f, .warmup = 20, .total = 10}.validate()),
                       doctest::Contains("20 warm-up steps in a run of 10"), error);
  CHECK_THROWS_WITH_AS((optim::warmup_cosine{.peak = 1e-3f, .final_fraction = 2.0f}.validate()),
                       doctest::Contains("final fraction must lie in [0, 1]"), error);
}
