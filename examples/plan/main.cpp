// chunkwise-plan: what chunkwise would do with a model on a machine. Prints the model's tensors, the chunk layout
// each layout policy gives (size, chunks, waste), and the explain table of the default plan set: every plan with its
// searched knobs, memory per tier and predicted step time, the chosen one marked. --json prints the same as JSON
// (docs/plan-json.md is its schema). Exit status: 0 with a chosen plan, 2 on bad input (the message names the flag),
// 3 when no plan fits (the message names the closest plan and the memory it needs). Tested by tests/plan_cli/.
//
//   chunkwise-plan --model gpt2-1558m --gpus 4 --gpu-mem 24GiB --host-mem 128GiB --pcie 16GB/s --nvme 3GB/s
#include <chunkwise/chunkwise.hpp>
#include <chunkwise/measure/cache.hpp>
#include <chunkwise/measure/host.hpp>
#include <chunkwise/plan.hpp>
#include <chunkwise/plan/explain_json.hpp>
#include <chunkwise/profile/json.hpp>
#include <chunkwise/profile/machine_json.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
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
  std::string machine_file;
  std::string save_machine_file;
  bool measure = false;
  bool gpu_memory_given = false;
  std::string measure_cache;
  std::string nvme_directory = std::filesystem::temp_directory_path().string();
  machine_description machine;
  byte_count alignment = 256;
  std::optional<dtype> type;
  std::optional<std::uint32_t> micro_batch;
  // The analytic model's dimensions, each overriding --model's.
  std::optional<std::uint32_t> layers, d_model, heads, vocab, context;
  std::vector<std::string> analytic_flags;  // the flags above given, for the error with --profile
  bool tensors = false;
  bool json = false;
};

constexpr std::string_view usage =
    "usage: chunkwise-plan [model] [machine] [--json]\n"
    "model:\n"
    "  --model NAME        an analytic GPT profile: gpt2-124m (default), gpt2-355m, gpt2-774m, gpt2-1558m,\n"
    "                      gpt-4b, gpt-10b, gpt-20b\n"
    "  --profile FILE      a model profile JSON (chunkwise.model_profile format)\n"
    "  --dtype T           parameter dtype of an analytic model (fp32, bf16, fp16)\n"
    "  --micro-batch N     sequences per rank per step of an analytic model\n"
  "  --layers N, --d-model N, --heads N, --vocab N, --context N\n"
  "                      the analytic model's dimensions, each overriding --model's (heads must divide d-model)\n"
    "  --save-profile FILE write the model profile as JSON\n"
    "machine (a described machine; defaults: 1 GPU, 24GiB, 64GiB host, 16GB/s PCIe, 3GB/s NVMe of 1TiB):\n"
    "  --gpus N  (--ranks N)   devices per machine, one rank each\n"
    "  --machines M        alike machines of the job (default 1), joined by --inter-machine RATE (bus bandwidth\n"
    "                      of a collective between machines, default 12.5GB/s: 100 Gb/s)\n"
    "  --gpu-mem BYTES     device memory per GPU chunkwise may use\n"
    "  --host-mem BYTES    host memory for chunk homes and optimizer states\n"
    "  --pcie RATE         host<->device bandwidth, e.g. 16GB/s\n"
    "  --nvme RATE         NVMe read bandwidth (writes at 80%); --nvme-capacity BYTES (0: no NVMe)\n"
    "  --collective RATE   bus bandwidth of collectives (default 80% of --pcie)\n"
    "  --gpu-flops RATE    achieved FLOP/s per GPU, e.g. 100e12\n"
    "  --machine FILE      a machine profile JSON instead (chunkwise.machine_profile format)\n"
    "  --measure           measure this machine for the host backend (about 10 s; cached by fingerprint in\n"
    "                      --measure-cache DIR, default ~/.cache/chunkwise); --nvme-dir DIR for the NVMe test\n"
    "  --save-machine FILE write the machine profile as JSON\n"
    "  --alignment BYTES   tensor alignment inside a chunk for the layout table (default 256)\n"
    "  --tensors           also list the model's tensors (name, elements, dtype, bytes, tied)\n"
  "  --json              print JSON (params, tensor_list, layouts, chosen, plans) instead of tables;\n"
  "                      docs/plan-json.md describes every field\n"
  "  --help, -h          this text\n"
  "exit status: 0 a plan was chosen, 2 bad input, 3 no plan fits (the message names the closest plan)\n";

/// "16GB/s" -> 16e9 bytes per second; plain numbers ("100e12") are taken as they are.
double parse_rate(const std::string& flag, const std::string& text) {
  std::string amount = text;
  if (amount.size() > 2 && amount.substr(amount.size() - 2) == "/s") amount.resize(amount.size() - 2);
  if (amount.find_first_of("eE") != std::string::npos && amount.find_first_not_of("0123456789.eE+-") == std::string::npos) {
    try {
      const double value = std::stod(amount);
      if (value > 0) return value;
    } catch (const std::exception&) {
    }
    throw_error(error_code::invalid_argument, flag + " expects a positive rate such as 16GB/s or 100e12, got '" + text + "'");
  }
  const double value = static_cast<double>(parse_bytes(amount));
  if (value <= 0) throw_error(error_code::invalid_argument, flag + " must be positive, got '" + text + "'");
  return value;
}

/// A dimension of the analytic model: a whole number from 1 to 2^24.
std::uint32_t parse_dimension(const std::string& flag, const std::string& text) {
  const auto n = parse_count(text, flag);
  if (n == 0 || n > (1u << 24))
    throw_error(error_code::invalid_argument, flag + " must be between 1 and 16777216, got " + std::to_string(n));
  return static_cast<std::uint32_t>(n);
}

/// Runs `body`; an error that does not name `flag` gets it in front ("--gpu-mem: '12 parsecs' is not a byte size").
template <class F>
decltype(auto) naming(const std::string& flag, F&& body) {
  try {
    return body();
  } catch (const error& e) {
    constexpr std::string_view prefix = "chunkwise: ";
    std::string message = e.what();
    if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
    if (message.find(flag) != std::string::npos) throw;
    throw error(e.code(), flag + ": " + message);
  }
}

/// The analytic model's dimension a flag sets (--layers, --d-model, --heads, --vocab, --context), or null.
std::optional<std::uint32_t>* analytic_dimension(options& opts, const std::string& flag) {
  if (flag == "--layers") return &opts.layers;
  if (flag == "--d-model") return &opts.d_model;
  if (flag == "--heads") return &opts.heads;
  if (flag == "--vocab") return &opts.vocab;
  if (flag == "--context") return &opts.context;
  return nullptr;
}

void parse_flag(options& opts, const std::vector<std::string>& args, std::size_t& i);

options parse_options(int argc, char** argv) {
  options opts;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string flag = args[i];
    naming(flag, [&] { parse_flag(opts, args, i); });
  }
  if (!opts.profile_file.empty() && !opts.analytic_flags.empty())
    throw_error(error_code::invalid_argument, opts.analytic_flags.front() +
                                                  " applies to an analytic model (--model), not to --profile " +
                                                  opts.profile_file);
  if (opts.alignment == 0 || (opts.alignment & (opts.alignment - 1)) != 0)
    throw_error(error_code::invalid_argument, "--alignment must be a power of two such as 256, got " +
                                                  std::to_string(opts.alignment));
  return opts;
}

void parse_flag(options& opts, const std::vector<std::string>& args, std::size_t& i) {
  const std::string& flag = args[i];
  const auto value = [&]() -> const std::string& {
    if (i + 1 >= args.size()) throw_error(error_code::invalid_argument, flag + " needs a value");
    return args[++i];
  };
  if (flag == "--help" || flag == "-h") {
    std::cout << usage;
    std::exit(0);
  } else if (flag == "--model") {
    opts.model = value();
    find_gpt2_config(opts.model);  // an unknown name fails here, naming the flag
    opts.analytic_flags.push_back(flag);
  } else if (flag == "--profile") {
    opts.profile_file = value();
  } else if (flag == "--save-profile") {
    opts.save_profile_file = value();
  } else if (flag == "--ranks" || flag == "--gpus") {
    const auto ranks = parse_count(value(), flag);
    if (ranks == 0 || ranks > 65536)
      throw_error(error_code::invalid_argument, flag + " must be between 1 and 65536, got " + std::to_string(ranks));
    opts.machine.gpus = static_cast<std::uint32_t>(ranks);
  } else if (flag == "--machines") {
    const auto machines = parse_count(value(), flag);
    if (machines == 0 || machines > 65536)
      throw_error(error_code::invalid_argument, flag + " must be between 1 and 65536, got " + std::to_string(machines));
    opts.machine.machines = static_cast<std::uint32_t>(machines);
  } else if (flag == "--inter-machine") {
    opts.machine.inter_machine_bytes_per_second = parse_rate(flag, value());
  } else if (flag == "--gpu-mem") {
    opts.machine.gpu_memory = parse_bytes(value());
    opts.gpu_memory_given = true;
  } else if (flag == "--host-mem") {
    opts.machine.host_memory = parse_bytes(value());
  } else if (flag == "--pcie") {
    opts.machine.pcie_bytes_per_second = parse_rate(flag, value());
  } else if (flag == "--nvme") {
    opts.machine.nvme_bytes_per_second = parse_rate(flag, value());
  } else if (flag == "--nvme-capacity") {
    opts.machine.nvme_capacity = parse_bytes(value());
  } else if (flag == "--collective") {
    opts.machine.collective_bytes_per_second = parse_rate(flag, value());
  } else if (flag == "--gpu-flops") {
    opts.machine.gpu_flops_per_second = parse_rate(flag, value());
  } else if (flag == "--machine") {
    opts.machine_file = value();
  } else if (flag == "--measure") {
    opts.measure = true;
  } else if (flag == "--measure-cache") {
    opts.measure_cache = value();
  } else if (flag == "--nvme-dir") {
    opts.nvme_directory = value();
  } else if (flag == "--save-machine") {
    opts.save_machine_file = value();
  } else if (flag == "--micro-batch") {
    const auto batch = parse_count(value(), flag);
    if (batch == 0 || batch > 1u << 20)
      throw_error(error_code::invalid_argument, "--micro-batch must be between 1 and 1048576, got " + std::to_string(batch));
    opts.micro_batch = static_cast<std::uint32_t>(batch);
    opts.analytic_flags.push_back(flag);
  } else if (auto* dimension = analytic_dimension(opts, flag)) {
    *dimension = parse_dimension(flag, value());
    opts.analytic_flags.push_back(flag);
  } else if (flag == "--alignment") {
    opts.alignment = parse_bytes(value());
  } else if (flag == "--dtype") {
    dtype type{};
    const std::string& name = value();
    if (!parse_dtype(name, type))
      throw_error(error_code::invalid_argument, "--dtype: unknown dtype '" + name + "'; use fp32, bf16 or fp16");
    opts.type = type;
    opts.analytic_flags.push_back(flag);
  } else if (flag == "--tensors") {
    opts.tensors = true;
  } else if (flag == "--json") {
    opts.json = true;
  } else {
    throw_error(error_code::invalid_argument, "unknown option '" + flag + "'\n" + std::string(usage));
  }
}

model_profile load_model(const options& opts) {
  if (!opts.profile_file.empty()) return naming("--profile", [&] { return load_model_profile(opts.profile_file); });
  gpt2_config config = find_gpt2_config(opts.model);
  if (opts.type) config.type = *opts.type;
  if (opts.micro_batch) config.micro_batch = *opts.micro_batch;
  if (opts.layers) config.layers = *opts.layers;
  if (opts.d_model) config.d_model = *opts.d_model;
  if (opts.heads) config.heads = *opts.heads;
  if (opts.vocab) config.vocab = *opts.vocab;
  if (opts.context) config.context = *opts.context;
  if (config.d_model % config.heads != 0)
    throw_error(error_code::invalid_argument, "--heads " + std::to_string(config.heads) + " must divide --d-model " +
                                                  std::to_string(config.d_model) + " (the model's width)");
  return gpt2_profile(config);
}

machine_profile load_machine(const options& opts) {
  if (!opts.machine_file.empty())
    return naming("--machine", [&] { return load_machine_profile(opts.machine_file); });
  if (opts.measure) {
    std::filesystem::path cache = opts.measure_cache;
    if (cache.empty()) {
      const char* home = std::getenv("HOME");
      cache = std::filesystem::path(home != nullptr ? home : ".") / ".cache" / "chunkwise";
    }
    // Checked before the seconds of measuring, not after.
    std::error_code ec;
    if (std::filesystem::exists(cache, ec) && !std::filesystem::is_directory(cache, ec))
      throw_error(error_code::invalid_argument, "--measure-cache: '" + cache.string() + "' is not a directory");
    if (!opts.nvme_directory.empty() && !std::filesystem::is_directory(opts.nvme_directory, ec))
      throw_error(error_code::invalid_argument, "--nvme-dir: '" + opts.nvme_directory +
                                                    "' is not a directory (\"\" measures no NVMe store)");
    return measure_or_load<host_backend>(cache, {.nvme_directory = opts.nvme_directory,
                                                 .device_memory = opts.gpu_memory_given ? opts.machine.gpu_memory : 0,
                                                 .ranks = opts.machine.gpus});
  }
  machine_profile machine = describe_machine(opts.machine);
  machine.name = std::to_string(opts.machine.gpus) + "x " + format_bytes(opts.machine.gpu_memory) + " GPU, " +
                 format_bytes(opts.machine.host_memory) + " host";
  if (opts.machine.machines > 1)
    machine.name = std::to_string(opts.machine.machines) + " machines of " + machine.name.str() + ", " +
                   detail::format_rate(opts.machine.inter_machine_bytes_per_second) + " between them";
  return machine;
}

struct plan_report {
  std::array<prediction, default_plans::size> plans;
  std::optional<std::size_t> chosen;
  std::string no_fit;  // why nothing fits, when nothing does
};

plan_report run_planner(const model_profile& model, const machine_profile& machine) {
  plan_report report;
  report.plans = evaluate<default_plans>(model, machine);
  try {
    report.chosen = choose<default_plans>(model, machine).index;
  } catch (const error& e) {
    report.no_fit = e.what();
  }
  return report;
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
          run_layout<layout::per_tensor>("per_tensor", model, layout_opts),
          run_layout<layout::private_chunks<>>("private_chunks<>", model, layout_opts)};
}

void print_tensors(const model_profile& model) {
  std::printf("%-5s %-40s %14s %-5s %12s %s\n", "index", "tensor", "elements", "dtype", "bytes", "tied");
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    const auto& t = model.tensors[i];
    std::printf("%-5zu %-40s %14llu %-5s %12s %s\n", i, t.name.str().c_str(), static_cast<unsigned long long>(t.elements),
                std::string(to_string(t.type)).c_str(), format_bytes(t.bytes()).c_str(), t.tied ? "tied" : "");
  }
  std::printf("\n");
}

void print_tables(const model_profile& model, const machine_profile& machine, const options& opts,
                  const std::vector<layout_row>& rows, const plan_report& report) {
  const std::uint32_t ranks = job_ranks(machine);
  std::size_t tied = 0;
  for (const auto& t : model.tensors) tied += t.tied ? 1 : 0;
  std::printf("model %s: %zu tensors (%zu tied), %llu parameters, %s; %zu passes, peak activations %s per rank\n",
              model.name.str().c_str(), model.tensors.size(), tied,
              static_cast<unsigned long long>(model.parameter_count()), format_bytes(model.tensor_bytes()).c_str(),
              model.passes.size(), format_bytes(model.peak_activation_bytes()).c_str());
  std::printf("largest tensor %s; %.1f GFLOP per step and rank\n", format_bytes(model.largest_tensor_bytes()).c_str(),
              static_cast<double>(model.total_flops()) / 1e9);
  std::printf("machine %s: %u x %s device memory, %s host memory, %s NVMe\n\n", machine.name.str().c_str(),
              machine.devices, format_bytes(machine.device_memory).c_str(), format_bytes(machine.host_memory).c_str(),
              format_bytes(machine.nvme_capacity).c_str());
  std::printf("chunk layouts for %u ranks, alignment %llu bytes:\n", ranks, static_cast<unsigned long long>(opts.alignment));
  std::printf("%-16s %12s %7s %12s %8s %12s\n", "layout", "chunk size", "chunks", "waste", "waste %", "shard/rank");
  for (const auto& row : rows) {
    if (!row.summary) {
      std::printf("%-16s infeasible: %s\n", row.name.c_str(), row.error.c_str());
      continue;
    }
    const auto& s = *row.summary;
    std::printf("%-16s %12s %7llu %12s %7.2f%% %12s\n", row.name.c_str(), format_bytes(s.chunk_bytes).c_str(),
                static_cast<unsigned long long>(s.chunk_count), format_bytes(s.waste).c_str(),
                100.0 * s.waste_fraction(), format_bytes(s.total_bytes / ranks).c_str());
  }
  std::printf("\nplans (step time per rank; device memory per rank, host and NVMe for the machine; * = chosen):\n%s",
              explain_table<default_plans>(report.plans, report.chosen).c_str());
  if (report.chosen) {
    const auto& p = report.plans[*report.chosen];
    std::printf("\nchosen: %s, %s chunks x %llu, %llu device blocks, %.0f%% of resident chunks' optimizer states off "
                "the device; predicted %.3f s per step\n",
                default_plans::names()[*report.chosen].c_str(), format_bytes(p.knobs.chunk_bytes).c_str(),
                static_cast<unsigned long long>(p.knobs.chunks), static_cast<unsigned long long>(p.knobs.device_blocks),
                100.0 * p.knobs.offload_fraction, p.time.step);
    std::printf("  %s\n", explain_bound<default_plans>(report.plans, *report.chosen).c_str());
  } else {
    std::printf("\n%s\n", report.no_fit.c_str());
  }
}

nlohmann::json to_json(const model_profile& model, const machine_profile& machine, const options& opts,
                       const std::vector<layout_row>& rows, const plan_report& report) {
  const std::uint32_t ranks = job_ranks(machine);
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
                    {"shard_bytes_per_rank", s.total_bytes / ranks}});
    } else {
      entry["error"] = row.error;
    }
    layouts.push_back(std::move(entry));
  }
  nlohmann::json tensor_list = nlohmann::json::array();
  for (const auto& t : model.tensors)
    tensor_list.push_back({{"name", t.name.str()},
                           {"elements", t.elements},
                           {"dtype", std::string(to_string(t.type))},
                           {"bytes", t.bytes()},
                           {"tied", t.tied}});
  return {{"format", "chunkwise.plan_report"},
          {"version", 1},
          {"model", model.name.str()},
          {"params", model.parameter_count()},
          {"tensors", model.tensors.size()},
          {"tensor_list", std::move(tensor_list)},
          {"passes", model.passes.size()},
          {"tensor_bytes", model.tensor_bytes()},
          {"peak_activation_bytes", model.peak_activation_bytes()},
          {"ranks", ranks},
          {"alignment", opts.alignment},
          {"machine", chunkwise::to_json(machine)},
          {"layouts", std::move(layouts)},
          {"chosen", report.chosen ? nlohmann::json(default_plans::names()[*report.chosen]) : nlohmann::json(nullptr)},
          {"no_fit", report.chosen ? nlohmann::json(nullptr) : nlohmann::json(report.no_fit)},
          {"plans", explain_json<default_plans>(report.plans, report.chosen)}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options opts = parse_options(argc, argv);
    const model_profile model = load_model(opts);
    if (!opts.save_profile_file.empty())
      naming("--save-profile", [&] { save_model_profile(model, opts.save_profile_file); });
    const machine_profile machine = load_machine(opts);
    validate(machine);
    if (!opts.save_machine_file.empty())
      naming("--save-machine", [&] { save_machine_profile(machine, opts.save_machine_file); });
    const layout_options layout_opts{job_ranks(machine), opts.alignment};
    validate(layout_opts);
    const auto rows = run_layouts(model, layout_opts);
    const auto report = run_planner(model, machine);
    if (opts.json) {
      std::cout << to_json(model, machine, opts, rows, report).dump(2) << "\n";
      if (!report.chosen) std::fprintf(stderr, "%s\n", report.no_fit.c_str());  // stdout is the JSON
    } else {
      if (opts.tensors) print_tensors(model);
      print_tables(model, machine, opts, rows, report);
    }
    return report.chosen ? 0 : 3;
  } catch (const chunkwise::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
