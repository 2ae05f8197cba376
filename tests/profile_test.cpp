#include <chunkwise/profile.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace chunkwise;

// The published GPT-2 sizes, counted with tied embeddings, biases and layer norms.
static_assert(gpt2_profile(gpt2_124m).parameter_count() == 124'439'808);
static_assert(gpt2_profile(gpt2_355m).parameter_count() == 354'823'168);
static_assert(gpt2_profile(gpt2_774m).parameter_count() == 774'030'080);
static_assert(gpt2_profile(gpt2_1558m).parameter_count() == 1'557'611'200);
static_assert(gpt2_124m.parameter_count() == 124'439'808);

namespace {
std::filesystem::path temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("chunkwise_profile_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

model_profile tiny_model() {
  model_profile m;
  m.name = "tiny";
  m.tensors = {{"a", 10}, {"b", 20, dtype::bf16}, {"c", 30, dtype::fp16, tensor_role::parameter, true}};
  m.passes = {{"l0", pass_kind::forward, {0, 1}, 100}, {"l1", pass_kind::forward, {2}, 200},
              {"l1", pass_kind::backward, {2, 0}, 300}};
  return m;
}
}  // namespace

TEST_CASE("the GPT-2 profile lists its tensors in first-use order with the tied embedding first") {
  for (const auto& config : gpt2_configs) {
    CAPTURE(config.name.str());
    const auto model = gpt2_profile(config);
    CHECK_NOTHROW(validate(model));
    CHECK(model.parameter_count() == config.parameter_count());
    CHECK(model.tensors.size() == 2 + 12 * config.layers + 2);
    CHECK(model.passes.size() == 2 * config.layers + 4);
    CHECK(model.tensors[0].name.view() == "wte");
    CHECK(model.tensors[0].tied);
    std::size_t tied = 0;
    for (const auto& t : model.tensors) tied += t.tied;
    CHECK(tied == 1);
    CHECK(model.largest_tensor_bytes() == std::uint64_t{config.vocab} * config.d_model * size_of(config.type));
  }
}

TEST_CASE("the GPT-2 passes run forward then backward in mirror order, touching the head's tied embedding") {
  const auto model = gpt2_profile(gpt2_124m);
  const auto& passes = model.passes;
  CHECK(passes.front().label.view() == "embed");
  CHECK(passes[1].label.view() == "h.0");
  CHECK(passes[1].tensors.size() == 12);
  CHECK(model.tensors[passes[1].tensors[2]].name.view() == "h.0.attn.c_attn.weight");
  CHECK(model.tensors[passes[1].tensors[2]].elements == 768u * 3 * 768);
  CHECK(passes[13].label.view() == "head");
  CHECK(passes[13].tensors.back() == 0);  // LM head = wte
  CHECK(passes[14].kind == pass_kind::backward);
  CHECK(passes[15].label.view() == "h.11");
  CHECK(passes.back().label.view() == "embed");
  CHECK(passes.back().kind == pass_kind::backward);
  for (std::size_t layer = 0; layer < 12; ++layer)
    CHECK(passes[15 + layer].tensors == passes[12 - layer].tensors);
  CHECK(model.access_order().size() == 2 + 12 * 12 + 3 + 3 + 12 * 12 + 2);
}

TEST_CASE("GPT-2 activation bytes follow llm.c's count, hold backward's workspace and peak in the head's backward") {
  const auto config = gpt2_124m;
  const auto model = gpt2_profile(config);
  const std::uint64_t B = 4, T = 1024, C = 768, H = 12, V = 50257;
  const std::uint64_t embed = B * T * C * 4;
  const std::uint64_t layer = (B * T * (18 * C + 4) + B * H * T * T) * 4;
  const std::uint64_t head = (B * T * (C + 2) + B * T * V + B * T) * 4;  // the probabilities replace the logits
  CHECK(model.passes[0].activation_bytes == embed);
  CHECK(model.passes[1].activation_bytes == embed + layer);
  CHECK(model.passes[12].activation_bytes == embed + 12 * layer);
  CHECK(model.passes[13].activation_bytes == embed + 12 * layer + head);
  // Two slices of the residual stream's gradient, and one layer's activation gradients (17 B*T*C and the attention's
  // score gradients, one array: dpreatt replaces datt), whose memory holds the head's dlnf (its dlogits replace the
  // probabilities).
  const std::uint64_t layer_gradients = 17 * B * T * C + B * H * T * T;
  const std::uint64_t backward_workspace = (2 * B * T * C + layer_gradients) * 4;
  CHECK(model.peak_activation_bytes() == embed + 12 * layer + head + backward_workspace);
  CHECK(model.passes[15].activation_bytes == embed + 12 * layer + backward_workspace);  // h.11's backward
  CHECK(model.passes.back().activation_bytes == embed + backward_workspace);
  CHECK(model.passes[14].activation_bytes == model.peak_activation_bytes());
  // bf16 halves every byte count.
  auto half = config;
  half.type = dtype::bf16;
  CHECK_FALSE(half.recompute);
  CHECK(gpt2_profile(half).peak_activation_bytes() * 2 == model.peak_activation_bytes());
  CHECK(gpt2_profile(half).tensor_bytes() * 2 == model.tensor_bytes());
}

TEST_CASE("bad GPT-2 configs and unknown model names are errors that say what would work") {
  auto config = gpt2_124m;
  config.heads = 7;
  CHECK_THROWS_WITH_AS(gpt2_profile(config), doctest::Contains("d_model 768 is not divisible by heads 7"), error);
  config = gpt2_124m;
  config.layers = 0;
  CHECK_THROWS_WITH_AS(gpt2_profile(config), doctest::Contains("zero dimension"), error);
  CHECK_THROWS_WITH_AS(find_gpt2_config("gpt5"), doctest::Contains("known models: gpt2-124m, gpt2-355m"), error);
  CHECK(find_gpt2_config("gpt-20b").layers == 44);
}

TEST_CASE("validate rejects empty models, empty tensors, bad indices and tensors out of first-use order") {
  model_profile empty;
  empty.name = "empty";
  CHECK_THROWS_WITH_AS(validate(empty), doctest::Contains("model profile 'empty': has no tensors"), error);

  auto zero = tiny_model();
  zero.tensors[1].elements = 0;
  CHECK_THROWS_WITH_AS(validate(zero), doctest::Contains("tensor #1 'b' has zero elements"), error);

  auto bad_index = tiny_model();
  bad_index.passes[1].tensors.push_back(7);
  CHECK_THROWS_WITH_AS(validate(bad_index), doctest::Contains("touches tensor #7 but the profile has 3 tensors"), error);

  auto out_of_order = tiny_model();
  out_of_order.passes[0].tensors = {0, 2};
  out_of_order.passes[1].tensors = {1};
  CHECK_THROWS_WITH_AS(validate(out_of_order), doctest::Contains("tensor #2 'c' is first used (pass #0) before tensor #1 'b'"),
                       error);
  const auto sorted = sort_by_first_use(out_of_order);
  CHECK_NOTHROW(validate(sorted));
  CHECK(sorted.tensors[1].name.view() == "c");
  CHECK(sorted.tensors[2].name.view() == "b");
  CHECK(sorted.passes[0].tensors == std::vector<std::uint32_t>{0, 1});
  CHECK(sorted.passes[1].tensors == std::vector<std::uint32_t>{2});

  auto same_pass_any_order = tiny_model();
  same_pass_any_order.passes[0].tensors = {1, 0, 1};
  CHECK_NOTHROW(validate(same_pass_any_order));

  auto untouched_in_middle = tiny_model();
  untouched_in_middle.passes = {{"l0", pass_kind::forward, {0, 2}, 1}};
  CHECK_THROWS_AS(validate(untouched_in_middle), error);
}

TEST_CASE("a profile survives a JSON round trip through an atomically written file") {
  const auto dir = temp_dir();
  for (const auto& model : {tiny_model(), gpt2_profile(gpt2_124m)}) {
    const auto file = dir / "profile.json";
    save_model_profile(model, file);
    const auto loaded = load_model_profile(file);
    CHECK(loaded.name == model.name);
    REQUIRE(loaded.tensors.size() == model.tensors.size());
    for (std::size_t i = 0; i < model.tensors.size(); ++i) {
      CHECK(loaded.tensors[i].name == model.tensors[i].name);
      CHECK(loaded.tensors[i].elements == model.tensors[i].elements);
      CHECK(loaded.tensors[i].type == model.tensors[i].type);
      CHECK(loaded.tensors[i].role == model.tensors[i].role);
      CHECK(loaded.tensors[i].tied == model.tensors[i].tied);
    }
    REQUIRE(loaded.passes.size() == model.passes.size());
    for (std::size_t i = 0; i < model.passes.size(); ++i) {
      CHECK(loaded.passes[i].label == model.passes[i].label);
      CHECK(loaded.passes[i].kind == model.passes[i].kind);
      CHECK(loaded.passes[i].tensors == model.passes[i].tensors);
      CHECK(loaded.passes[i].activation_bytes == model.passes[i].activation_bytes);
    }
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      CHECK(entry.path().filename() == "profile.json");  // no temporary left behind
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("JSON profile errors name the field and its path") {
  const auto base = to_json(tiny_model());
  const auto load_with = [&](auto&& edit) {
    auto document = base;
    edit(document);
    return model_profile_from_json(document, "p.json");
  };
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["tensors"][1].erase("elements"); }),
                       doctest::Contains("p.json.tensors[1].elements: missing field"), error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["tensors"][0]["elements"] = "ten"; }),
                       doctest::Contains("p.json.tensors[0].elements: expected an unsigned integer, found string"), error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["tensors"][0]["elements"] = -3; }),
                       doctest::Contains("found negative integer"), error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["tensors"][2]["dtype"] = "fp8"; }),
                       doctest::Contains("p.json.tensors[2].dtype: unknown dtype \"fp8\""), error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["tensors"][2]["role"] = "weights"; }),
                       doctest::Contains("p.json.tensors[2].role: unknown role"), error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["passes"][2]["tensors"][1] = 9; }),
                       doctest::Contains("p.json.passes[2].tensors[1]: tensor index 9 is out of range"), error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["passes"][0]["kind"] = "sideways"; }),
                       doctest::Contains("p.json.passes[0].kind: expected \"forward\" or \"backward\""), error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["version"] = 2; }),
                       doctest::Contains("p.json.version: version 2 is not supported"), error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d.erase("passes"); }), doctest::Contains("p.json.passes: missing field"),
                       error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["tensors"] = nlohmann::json::object(); }),
                       doctest::Contains("p.json.tensors: expected an array, found object"), error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["tensors"][0]["elements"] = 0; }),
                       doctest::Contains("has zero elements"), error);
  CHECK_THROWS_WITH_AS(load_with([](auto& d) { d["name"] = std::string(200, 'n'); }),
                       doctest::Contains("p.json.name: name has 200 characters"), error);
  // Optional fields take their defaults.
  const auto loaded = load_with([](auto& d) { d["tensors"][0].erase("role"); d["tensors"][0].erase("tied"); });
  CHECK(loaded.tensors[0].role == tensor_role::parameter);
  CHECK_FALSE(loaded.tensors[0].tied);
}

// Profiles written before layer passes were called passes hold them under "steps"; such files keep loading.
TEST_CASE("a profile file written with the old \"steps\" key loads, and saving writes \"passes\"") {
  const auto dir = temp_dir();
  const auto old_file = dir / "old.json";
  std::ofstream(old_file) << R"({"format": "chunkwise.model_profile", "version": 1, "name": "tiny",
    "tensors": [{"name": "a", "elements": 10, "dtype": "fp32"},
                {"name": "b", "elements": 20, "dtype": "bf16"},
                {"name": "c", "elements": 30, "dtype": "fp16", "role": "parameter", "tied": true}],
    "steps": [{"label": "l0", "kind": "forward", "tensors": [0, 1], "activation_bytes": 100},
              {"label": "l1", "kind": "forward", "tensors": [2], "activation_bytes": 200, "flops": 7},
              {"label": "l1", "kind": "backward", "tensors": [2, 0], "activation_bytes": 300}]})";
  const auto loaded = load_model_profile(old_file);
  const auto expected = tiny_model();
  REQUIRE(loaded.passes.size() == expected.passes.size());
  for (std::size_t i = 0; i < expected.passes.size(); ++i) {
    CHECK(loaded.passes[i].label == expected.passes[i].label);
    CHECK(loaded.passes[i].kind == expected.passes[i].kind);
    CHECK(loaded.passes[i].tensors == expected.passes[i].tensors);
    CHECK(loaded.passes[i].activation_bytes == expected.passes[i].activation_bytes);
  }
  CHECK(loaded.passes[1].flops == 7);
  CHECK(loaded.tensors[2].tied);

  // Saving writes the new key only.
  const auto json = to_json(loaded);
  CHECK(json.contains("passes"));
  CHECK_FALSE(json.contains("steps"));

  // Errors in an old file name the key the file holds; a file with both keys is ambiguous.
  auto old_document = json;
  old_document["steps"] = old_document["passes"];
  old_document.erase("passes");
  old_document["steps"][2]["tensors"][1] = 9;
  CHECK_THROWS_WITH_AS(model_profile_from_json(old_document, "old.json"),
                       doctest::Contains("old.json.steps[2].tensors[1]: tensor index 9 is out of range"), error);
  auto both = json;
  both["steps"] = both["passes"];
  CHECK_THROWS_WITH_AS(model_profile_from_json(both, "both.json"),
                       doctest::Contains("both.json.steps: found both \"passes\" and its old name \"steps\""), error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("unreadable or malformed profile files are errors that name the file") {
  const auto dir = temp_dir();
  CHECK_THROWS_WITH_AS(load_model_profile(dir / "missing.json"), doctest::Contains("missing.json"), error);
  const auto bad = dir / "bad.json";
  std::ofstream(bad) << "{ \"format\": ";
  CHECK_THROWS_WITH_AS(load_model_profile(bad), doctest::Contains("bad.json' is not valid JSON"), error);
  CHECK_THROWS_WITH_AS(save_model_profile(tiny_model(), dir / "no" / "such" / "dir.json"),
                       doctest::Contains("does not exist"), error);
  std::filesystem::remove_all(dir);
}

// Found by tests/fuzz/fuzz_model_profile and fuzz_machine_profile: a number beyond double's range makes
// nlohmann's parser throw out_of_range, not parse_error, and it escaped the loaders.
TEST_CASE("a number beyond double's range is a parse error that names the file, not a JSON library exception") {
  const auto dir = temp_dir();
  const auto huge = dir / "huge.json";
  std::ofstream(huge) << R"({"format": "chunkwise.model_profile", "version": 1e400})";
  CHECK_THROWS_WITH_AS(load_model_profile(huge), doctest::Contains("huge.json' is not valid JSON"), error);
  CHECK_THROWS_WITH_AS(load_machine_profile(huge), doctest::Contains("huge.json' is not valid JSON"), error);
  std::filesystem::remove_all(dir);
}

// Found by tests/fuzz/fuzz_layout: elements * dtype size wrapped around 64 bits, so a loaded profile passed validate()
// with a tiny byte count and per_tensor built a chunk of capacity 0 for it.
TEST_CASE("validate rejects tensors whose byte count would overflow, one by one or in all") {
  auto wraps = tiny_model();
  wraps.tensors[1].elements = (std::uint64_t{1} << 63) + 1;  // * 2 bytes wraps to 2
  CHECK_THROWS_WITH_AS(validate(wraps), doctest::Contains("tensor #1 'b' has 9223372036854775809 elements of 2 bytes"),
                       error);
  auto in_all = tiny_model();
  in_all.tensors[0].elements = (max_profile_bytes - 40 - 60) / 4;  // with b's 40 and c's 60 bytes: the limit exactly
  CHECK_NOTHROW(validate(in_all));
  in_all.tensors[2].elements = 31;  // one fp16 more than the limit in all
  CHECK_THROWS_WITH_AS(validate(in_all), doctest::Contains("tensor #2 'c'"), error);
  CHECK_THROWS_WITH_AS(validate(in_all), doctest::Contains("at most 64.00 PiB"), error);
}

namespace {
/// A GPT-2 training loop's skeleton run against the tracer: the same registrations, touches and activation
/// allocations a trainer in the style of llm.c makes, with no tensor memory.
model_profile trace_gpt2(const gpt2_config& config) {
  tracer trace(config.name);
  const std::uint64_t C = config.d_model, V = config.vocab, T = config.context, B = config.micro_batch,
                      H = config.heads;
  const byte_count e = size_of(config.type);
  const tensor_options fp{config.type};
  // Registration order differs from first-use order on purpose (the head's layer norm first): profile() sorts.
  const auto ln_f_w = trace.register_tensor("ln_f.weight", C, fp);
  const auto ln_f_b = trace.register_tensor("ln_f.bias", C, fp);
  const auto wte = trace.register_tensor("wte", V * C, {config.type, tensor_role::parameter, true});
  const auto wpe = trace.register_tensor("wpe", T * C, fp);
  const char* suffixes[] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                            "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                            "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
  const std::uint64_t sizes[] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
  std::vector<std::vector<tensor_handle>> layers(config.layers);
  for (std::uint32_t l = 0; l < config.layers; ++l)
    for (int i = 0; i < 12; ++i)
      layers[l].push_back(
          trace.register_tensor(("h." + std::to_string(l) + "." + suffixes[i]).c_str(), sizes[i], fp));

  trace.begin_pass("embed", pass_kind::forward);
  trace.touch(wte);
  trace.touch(wpe);
  const auto encoded = trace.allocate_activation(B * T * C * e);
  trace.end_pass();
  std::vector<activation_handle> saved;
  for (std::uint32_t l = 0; l < config.layers; ++l) {
    trace.begin_pass(("h." + std::to_string(l)).c_str(), pass_kind::forward);
    for (const auto t : layers[l]) trace.touch(t);
    saved.push_back(trace.allocate_activation((B * T * (18 * C + 4) + B * H * T * T) * e));
    trace.end_pass();
  }
  trace.begin_pass("head", pass_kind::forward);
  trace.touch(ln_f_w);
  trace.touch(ln_f_b);
  trace.touch(wte);
  const auto head = trace.allocate_activation((B * T * (C + 2) + B * T * V + B * T) * e);
  trace.end_pass();

  trace.begin_pass("head", pass_kind::backward);
  for (const auto t : {ln_f_w, ln_f_b, wte}) trace.touch(t);
  // Backward's workspace, held until the embedding's backward pass: two alternating slices of the residual stream's
  // gradient, and one layer's activation gradients or the head's dlnf, in one place.
  const auto workspace = trace.allocate_activation((2 * B * T * C + 17 * B * T * C + B * H * T * T) * e);
  trace.free_activation(head);
  trace.end_pass();
  for (std::uint32_t l = config.layers; l-- > 0;) {
    trace.begin_pass(("h." + std::to_string(l)).c_str(), pass_kind::backward);
    for (const auto t : layers[l]) trace.touch(t);
    trace.free_activation(saved[l]);
    trace.end_pass();
  }
  trace.begin_pass("embed", pass_kind::backward);
  trace.touch(wte);
  trace.touch(wpe);
  trace.free_activation(workspace);
  trace.free_activation(encoded);
  trace.end_pass();
  CHECK(trace.live_activation_bytes() == 0);
  return trace.profile();
}
}  // namespace

TEST_CASE("a traced GPT-2 loop gives the same profile as the analytic one") {
  for (const auto& config : {gpt2_124m, gpt2_355m}) {
    const auto traced = trace_gpt2(config);
    const auto analytic = gpt2_profile(config);
    REQUIRE(traced.tensors.size() == analytic.tensors.size());
    for (std::size_t i = 0; i < analytic.tensors.size(); ++i) {
      CHECK(traced.tensors[i].name == analytic.tensors[i].name);
      CHECK(traced.tensors[i].elements == analytic.tensors[i].elements);
      CHECK(traced.tensors[i].tied == analytic.tensors[i].tied);
    }
    REQUIRE(traced.passes.size() == analytic.passes.size());
    for (std::size_t s = 0; s < analytic.passes.size(); ++s) {
      CAPTURE(s);
      CHECK(traced.passes[s].label == analytic.passes[s].label);
      CHECK(traced.passes[s].kind == analytic.passes[s].kind);
      CHECK(traced.passes[s].tensors == analytic.passes[s].tensors);
      CHECK(traced.passes[s].activation_bytes == analytic.passes[s].activation_bytes);
    }
  }
}

TEST_CASE("the tracer rejects calls out of order with a message that says what to call") {
  tracer trace("t");
  const auto a = trace.register_tensor("a", 4);
  CHECK_THROWS_WITH_AS(trace.touch(a), doctest::Contains("touch outside a pass; call begin_pass first"), error);
  CHECK_THROWS_WITH_AS(trace.register_tensor("a", 4), doctest::Contains("'a' registered twice"), error);
  CHECK_THROWS_WITH_AS(trace.register_tensor("z", 0), doctest::Contains("'z' has zero elements"), error);
  trace.begin_pass("s", pass_kind::forward);
  CHECK_THROWS_WITH_AS(trace.begin_pass("s2", pass_kind::forward), doctest::Contains("still open"), error);
  CHECK_THROWS_WITH_AS(trace.register_tensor("b", 4), doctest::Contains("before the first pass"), error);
  CHECK_THROWS_WITH_AS(trace.touch(tensor_handle{5}), doctest::Contains("only 1 tensors are registered"), error);
  CHECK_THROWS_WITH_AS(trace.profile(), doctest::Contains("is open"), error);
  trace.touch(a);
  trace.touch(a);
  const auto act = trace.allocate_activation(100);
  trace.free_activation(act);
  CHECK_THROWS_WITH_AS(trace.free_activation(act), doctest::Contains("not allocated"), error);
  trace.end_pass();
  const auto profile = trace.profile();
  CHECK(profile.passes[0].tensors == std::vector<std::uint32_t>{0});
  CHECK(profile.passes[0].activation_bytes == 100);
}

TEST_CASE("GPT-2 FLOPs are 6 per parameter per token plus attention, as llm.c counts them") {
  const auto model = gpt2_profile(gpt2_124m);
  const std::uint64_t B = 4, T = 1024, C = 768, V = 50257, L = 12;
  const std::uint64_t forward = L * (2 * B * T * 12 * C * C + 4 * B * T * T * C) + 2 * B * T * C * V;
  CHECK(model.total_flops() == 3 * forward);
  // The matrix products alone are 6 FLOPs per non-embedding parameter per token, plus the tied head.
  const std::uint64_t matmul_params = L * 12 * C * C + V * C;
  CHECK(model.total_flops() - 3 * L * 4 * B * T * T * C == 6 * matmul_params * B * T);
  const auto dir = temp_dir();
  save_model_profile(model, dir / "f.json");
  CHECK(load_model_profile(dir / "f.json").total_flops() == model.total_flops());
  std::filesystem::remove_all(dir);
}

TEST_CASE("a machine profile survives a JSON round trip and bad fields are named") {
  auto machine = describe_machine({.gpus = 4, .gpu_memory = 24 * GiB, .host_memory = 128 * GiB});
  machine.all_gather = {};
  machine.all_gather.add(1 * MiB, 5e9);
  machine.all_gather.add(64 * MiB, 12e9);
  CHECK_NOTHROW(validate(machine));
  CHECK(machine.all_gather.at(512 * KiB) == 5e9);
  CHECK(machine.all_gather.at(1 * GiB) == 12e9);
  CHECK(machine.all_gather.at(1 * MiB + 63 * MiB / 2) == doctest::Approx(8.5e9));
  const auto dir = temp_dir();
  save_machine_profile(machine, dir / "m.json");
  const auto loaded = load_machine_profile(dir / "m.json");
  CHECK(to_json(loaded) == to_json(machine));

  auto document = to_json(machine);
  document["all_gather"][1].erase("bytes_per_second");
  CHECK_THROWS_WITH_AS(machine_profile_from_json(document, "m"),
                       doctest::Contains("m.all_gather[1].bytes_per_second: missing field"), error);
  document = to_json(machine);
  document["devices"] = 0;
  CHECK_THROWS_WITH_AS(machine_profile_from_json(document, "m"), doctest::Contains("devices is 0"), error);
  document = to_json(machine);
  document["kind"] = "tpu";
  CHECK_THROWS_WITH_AS(machine_profile_from_json(document, "m"), doctest::Contains("m.kind: expected \"cuda\" or \"host\""),
                       error);
  document = to_json(machine);
  document["all_reduce"] = nlohmann::json::array();
  CHECK_THROWS_WITH_AS(machine_profile_from_json(document, "m"),
                       doctest::Contains("several devices need all_gather, reduce_scatter and all_reduce"), error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a machine profile of several machines keeps its link between them; older profiles are one machine") {
  auto machine = describe_machine({.gpus = 4});
  machine.machines = 3;
  machine.inter_machine = bandwidth_curve::flat(1.25e9);
  machine.inter_machine_latency_seconds = 50e-6;
  CHECK(job_ranks(machine) == 12);
  const auto loaded = machine_profile_from_json(to_json(machine), "m");
  CHECK(loaded.machines == 3);
  CHECK(loaded.inter_machine.at(8 * MiB) == 1.25e9);
  CHECK(loaded.inter_machine_latency_seconds == 50e-6);
  auto document = to_json(machine);
  for (const char* key : {"machines", "inter_machine", "inter_machine_latency_seconds"}) document.erase(key);
  const auto old = machine_profile_from_json(document, "m");  // written before these fields existed
  CHECK(old.machines == 1);
  CHECK(old.inter_machine.count == 0);
  document = to_json(machine);
  document["inter_machine"] = nlohmann::json::array();
  CHECK_THROWS_WITH_AS(machine_profile_from_json(document, "m"),
                       doctest::Contains("several machines need the inter_machine bandwidth"), error);
  document = to_json(machine);
  document["machines"] = 0;
  CHECK_THROWS_WITH_AS(machine_profile_from_json(document, "m"), doctest::Contains("machines is 0"), error);
}

TEST_CASE("a machine profile keeps the NVMe store's CPU cost per byte; older profiles have none; negative fails") {
  auto machine = describe_machine({.gpus = 1});
  machine.nvme_cpu_seconds_per_byte = 1.8e-10;
  CHECK(machine_profile_from_json(to_json(machine), "m").nvme_cpu_seconds_per_byte == 1.8e-10);
  auto document = to_json(machine);
  document.erase("nvme_cpu_seconds_per_byte");
  CHECK(machine_profile_from_json(document, "m").nvme_cpu_seconds_per_byte == 0.0);
  document["nvme_cpu_seconds_per_byte"] = -1e-9;
  CHECK_THROWS_WITH_AS(machine_profile_from_json(document, "m"),
                       doctest::Contains("nvme_cpu_seconds_per_byte must be 0 or more"), error);
}

TEST_CASE("flash attention drops the score matrices and recompute keeps only layer inputs") {
  auto config = gpt2_124m;
  const std::uint64_t B = 4, T = 1024, C = 768, H = 12, L = 12;
  const std::uint64_t full_layer = (B * T * (18 * C + 4) + B * H * T * T) * 4;
  const std::uint64_t flash_layer = (B * T * (18 * C + 4) + B * H * T) * 4;
  config.flash_attention = true;
  auto model = gpt2_profile(config);
  CHECK(model.passes[1].activation_bytes == B * T * C * 4 + flash_layer);
  config.recompute = true;
  model = gpt2_profile(config);
  // Forward of layer 2: embed + three saved layer outputs (its own included) + the slot of a layer's other
  // activations, which every pass holds.
  const std::uint64_t slot = flash_layer - B * T * C * 4;
  CHECK(model.passes[3].activation_bytes == B * T * C * 4 + 3 * B * T * C * 4 + slot);
  // Backward of layer 11: everything saved, the slot it recomputes into, and backward's workspace.
  const std::uint64_t workspace = (2 * B * T * C + 17 * B * T * C + B * H * T) * 4;
  CHECK(model.passes[15].activation_bytes == B * T * C * 4 + L * B * T * C * 4 + slot + workspace);
  CHECK(model.passes[15].flops == 3 * model.passes[12].flops);
  CHECK(gpt2_profile(gpt2_124m).peak_activation_bytes() > model.peak_activation_bytes() + L * (full_layer - B * T * C * 4) / 2);
  CHECK(gpt_20b.recompute);
  CHECK(gpt_20b.type == dtype::bf16);
}

// Found by tests/fuzz/fuzz_machine_profile: interpolating as a + t * (b - a) cancelled when a dwarfs b, so a curve
// loaded with 2e57 then 3e9 bytes/s answered 0 at the measured 3e9 point (and a cost model divides by it).
TEST_CASE("bandwidth curves are exact at measured sizes and stay between neighbours however far apart they are") {
  bandwidth_curve curve;
  curve.add(4 * KiB, 1e9);
  curve.add(32 * KiB, 2e57);
  curve.add(256 * KiB, 3e9);
  CHECK(curve.at(4 * KiB) == 1e9);
  CHECK(curve.at(32 * KiB) == 2e57);
  CHECK(curve.at(256 * KiB) == 3e9);
  for (byte_count m = 32 * KiB; m <= 256 * KiB; m += 4 * KiB) {
    CAPTURE(m);
    CHECK(curve.at(m) >= 3e9);
    CHECK(curve.at(m) <= 2e57);
  }
}
