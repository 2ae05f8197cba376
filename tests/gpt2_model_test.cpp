// The example's GPT-2 (examples/train_gpt2): its tensors are the profile's, its gradients are the derivatives of
// its loss, the tied embedding gets both contributions, training lowers the loss and is bit-for-bit repeatable,
// and the data loader serves what it promises.
#include "data_loader.hpp"
#if CHUNKWISE_GPT2_BLAS
#include "blas_matmul.hpp"
#endif
#if CHUNKWISE_GPT2_DNNL
#include "dnnl_matmul.hpp"
#endif
#include "gpt2_model.hpp"
#include "llmc_files.hpp"
#include "reference_trainer.hpp"

#include <chunkwise/profile/gpt2.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <unistd.h>
#include <tuple>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

// Small enough for a test, large enough that every kernel has more than one head, layer, batch row and position.
gpt2::model_config tiny_config() {
  gpt2::model_config config;
  config.vocab = 256;
  config.context = 16;
  config.channels = 32;
  config.heads = 4;
  config.layers = 2;
  config.batch = 2;
  return config;
}

gpt2::data_loader tiny_loader(gpt2::data_split split, std::uint64_t seed = 7,
                              const gpt2::model_config& config = tiny_config()) {
  return gpt2::data_loader(gpt2::default_data_file, split, config.batch, config.context, seed);
}

// The OpenMP thread count for one scope (nothing without OpenMP). The maths tests run on one thread: on a loaded
// two-core machine, two spinning OpenMP threads make many tiny parallel loops ten times slower. Results do not
// depend on it (the determinism test checks that).
class omp_threads {
 public:
  explicit omp_threads([[maybe_unused]] int count) {
#ifdef _OPENMP
    previous_ = omp_get_max_threads();
    omp_set_num_threads(count);
#endif
  }
  ~omp_threads() {
#ifdef _OPENMP
    omp_set_num_threads(previous_);
#endif
  }
  omp_threads(const omp_threads&) = delete;
  omp_threads& operator=(const omp_threads&) = delete;

 private:
  [[maybe_unused]] int previous_ = 1;
};

std::filesystem::path temp_file(const std::string& name, const std::string& content) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("chunkwise_gpt2_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

}  // namespace

TEST_CASE("the model's tensors, passes and saved activations are the analytic profile's") {
  for (auto config : {tiny_config(), gpt2::model_config{}}) {
    const auto profile = chunkwise::gpt2_profile(gpt2::profile_config(config));
    const auto tensors = gpt2::parameter_tensors(config);
    const std::size_t c = config.channels;
    CHECK(config.parameter_count() ==
          config.vocab * c + config.context * c + config.layers * (12 * c * c + 13 * c) + 2 * c);
    CHECK(config.parameter_count() == profile.parameter_count());
    std::size_t sum = 0;
    REQUIRE(tensors.size() == profile.tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      CAPTURE(tensors[i].name);
      CHECK(tensors[i].name == profile.tensors[i].name.str());
      CHECK(tensors[i].elements == profile.tensors[i].elements);
      sum += tensors[i].elements;
    }
    CHECK(sum == config.parameter_count());

    // The pass functions take the tensors the profile's passes list, in that order.
    const auto& passes = profile.passes;
    REQUIRE(passes.size() == 2 * config.layers + 4);
    CHECK(passes.front().tensors == std::vector<std::uint32_t>{gpt2::wte_index, gpt2::wpe_index});
    for (std::size_t l = 0; l < config.layers; ++l)
      for (std::size_t t = 0; t < gpt2::layer_tensor_count; ++t)
        CHECK(passes[1 + l].tensors[t] == gpt2::layer_tensor_index(l, static_cast<gpt2::layer_tensor>(t)));
    const std::vector<std::uint32_t> head{static_cast<std::uint32_t>(gpt2::ln_f_weight_index(config)),
                                          static_cast<std::uint32_t>(gpt2::ln_f_bias_index(config)),
                                          gpt2::wte_index};
    CHECK(passes[1 + config.layers].tensors == head);

    // What forward keeps is what the profile counts at the head's forward pass (fp32: 4 bytes each).
    const gpt2::activations<float> acts(config);
    CHECK(4 * acts.saved_elements() == passes[1 + config.layers].activation_bytes);

    // Everything the activations hold (forward's, the recompute slot, backward's workspace) is the profile's peak,
    // reached in the head's backward pass: the bytes the planner charges the device are the bytes the trainer takes.
    for (const bool recompute : {false, true}) {
      CAPTURE(recompute);
      auto shape = config;
      shape.recompute = recompute;
      const auto analytic = chunkwise::gpt2_profile(gpt2::profile_config(shape));
      const auto traced = gpt2::trace_profile(shape);
      const gpt2::activations<float> held(shape);
      CHECK(held.held_elements() == gpt2::activations<float>::total_elements(shape));
      CHECK(4 * held.held_elements() == analytic.peak_activation_bytes());
      CHECK(4 * held.held_elements() == traced.peak_activation_bytes());
      CHECK(analytic.passes[2 + shape.layers].activation_bytes == analytic.peak_activation_bytes());
      // One block of memory, which ends with backward's activation gradients: the head's in the memory of a
      // layer's, as no pass uses both.
      CHECK(held.dlnf.data() == held.dln1.data());
      CHECK(held.dfcproj.data() + held.dfcproj.size() == held.encoded.data() + held.held_elements());
    }
  }
  CHECK(tiny_config().parameter_count() == 256 * 32 + 16 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32);
}

TEST_CASE("a config with a zero dimension or heads that do not divide channels is refused") {
  auto config = tiny_config();
  config.heads = 5;
  CHECK_THROWS_AS(gpt2::validate(config), chunkwise::error);
  CHECK_THROWS_AS(gpt2::activations<float>{config}, chunkwise::error);
  config = tiny_config();
  config.layers = 0;
  CHECK_THROWS_AS(gpt2::validate(config), chunkwise::error);
}

TEST_CASE("initialisation is llm.c's and each tensor's values depend only on its name and the seed") {
  const auto config = tiny_config();
  const gpt2::reference_trainer trainer(config, 42);
  for (std::size_t i = 0; i < trainer.tensors().size(); ++i) {
    const auto& tensor = trainer.tensors()[i];
    CAPTURE(tensor.name);
    std::vector<float> alone(tensor.elements);
    gpt2::init_parameter(config, tensor.name, std::span<float>(alone), 42);
    const auto values = trainer.parameter(i);
    CHECK(std::equal(alone.begin(), alone.end(), values.begin(), values.end()));

    const bool layernorm_weight = tensor.name.ends_with("ln_1.weight") || tensor.name.ends_with("ln_2.weight") ||
                                  tensor.name == "ln_f.weight";
    if (layernorm_weight) {
      CHECK(std::all_of(values.begin(), values.end(), [](float v) { return v == 1.0f; }));
    } else if (tensor.name.ends_with(".bias")) {
      CHECK(std::all_of(values.begin(), values.end(), [](float v) { return v == 0.0f; }));
    } else {  // normal(0, std): the sample standard deviation within 10% for these sizes (>= 512 elements)
      double sum_squares = 0;
      for (const float v : values) sum_squares += double(v) * v;
      const double sample_std = std::sqrt(sum_squares / double(values.size()));
      const double expected = tensor.name.ends_with("c_proj.weight") ? 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers)) : 0.02;
      CHECK(sample_std == doctest::Approx(expected).epsilon(0.1));
    }
  }
  std::vector<float> other(config.vocab * config.channels);
  gpt2::init_parameter(config, "wte", std::span<float>(other), 43);
  CHECK_FALSE(std::equal(other.begin(), other.end(), trainer.parameter(gpt2::wte_index).begin()));

  // a tensor is drawn by threads at once (each element's two draws found by skipping ahead): the values one
  // generator drawing them in order gives, whatever the thread count
  const auto wpe = trainer.parameter(gpt2::wpe_index);
  gpt2::splitmix64 in_order(42 ^ gpt2::name_hash("wpe"));
  for (std::size_t i = 0; i < wpe.size(); ++i) REQUIRE(wpe[i] == static_cast<float>(0.02 * in_order.normal()));
  {
    const omp_threads one_thread(1);
    std::vector<float> serial(wpe.size());
    gpt2::init_parameter(config, "wpe", std::span<float>(serial), 42);
    CHECK(std::equal(serial.begin(), serial.end(), wpe.begin(), wpe.end()));
  }

  std::vector<float> wrong(7);
  CHECK_THROWS_AS(gpt2::init_parameter(config, "wte", std::span<float>(wrong), 42), chunkwise::error);
  CHECK_THROWS_AS(gpt2::init_parameter(config, "h.9.ln_1.weight", std::span<float>(wrong), 42), chunkwise::error);
}

// Central differences in double: with h = 1e-5 the truncation error (h^2 times a third derivative of order one)
// and the rounding error (1e-16 / h relative to the loss) are both near 1e-10, far below the tolerance
// |fd - analytic| <= 1e-8 + 1e-6 |analytic|. Parameters are first moved off their initial values (layer-norm
// weights 1, biases 0), where a swapped weight and bias could hide. Context 8 halves the cost (sanitizer runs).
TEST_CASE("the gradient of every parameter tensor matches central finite differences") {
  const omp_threads one_thread(1);
  auto config = tiny_config();
  config.context = 8;
  config.layers = 3;  // odd: backward's two alternating slices of the residual stream's gradient swap at each layer
  gpt2::basic_reference_trainer<double> trainer(config, 1);
  gpt2::splitmix64 rng(99);
  for (std::size_t i = 0; i < trainer.tensors().size(); ++i)
    for (double& p : trainer.parameter(i)) p += 0.1 * rng.normal();
  auto loader = tiny_loader(gpt2::data_split::train, 7, config);
  loader.next_batch();
  const int* tokens = loader.tokens().data();
  const int* targets = loader.targets().data();

  trainer.zero_gradients();
  trainer.forward(tokens, targets);
  trainer.backward(tokens, targets);

  const double h = 1e-5;
  double worst = 0;
  for (std::size_t i = 0; i < trainer.tensors().size(); ++i) {
    const auto& tensor = trainer.tensors()[i];
    CAPTURE(tensor.name);
    const auto params = trainer.parameter(i);
    const auto grads = trainer.gradient(i);
    CHECK(std::any_of(grads.begin(), grads.end(), [](double g) { return g != 0.0; }));
    // The first and last element and three random ones; for wte, also an element of a row the batch uses.
    std::vector<std::size_t> sample{0, tensor.elements - 1};
    for (int k = 0; k < 3; ++k) sample.push_back(rng.below(tensor.elements));
    if (i == gpt2::wte_index) sample.push_back(static_cast<std::size_t>(tokens[3]) * config.channels + 5);
    for (const std::size_t e : sample) {
      const double saved = params[e];
      params[e] = saved + h;
      const double loss_plus = trainer.forward(tokens, targets);
      params[e] = saved - h;
      const double loss_minus = trainer.forward(tokens, targets);
      params[e] = saved;
      const double numeric = (loss_plus - loss_minus) / (2 * h);
      CAPTURE(e);
      CAPTURE(numeric);
      CHECK(std::abs(numeric - grads[e]) <= 1e-8 + 1e-6 * std::abs(grads[e]));
      worst = std::max(worst, std::abs(numeric - grads[e]));
    }
  }
  MESSAGE("largest |finite difference - gradient|: " << worst);
}

TEST_CASE("the tied wte gradient is the sum of the embedding's and the head's contributions") {
  const omp_threads one_thread(1);
  const auto config = tiny_config();
  gpt2::basic_reference_trainer<double> trainer(config, 3);
  auto loader = tiny_loader(gpt2::data_split::train);
  loader.next_batch();
  const int* tokens = loader.tokens().data();
  const int* targets = loader.targets().data();

  trainer.zero_gradients();
  const double tied_loss = trainer.forward(tokens, targets);
  trainer.backward(tokens, targets);
  const std::vector<double> tied(trainer.gradient(gpt2::wte_index).begin(), trainer.gradient(gpt2::wte_index).end());

  // The same model untied: the head reads a copy of wte and writes its own gradient.
  const auto wte = trainer.parameter(gpt2::wte_index);
  const std::vector<double> lm_head(wte.begin(), wte.end());
  std::vector<double> d_lm_head(lm_head.size(), 0.0);
  const std::size_t lnf_w = gpt2::ln_f_weight_index(config), lnf_b = gpt2::ln_f_bias_index(config);
  auto& acts = trainer.acts();
  trainer.zero_gradients();
  gpt2::embed_forward(wte.data(), trainer.parameter(gpt2::wpe_index).data(), tokens, acts);
  for (std::size_t l = 0; l < config.layers; ++l) gpt2::layer_forward(l, gpt2::schedule_detail::layer_params_of(trainer, l), acts);
  const double untied_loss = gpt2::head_forward(trainer.parameter(lnf_w).data(), trainer.parameter(lnf_b).data(),
                                                lm_head.data(), targets, acts);
  gpt2::head_backward(trainer.parameter(lnf_w).data(), lm_head.data(), trainer.gradient(lnf_w).data(),
                      trainer.gradient(lnf_b).data(), d_lm_head.data(), targets, acts);
  for (std::size_t l = config.layers; l-- > 0;)
    gpt2::layer_backward(l, gpt2::schedule_detail::layer_params_of(trainer, l), gpt2::schedule_detail::layer_grads_of(trainer, l), acts);
  gpt2::embed_backward(trainer.gradient(gpt2::wte_index).data(), trainer.gradient(gpt2::wpe_index).data(), tokens,
                       acts);
  const auto d_embedding = trainer.gradient(gpt2::wte_index);

  CHECK(untied_loss == tied_loss);
  std::vector<bool> in_batch(config.vocab, false);
  for (std::size_t i = 0; i < config.batch * config.context; ++i) in_batch[static_cast<std::size_t>(tokens[i])] = true;
  double largest_head = 0, largest_embedding = 0;
  for (std::size_t e = 0; e < tied.size(); ++e) {
    CAPTURE(e);
    CHECK(tied[e] == doctest::Approx(d_lm_head[e] + d_embedding[e]).epsilon(1e-12).scale(1e-9));
    if (!in_batch[e / config.channels]) CHECK(d_embedding[e] == 0.0);  // the embedding touches the batch's rows only
    largest_head = std::max(largest_head, std::abs(d_lm_head[e]));
    largest_embedding = std::max(largest_embedding, std::abs(d_embedding[e]));
  }
  CHECK(largest_head > 1e-6);  // both contributions are there to be summed
  CHECK(largest_embedding > 1e-6);
}

TEST_CASE("GELU's vectorised exp and tanh stay within float's rounding of libm's") {
  // exp: within 1 ulp (relative 1.2e-7) over the whole clamped range; tanh within 2e-7 absolute, +-1 at the ends
  double worst_exp = 0, worst_tanh = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.001953125f) {
    const double exact = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::abs(gpt2::gelu_math::exp_approx(x) - exact) / exact);
  }
  for (float u = -12.0f; u <= 12.0f; u += 0.0001220703125f)
    worst_tanh = std::max(worst_tanh, std::abs(gpt2::gelu_math::tanh_approx(u) - std::tanh(static_cast<double>(u))));
  CAPTURE(worst_exp);
  CAPTURE(worst_tanh);
  CHECK(worst_exp <= 1.2e-7);
  CHECK(worst_tanh <= 2e-7);
  CHECK(gpt2::gelu_math::tanh_approx(100.0f) == 1.0f);
  CHECK(gpt2::gelu_math::tanh_approx(-100.0f) == -1.0f);
  CHECK(gpt2::gelu_math::exp_approx(-1000.0f) > 0.0f);
}

TEST_CASE("the reference trainer's loss falls over 30 steps on the shipped text") {
  const omp_threads one_thread(1);
  const auto config = tiny_config();
  gpt2::reference_trainer trainer(config, 1);
  auto train = tiny_loader(gpt2::data_split::train);
  auto validation = tiny_loader(gpt2::data_split::validation);
  const auto validation_loss = [&] {
    validation.reset();
    double sum = 0;
    for (int i = 0; i < 4; ++i) {
      validation.next_batch();
      sum += trainer.forward(validation.tokens().data(), validation.targets().data());
    }
    return sum / 4;
  };

  const double before = validation_loss();
  CHECK(before == doctest::Approx(std::log(256.0)).epsilon(0.02));  // near-uniform predictions at initialisation
  std::vector<float> losses;
  for (int step = 0; step < 30; ++step) {
    train.next_batch();
    losses.push_back(trainer.train_step(train.tokens().data(), train.targets().data(), 3e-3f));
  }
  const double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[27] + losses[28] + losses[29]) / 3;
  const double after = validation_loss();
  MESSAGE("training loss " << first << " -> " << last << ", validation loss " << before << " -> " << after);
  CHECK(trainer.steps() == 30);
  CHECK(last < first - 1.0);
  CHECK(after < before - 1.0);
}

TEST_CASE("training is deterministic: two runs, and runs on one or more threads, give bit-identical parameters") {
  const auto config = tiny_config();
  const auto run = [&] {
    gpt2::reference_trainer trainer(config, 5);
    auto loader = tiny_loader(gpt2::data_split::train, 11);
    for (int step = 0; step < 3; ++step) {
      loader.next_batch();
      trainer.train_step(loader.tokens().data(), loader.targets().data(), 1e-3f);
    }
    const auto params = trainer.parameters();
    return std::vector<float>(params.begin(), params.end());
  };
  std::vector<float> first, second, on_two_threads;
  {
    const omp_threads one_thread(1);
    first = run();
    second = run();
  }
  {
    const omp_threads two_threads(2);
    on_two_threads = run();
  }
  REQUIRE(first.size() == second.size());
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(first.data(), on_two_threads.data(), first.size() * sizeof(float)) == 0);
}

// What the chunkwise trainer does: every tensor in memory of its own (here one vector each, as chunks would hand
// out pointers), the pass functions called one by one with only their tensors' pointers.
TEST_CASE("the pass functions on separate per-tensor buffers train bit for bit as the reference trainer") {
  const omp_threads one_thread(1);
  const auto config = tiny_config();
  const std::uint64_t seed = 8;
  gpt2::reference_trainer reference(config, seed);
  const auto tensors = gpt2::parameter_tensors(config);
  std::vector<std::vector<float>> params, grads, moment1, moment2;
  for (const auto& tensor : tensors) {
    params.emplace_back(tensor.elements);
    gpt2::init_parameter(config, tensor.name, std::span<float>(params.back()), seed);
    grads.emplace_back(tensor.elements);
    moment1.emplace_back(tensor.elements, 0.0f);
    moment2.emplace_back(tensor.elements, 0.0f);
  }
  gpt2::activations<float> acts(config);
  const auto layer = [&](std::size_t l) {
    gpt2::layer_params<float> p;
    gpt2::layer_grads<float> g;
    for (std::size_t t = 0; t < gpt2::layer_tensor_count; ++t) {
      const std::size_t index = gpt2::layer_tensor_index(l, static_cast<gpt2::layer_tensor>(t));
      p.tensor[t] = params[index].data();
      g.tensor[t] = grads[index].data();
    }
    return std::pair{p, g};
  };
  const std::size_t wte = gpt2::wte_index, wpe = gpt2::wpe_index, lnf_w = gpt2::ln_f_weight_index(config),
                    lnf_b = gpt2::ln_f_bias_index(config);

  auto loader = tiny_loader(gpt2::data_split::train, 4);
  for (std::uint64_t step = 1; step <= 3; ++step) {
    loader.next_batch();
    const int* tokens = loader.tokens().data();
    const int* targets = loader.targets().data();
    const float reference_loss = reference.train_step(tokens, targets, 1e-3f);

    for (auto& g : grads) std::fill(g.begin(), g.end(), 0.0f);
    gpt2::embed_forward(params[wte].data(), params[wpe].data(), tokens, acts);
    for (std::size_t l = 0; l < config.layers; ++l) gpt2::layer_forward(l, layer(l).first, acts);
    const float loss = gpt2::head_forward(params[lnf_w].data(), params[lnf_b].data(), params[wte].data(), targets, acts);
    gpt2::head_backward(params[lnf_w].data(), params[wte].data(), grads[lnf_w].data(), grads[lnf_b].data(),
                        grads[wte].data(), targets, acts);
    for (std::size_t l = config.layers; l-- > 0;) gpt2::layer_backward(l, layer(l).first, layer(l).second, acts);
    gpt2::embed_backward(grads[wte].data(), grads[wpe].data(), tokens, acts);
    const auto coefficients = chunkwise::optim::make_coefficients(reference.adam(), {1e-3f, step, 1.0f});
    for (std::size_t i = 0; i < tensors.size(); ++i)
      gpt2::adamw_update(coefficients, params[i].data(), grads[i].data(), moment1[i].data(), moment2[i].data(),
                         params[i].size());
    CHECK(loss == reference_loss);
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CAPTURE(tensors[i].name);
    CHECK(std::ranges::equal(params[i], reference.parameter(i)));
    CHECK(std::ranges::equal(grads[i], reference.gradient(i)));
  }
}

TEST_CASE("the data loader serves shifted windows of its split in a seeded order") {
  const auto config = tiny_config();
  const auto all = gpt2::read_byte_tokens(gpt2::default_data_file);
  auto train = tiny_loader(gpt2::data_split::train, 1);
  auto validation = tiny_loader(gpt2::data_split::validation, 1);
  CHECK(train.split_tokens() + validation.split_tokens() == all.size());
  CHECK(validation.split_tokens() == all.size() / 10);
  CHECK(train.windows() == (train.split_tokens() - 1) / config.context);
  CHECK(all.size() > 300'000);

  // Validation: windows in file order, from the start of the last 10%; targets are the tokens shifted by one.
  validation.next_batch();
  const std::size_t start = train.split_tokens();
  for (std::size_t b = 0; b < config.batch; ++b)
    for (std::size_t t = 0; t < config.context; ++t) {
      const std::size_t at = start + b * config.context + t;
      CHECK(validation.tokens()[b * config.context + t] == all[at]);
      CHECK(validation.targets()[b * config.context + t] == all[at + 1]);
    }

  // Training: every row is some window of the training split; the same seed repeats the order, another differs.
  auto same = tiny_loader(gpt2::data_split::train, 1);
  auto other = tiny_loader(gpt2::data_split::train, 2);
  bool differs = false;
  std::vector<std::vector<int>> first_batches;
  for (int i = 0; i < 5; ++i) {
    train.next_batch();
    same.next_batch();
    other.next_batch();
    CHECK(std::ranges::equal(train.tokens(), same.tokens()));
    CHECK(std::ranges::equal(train.targets(), same.targets()));
    differs = differs || !std::ranges::equal(train.tokens(), other.tokens());
    first_batches.emplace_back(train.tokens().begin(), train.tokens().end());
    for (std::size_t b = 0; b < config.batch; ++b) {
      const auto row_tokens = train.tokens().subspan(b * config.context, config.context);
      const auto row_targets = train.targets().subspan(b * config.context, config.context);
      bool is_window = false;
      for (std::size_t k = 0; k < train.windows() && !is_window; ++k) {
        const auto window = all.begin() + static_cast<std::ptrdiff_t>(k * config.context);
        is_window = std::equal(row_tokens.begin(), row_tokens.end(), window) &&
                    std::equal(row_targets.begin(), row_targets.end(), window + 1);
      }
      CHECK(is_window);
    }
  }
  CHECK(differs);
  train.reset();
  train.next_batch();
  CHECK(std::ranges::equal(train.tokens(), first_batches.front()));

  // A whole epoch visits every window once, then a new epoch begins.
  const std::vector<int> text{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n', 'o', 'p',
                              'q', 'r', 's', 't', 'u', 'v', 'w', 'x', 'y', 'z', '0', '1', '2', '3', '4', '5'};
  const auto small = temp_file("small.txt", std::string(text.begin(), text.end()));
  gpt2::data_loader windows(small, gpt2::data_split::train, 1, 4, 3);  // 29 training bytes: 7 windows
  REQUIRE(windows.windows() == 7);
  std::vector<int> starts;
  for (int i = 0; i < 7; ++i) {
    windows.next_batch();
    starts.push_back(windows.tokens()[0] - 'a');
  }
  CHECK(windows.epoch() == 0);
  std::sort(starts.begin(), starts.end());
  CHECK(starts == std::vector<int>{0, 4, 8, 12, 16, 20, 24});
  windows.next_batch();
  CHECK(windows.epoch() == 1);
  std::filesystem::remove(small);
}

TEST_CASE("sharded loaders draw the unsharded global batch between them, across an epoch's end") {
  // A small file, so that 40 global batches of 6 windows run through several epochs (their ends fall mid-batch).
  std::string text;
  for (int i = 0; i < 900; ++i) text += static_cast<char>('a' + (i * 7) % 26);
  const auto file = temp_file("shards.txt", text);
  constexpr std::size_t global = 6, context = 16;
  for (const std::size_t ranks : {1u, 2u, 3u, 6u}) {
    CAPTURE(ranks);
    gpt2::data_loader whole(file, gpt2::data_split::train, global, context, 11);
    std::vector<gpt2::data_loader> shards;
    for (std::size_t r = 0; r < ranks; ++r)
      shards.emplace_back(file, gpt2::data_split::train, global, context, 11, 256, gpt2::batch_shard{r, ranks});
    for (int step = 0; step < 40; ++step) {
      whole.next_batch();
      std::vector<int> tokens, targets;
      for (auto& shard : shards) {
        shard.next_batch();
        CHECK(shard.tokens().size() == global / ranks * context);
        tokens.insert(tokens.end(), shard.tokens().begin(), shard.tokens().end());
        targets.insert(targets.end(), shard.targets().begin(), shard.targets().end());
      }
      REQUIRE(tokens == std::vector<int>(whole.tokens().begin(), whole.tokens().end()));
      REQUIRE(targets == std::vector<int>(whole.targets().begin(), whole.targets().end()));
    }
    CHECK(whole.epoch() >= 2);
  }
  try {
    gpt2::data_loader(file, gpt2::data_split::train, global, context, 11, 256, gpt2::batch_shard{0, 4});
    FAIL("no error for 4 shards of a batch of 6");
  } catch (const chunkwise::error& e) {
    CHECK(std::string(e.what()).find("cannot take an equal share of a global batch of 6 rows") != std::string::npos);
  }
  std::filesystem::remove(file);
}

TEST_CASE("the data loader refuses a missing file and a split shorter than one window") {
  try {
    gpt2::data_loader(std::filesystem::path("/nonexistent/kjv.txt"), gpt2::data_split::train, 2, 16);
    FAIL("no error for a missing file");
  } catch (const chunkwise::error& e) {
    CHECK(e.code() == chunkwise::error_code::io_error);
    CHECK(std::string(e.what()).find("/nonexistent/kjv.txt") != std::string::npos);
  }
  const auto short_file = temp_file("short.txt", std::string(100, 'x'));  // validation split: 10 bytes
  CHECK_NOTHROW(gpt2::data_loader(short_file, gpt2::data_split::train, 2, 16));
  try {
    gpt2::data_loader(short_file, gpt2::data_split::validation, 2, 16);
    FAIL("no error for a validation split shorter than one window");
  } catch (const chunkwise::error& e) {
    CHECK(e.code() == chunkwise::error_code::invalid_argument);
    CHECK(std::string(e.what()).find("fewer than one window") != std::string::npos);
  }
  CHECK_THROWS_AS(gpt2::data_loader(short_file, gpt2::data_split::train, 0, 16), chunkwise::error);
  std::filesystem::remove(short_file);
}

TEST_CASE("a token outside the vocabulary is refused, not read past the embedding") {
  const omp_threads one_thread(1);
  const auto config = tiny_config();
  gpt2::reference_trainer trainer(config, 1);
  std::vector<int> tokens(config.batch * config.context, 65), targets(tokens.size(), 66);
  tokens[5] = 256;
  CHECK_THROWS_AS(trainer.forward(tokens.data(), targets.data()), chunkwise::error);
  tokens[5] = 65;
  targets[7] = -1;
  CHECK_THROWS_AS(trainer.forward(tokens.data(), targets.data()), chunkwise::error);
}

TEST_CASE("a vocabulary padded as llm.c pads it computes the same loss and gradients; the padded rows get none") {
  auto padded = tiny_config();
  padded.padded_vocab = 384;
  CHECK(gpt2::llmc_padded_vocab(50257) == 50304);
  CHECK(gpt2::parameter_tensors(padded)[gpt2::wte_index].elements == 384 * padded.channels);
  gpt2::reference_trainer plain(tiny_config(), 5), wide(padded, 5);
  // The same real parameters; the padded rows of wte hold whatever they hold (llm.c's are zeros, ours random).
  for (std::size_t t = 0; t < plain.tensors().size(); ++t)
    std::copy(plain.parameter(t).begin(), plain.parameter(t).end(), wide.parameter(t).begin());
  auto loader = tiny_loader(gpt2::data_split::train);
  loader.next_batch();
  plain.zero_gradients();
  wide.zero_gradients();
  const float loss = plain.forward(loader.tokens().data(), loader.targets().data());
  CHECK(wide.forward(loader.tokens().data(), loader.targets().data()) == loss);
  plain.backward(loader.tokens().data(), loader.targets().data());
  wide.backward(loader.tokens().data(), loader.targets().data());
  for (std::size_t t = 0; t < plain.tensors().size(); ++t) {
    CAPTURE(plain.tensors()[t].name);
    const auto a = plain.gradient(t), b = wide.gradient(t);
    CHECK(std::equal(a.begin(), a.end(), b.begin()));
  }
  const auto d_wte = wide.gradient(gpt2::wte_index);
  CHECK(std::all_of(d_wte.begin() + static_cast<std::ptrdiff_t>(256 * padded.channels), d_wte.end(),
                    [](float g) { return g == 0.0f; }));
}

TEST_CASE("llm.c checkpoints: written and read back, fp32 exactly, bf16 rounded, any mismatch refused") {
  auto config = tiny_config();
  config.padded_vocab = 384;
  gpt2::reference_trainer trainer(config, 9);
  std::vector<std::vector<float>> tensors;
  for (std::size_t t = 0; t < trainer.tensors().size(); ++t)
    tensors.emplace_back(trainer.parameter(t).begin(), trainer.parameter(t).end());
  const auto path = std::filesystem::temp_directory_path() / ("chunkwise-llmc-" + std::to_string(::getpid()) + ".bin");
  SUBCASE("version 3 (fp32): the header and every value") {
    gpt2::llmc::write_checkpoint(path, config, tensors, 3);
    const std::size_t floats = config.parameter_count();
    CHECK(std::filesystem::file_size(path) == 1024 + 4 * floats);
    const auto shape = gpt2::llmc::read_checkpoint_shape(path);
    CHECK(shape.version == 3);
    CHECK(shape.max_context == config.context);
    CHECK(shape.vocab == 256);
    CHECK(shape.padded_vocab == 384);
    CHECK(shape.layers == config.layers);
    CHECK(shape.heads == config.heads);
    CHECK(shape.channels == config.channels);
    CHECK(gpt2::llmc::read_checkpoint(path, config) == tensors);
    // llm.c's order, by kind across layers: after wte and wpe come both layers' ln_1.weight, then both ln_1.bias.
    std::ifstream file(path, std::ios::binary);
    std::vector<float> all(floats);
    file.seekg(1024);
    file.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(4 * floats));
    const std::size_t ln1w = 384 * config.channels + config.context * config.channels;
    const auto& layer1_ln1w = tensors[gpt2::layer_tensor_index(1, gpt2::ln_1_weight)];
    CHECK(std::equal(layer1_ln1w.begin(), layer1_ln1w.end(), all.begin() + static_cast<std::ptrdiff_t>(ln1w + config.channels)));
    // A shorter context takes wpe's first rows.
    auto shorter = config;
    shorter.context = 8;
    const auto cut = gpt2::llmc::read_checkpoint(path, shorter);
    CHECK(std::equal(cut[gpt2::wpe_index].begin(), cut[gpt2::wpe_index].end(), tensors[gpt2::wpe_index].begin()));
  }
  SUBCASE("version 5 (bf16): each value rounded to nearest even") {
    gpt2::llmc::write_checkpoint(path, config, tensors, 5);
    CHECK(std::filesystem::file_size(path) == 1024 + 2 * config.parameter_count());
    const auto read = gpt2::llmc::read_checkpoint(path, config);
    for (std::size_t t = 0; t < tensors.size(); ++t)
      for (std::size_t i = 0; i < tensors[t].size(); ++i)
        if (read[t][i] != chunkwise::to_float(chunkwise::to_bf16(tensors[t][i]))) FAIL_CHECK(t << " " << i);
  }
  SUBCASE("mismatches and damaged files are refused, naming what differs") {
    gpt2::llmc::write_checkpoint(path, config, tensors, 3);
    auto other = config;
    other.layers = 3;
    CHECK_THROWS_WITH_AS(gpt2::llmc::read_checkpoint(path, other), doctest::Contains("L (layers) is 2 in the file, 3"),
                         chunkwise::error);
    auto longer = config;
    longer.context = 32;
    CHECK_THROWS_WITH_AS(gpt2::llmc::read_checkpoint(path, longer), doctest::Contains("longer than the checkpoint's maxT 16"),
                         chunkwise::error);
    std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
    CHECK_THROWS_WITH_AS(gpt2::llmc::read_checkpoint(path, config), doctest::Contains("a truncated or different file"),
                         chunkwise::error);
    const std::vector<int> some_tokens{1, 2, 3};
    gpt2::llmc::write_tokens(path, some_tokens);
    CHECK_THROWS_WITH_AS(gpt2::llmc::read_checkpoint_shape(path), doctest::Contains("pass it to --data"), chunkwise::error);
    CHECK_THROWS_WITH_AS(gpt2::llmc::write_checkpoint(path, config, tensors, 4), doctest::Contains("version 4"),
                         chunkwise::error);
  }
  std::filesystem::remove(path);
}

TEST_CASE("llm.c token shards: read back, served by the data loader, tokens past the vocabulary refused") {
  const auto path = std::filesystem::temp_directory_path() / ("chunkwise-shard-" + std::to_string(::getpid()) + ".bin");
  std::vector<int> tokens(400);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>((i * 7919) % 50257);
  gpt2::llmc::write_tokens(path, tokens);
  CHECK(std::filesystem::file_size(path) == 1024 + 2 * tokens.size());
  CHECK(gpt2::llmc::is_token_shard(path));
  CHECK(gpt2::llmc::read_tokens(path, 50257) == tokens);
  // The loader's validation split is the last 10%: its first window is tokens[360..368].
  gpt2::data_loader validation(path, gpt2::data_split::validation, 1, 8, 0, 50257);
  validation.next_batch();
  CHECK(std::equal(validation.tokens().begin(), validation.tokens().end(), tokens.begin() + 360));
  CHECK(std::equal(validation.targets().begin(), validation.targets().end(), tokens.begin() + 361));
  CHECK_THROWS_WITH_AS(gpt2::llmc::read_tokens(path, 256), doctest::Contains("--vocab 50257"), chunkwise::error);
  std::filesystem::remove(path);
}

#if CHUNKWISE_GPT2_BLAS || CHUNKWISE_GPT2_DNNL
namespace {
// An engine's products against the loops' on the model's shapes (bias and none; backward accumulates into what is
// there), and ten steps of the reference trainer against the loops'. bf16_operands: the engine rounds its operands to
// bf16, so the loops run on operands rounded the same way (to_bf16) and only the summation order differs.
void check_engine_against_loops(const gpt2::matmul_engine& engine, bool bf16_operands, double loss_tolerance) {
  const auto rounded = [&](std::vector<float> v) {
    if (bf16_operands)
      for (float& x : v) x = chunkwise::to_float(chunkwise::to_bf16(x));
    return v;
  };
  for (const auto& [rows, C, OC, with_bias] : {std::tuple{64, 32, 96, true}, std::tuple{64, 128, 32, true},
                                              std::tuple{17, 32, 256, false}}) {
    CAPTURE(rows);
    CAPTURE(OC);
    const auto fill = [](std::vector<float>& v, float scale) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + 0.1f);
    };
    std::vector<float> inp(rows * C), weight(OC * C), bias(OC), dout(rows * OC);
    fill(inp, 1.0f), fill(weight, 0.05f), fill(bias, 0.1f), fill(dout, 0.01f);
    const float* b = with_bias ? bias.data() : nullptr;
    struct grads {
      std::vector<float> out, dinp, dweight, dbias;
    };
    const auto run = [&](const gpt2::matmul_engine* installed, const std::vector<float>& x,
                         const std::vector<float>& w, const std::vector<float>& d) {
      gpt2::installed_matmul_engine() = installed;
      grads g{std::vector<float>(rows * OC), std::vector<float>(rows * C, 0.5f), std::vector<float>(OC * C, 0.25f),
              std::vector<float>(OC, 0.125f)};
      gpt2::kernels::matmul_forward(g.out.data(), x.data(), w.data(), b, 1, rows, C, OC);
      gpt2::kernels::matmul_backward(g.dinp.data(), g.dweight.data(), with_bias ? g.dbias.data() : nullptr, d.data(),
                                     x.data(), w.data(), 1, rows, C, OC);
      gpt2::installed_matmul_engine() = nullptr;
      return g;
    };
    const grads loops = run(nullptr, rounded(inp), rounded(weight), rounded(dout));
    const grads engines = run(&engine, inp, weight, dout);
    const auto close = [](const std::vector<float>& a, const std::vector<float>& e) {
      double worst = 0;
      for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::abs(double(a[i]) - e[i]) / std::max(std::abs(double(e[i])), 1e-3));
      return worst;
    };
    CHECK(close(engines.out, loops.out) < 1e-4);
    CHECK(close(engines.dinp, loops.dinp) < 1e-4);
    CHECK(close(engines.dweight, loops.dweight) < 1e-4);
    if (bf16_operands) {  // the column sum of dbias takes dout as it is, not rounded
      const grads unrounded = run(nullptr, inp, weight, dout);
      CHECK(close(engines.dbias, unrounded.dbias) < 1e-4);
      CHECK(close(engines.out, unrounded.out) > 1e-6);  // the rounding is real: bf16 keeps 8 bits
    } else {
      CHECK(close(engines.dbias, loops.dbias) < 1e-4);
    }
  }
  const auto losses = [](const gpt2::matmul_engine* installed) {
    gpt2::installed_matmul_engine() = installed;
    gpt2::reference_trainer trainer(tiny_config(), 3);
    auto loader = tiny_loader(gpt2::data_split::train);
    std::vector<float> result;
    for (int step = 0; step < 10; ++step) {
      loader.next_batch();
      result.push_back(trainer.train_step(loader.tokens().data(), loader.targets().data(), 1e-3f));
    }
    gpt2::installed_matmul_engine() = nullptr;
    return result;
  };
  const auto loops = losses(nullptr), engines = losses(&engine);
  for (std::size_t i = 0; i < loops.size(); ++i) CHECK(engines[i] == doctest::Approx(loops[i]).epsilon(loss_tolerance));
  CHECK(engines.back() < engines.front());
}
}  // namespace
#endif

#if CHUNKWISE_GPT2_BLAS
TEST_CASE("the OpenBLAS engine computes the loops' products and trains as they do, to rounding") {
  check_engine_against_loops(gpt2::blas_matmul_engine(2), false, 1e-4);
}
#endif

#if CHUNKWISE_GPT2_DNNL
TEST_CASE("the oneDNN engine computes the loops' products in fp32, and in bf16 those of the rounded operands") {
  check_engine_against_loops(gpt2::dnnl_matmul_engine(false), false, 1e-4);
  // bf16 operands: ten steps stay within 1% of fp32 training's losses (bf16's own error, not the engine's)
  check_engine_against_loops(gpt2::dnnl_matmul_engine(true), true, 1e-2);
}
#endif

TEST_CASE("activation checkpointing recomputes each block in backward: the same bits, one block's activations") {
  auto checkpointed = tiny_config();
  checkpointed.recompute = true;
  gpt2::reference_trainer kept(tiny_config(), 21), recomputed(checkpointed, 21);
  auto loader = tiny_loader(gpt2::data_split::train);
  for (int step = 0; step < 3; ++step) {
    loader.next_batch();
    const float a = kept.train_step(loader.tokens().data(), loader.targets().data(), 1e-3f);
    const float b = recomputed.train_step(loader.tokens().data(), loader.targets().data(), 1e-3f);
    CHECK(a == b);
  }
  const auto p = kept.parameters(), q = recomputed.parameters();
  CHECK(std::equal(p.begin(), p.end(), q.begin(), q.end()));
  // The activations held: one block's intermediates instead of L, every block's output still kept.
  const gpt2::activations<float> all(tiny_config()), one(checkpointed);
  const std::size_t BTC = 2 * 16 * 32, per_layer = 2 * 16 * (18 * 32 + 4) + 2 * 4 * 16 * 16;  // B*NH*T*T weights
  CHECK(all.saved_elements() - one.saved_elements() == (tiny_config().layers - 1) * (per_layer - BTC));
  // The traced schedule follows: a lower activation peak, a third more block FLOPs in backward.
  const auto full = gpt2::trace_profile(tiny_config()), lean = gpt2::trace_profile(checkpointed);
  CHECK(lean.peak_activation_bytes() < full.peak_activation_bytes());
  CHECK(lean.total_flops() > full.total_flops());
}
