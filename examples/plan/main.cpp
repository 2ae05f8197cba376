// chunkwise-plan: what chunkwise would do with a model. For now: the model's tensors and the chunk layout each
// layout policy gives (size, chunks, waste), as a table or as JSON.
//
//   chunkwise-plan [--model gpt2-124m | --profile FILE] [--ranks N] [--alignment BYTES] [--dtype fp32|bf16|fp16]
//                  [--save-profile FILE] [--json]
#include <chunkwise/chunkwise.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace chunkwise;

struct options {
  std::string model = "gpt2-124m";
  std::string profile_file;
  std::string save_profile_file;
  std::uint32_t ranks = 1;
  byte_count alignment = 256;
  std::optional<dtype> type;
  bool json = false;
};

constexpr std::string_view usage =
    "usage: chunkwise-plan [--model NAME | --profile FILE] [--ranks N] [--alignment BYTES] [--dtype fp32|bf16|fp16]\n"
    "                      [--save-profile FILE] [--json]\n"
    "  --model NAME        an analytic GPT profile: gpt2-124m (default), gpt2-355m, gpt2-774m, gpt2-1558m,\n"
    "                      gpt-4b, gpt-10b, gpt-20b\n"
    "  --profile FILE      a model profile JSON (chunkwise.model_profile format)\n"
    "  --ranks N           ranks that shard each chunk (default 1)\n"
    "  --alignment BYTES   tensor alignment inside a chunk (default 256)\n"
    "  --dtype T           parameter dtype of an analytic model (default fp32)\n"
    "  --save-profile FILE write the model profile as JSON\n"
    "  --json              print JSON instead of tables\n";

std::uint64_t parse_count(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || text[0] == '-')
    detail::raise(error_code::invalid_argument, flag + " expects a non-negative integer, got '" + text + "'");
  return value;
}

options parse_options(int argc, char** argv) {
  options opts;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    const auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) detail::raise(error_code::invalid_argument, flag + " needs a value");
      return args[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::cout << usage;
      std::exit(0);
    } else if (flag == "--model") {
      opts.model = value();
    } else if (flag == "--profile") {
      opts.profile_file = value();
    } else if (flag == "--save-profile") {
      opts.save_profile_file = value();
    } else if (flag == "--ranks") {
      const auto ranks = parse_count(flag, value());
      if (ranks == 0 || ranks > 65536)
        detail::raise(error_code::invalid_argument, "--ranks must be between 1 and 65536, got " + std::to_string(ranks));
      opts.ranks = static_cast<std::uint32_t>(ranks);
    } else if (flag == "--alignment") {
      opts.alignment = parse_bytes(value());
    } else if (flag == "--dtype") {
      dtype type{};
      const std::string& name = value();
      if (!parse_dtype(name, type))
        detail::raise(error_code::invalid_argument, "--dtype: unknown dtype '" + name + "'; use fp32, bf16 or fp16");
      opts.type = type;
    } else if (flag == "--json") {
      opts.json = true;
    } else {
      detail::raise(error_code::invalid_argument, "unknown option '" + flag + "'\n" + std::string(usage));
    }
  }
  return opts;
}

model_profile load_model(const options& opts) {
  if (!opts.profile_file.empty()) return load_model_profile(opts.profile_file);
  gpt2_config config = find_gpt2_config(opts.model);
  if (opts.type) config.type = *opts.type;
  return gpt2_profile(config);
}

struct layout_row {
  std::string name;
  std::optional<layout_summary> summary;
  std::string error;
};

template <chunk_layout Layout>
layout_row run_layout(std::string name, const model_profile& model, const layout_options& layout_opts) {
  layout_row row{std::move(name), std::nullopt, {}};
  try {
    row.summary = Layout::summarize(model, layout_opts);
  } catch (const error& e) {
    constexpr std::string_view prefix = "chunkwise: ";
    row.error = std::string_view(e.what()).substr(prefix.size());
  }
  return row;
}

std::vector<layout_row> run_layouts(const model_profile& model, const layout_options& layout_opts) {
  return {run_layout<layout::fixed<64 * MiB>>("fixed<64 MiB>", model, layout_opts),
          run_layout<layout::fixed<256 * MiB>>("fixed<256 MiB>", model, layout_opts),
          run_layout<layout::min_waste<>>("min_waste<>", model, layout_opts),
          run_layout<layout::per_tensor>("per_tensor", model, layout_opts)};
}

void print_tables(const model_profile& model, const options& opts, const std::vector<layout_row>& rows) {
  std::size_t tied = 0;
  for (const auto& t : model.tensors) tied += t.tied ? 1 : 0;
  std::printf("model %s: %zu tensors (%zu tied), %llu parameters, %s; %zu steps, peak activations %s per rank\n",
              model.name.str().c_str(), model.tensors.size(), tied,
              static_cast<unsigned long long>(model.parameter_count()), format_bytes(model.tensor_bytes()).c_str(),
              model.steps.size(), format_bytes(model.peak_activation_bytes()).c_str());
  std::printf("largest tensor %s; ranks %u, alignment %llu bytes\n\n", format_bytes(model.largest_tensor_bytes()).c_str(),
              opts.ranks, static_cast<unsigned long long>(opts.alignment));
  std::printf("%-16s %12s %7s %12s %8s %12s\n", "layout", "chunk size", "chunks", "waste", "waste %", "shard/rank");
  for (const auto& row : rows) {
    if (!row.summary) {
      std::printf("%-16s infeasible: %s\n", row.name.c_str(), row.error.c_str());
      continue;
    }
    const auto& s = *row.summary;
    std::printf("%-16s %12s %7llu %12s %7.2f%% %12s\n", row.name.c_str(), format_bytes(s.chunk_bytes).c_str(),
                static_cast<unsigned long long>(s.chunk_count), format_bytes(s.waste).c_str(),
                100.0 * s.waste_fraction(), format_bytes(s.total_bytes / opts.ranks).c_str());
  }
}

nlohmann::json to_json(const model_profile& model, const options& opts, const std::vector<layout_row>& rows) {
  nlohmann::json layouts = nlohmann::json::array();
  for (const auto& row : rows) {
    nlohmann::json entry{{"name", row.name}, {"feasible", row.summary.has_value()}};
    if (row.summary) {
      const auto& s = *row.summary;
      entry.update({{"chunk_bytes", s.chunk_bytes},
                    {"chunks", s.chunk_count},
                    {"total_bytes", s.total_bytes},
                    {"waste_bytes", s.waste},
                    {"waste_percent", 100.0 * s.waste_fraction()},
                    {"shard_bytes_per_rank", s.total_bytes / opts.ranks}});
    } else {
      entry["error"] = row.error;
    }
    layouts.push_back(std::move(entry));
  }
  return {{"model", model.name.str()},
          {"params", model.parameter_count()},
          {"tensors", model.tensors.size()},
          {"tensor_bytes", model.tensor_bytes()},
          {"peak_activation_bytes", model.peak_activation_bytes()},
          {"ranks", opts.ranks},
          {"alignment", opts.alignment},
          {"layouts", std::move(layouts)}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options opts = parse_options(argc, argv);
    const model_profile model = load_model(opts);
    if (!opts.save_profile_file.empty()) save_model_profile(model, opts.save_profile_file);
    const layout_options layout_opts{opts.ranks, opts.alignment};
    validate(layout_opts);
    const auto rows = run_layouts(model, layout_opts);
    if (opts.json) std::cout << to_json(model, opts, rows).dump(2) << "\n";
    else print_tables(model, opts, rows);
    return 0;
  } catch (const chunkwise::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
