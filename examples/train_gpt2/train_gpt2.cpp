// train_gpt2: a small GPT-2 trained on the CPU with every parameter, gradient and optimizer state in chunkwise.
//
// It profiles itself (a dry run of its loop against chunkwise's tracer), measures this machine or loads its cached
// profile, prints the explain table of the plans it can run and the chosen one, then trains thread ranks (or MPI
// processes: --comm mpi) under that plan with a progress line per step. The device is emulated in host memory under
// a byte budget per rank; the default budget (32 MiB, a small GPU) is a third of the default model's training
// state, so the default run shows what chunkwise is for: the resident plans do not fit and the search picks one
// that streams chunks from a host or NVMe home or keeps the optimizer states off the device. Flags:
//   --steps N (200)  --ranks N (1)  --plan NAME  --lr X (3e-4, the peak)  --seed N
//   --warmup N (0: steps of linear warm-up)  --lr-final-frac F (1: constant after warm-up; below 1: cosine decay to
//   F * lr at the last step, as llm.c's -q)  --clip X (0: off; llm.c and nanoGPT use 1.0: the global gradient norm
//   is clipped to X, which makes each step's updates wait for the norm instead of overlapping backward)
//   --dtype fp32|bf16|fp16 (fp32: parameters and gradients in the chunks; bf16/fp16 store them in 16 bits, half the
//   bytes moved and cached, with fp32 master weights and Adam states; fp16 adds dynamic loss scaling, skipping steps
//   whose gradients overflow; the loops compute in fp32 either way)
//   --device-budget BYTES (32MiB per rank; 0: this machine's measured memory, a quarter of what is available)
//   --layers N (8) --channels N (256) --heads N (4) --context N (64) --batch N (2, per rank)
//   --vocab N (256: bytes; 50257: GPT-2's tokens, wte padded to 50304 rows as llm.c pads it)
//   --data FILE (llm.c's token shards, magic 20240520, are read as tokens; any other file as bytes)
//   --init-from FILE (an llm.c checkpoint, version 3 fp32 or 5 bf16: the model's shape and initial parameters;
//   --context may shorten it)  --save-llmc FILE (the trained parameters as an llm.c checkpoint: 5 under --dtype bf16)
//   --measure-cache DIR (~/.cache/chunkwise: the machine profile, and the rate this trainer's passes compute at,
//   measured once per model shape, dtype, rank count, matrix-product engine and build; and the NVMe drive's speed
//   under a run's own traffic, which the next run plans with)  --recalibrate (measure that rate now and replace the
//   cached one, and plan with the drive's profiled rates: the machine's speed drifts)  --eval-every N (50)
//   --checkpoint DIR (save there at every evaluation and at the end)  --resume (continue from DIR's checkpoint)
//   --nvme-dir DIR (the NVMe store's directory for plans with NVMe homes; the system's temporary directory)
//   --recompute auto|on|off (activation checkpointing: each block keeps only its output and backward recomputes its
//   forward; auto: on when no plan fits the device, or the machine's memory, with every block's activations kept)
//   --matmul auto|dnnl|blas|loops (the host's matrix products: dnnl through oneDNN, in bf16 under --dtype bf16
//   (operands rounded to bf16, fp32 accumulation: twice the fp32 rate on AVX-512 BF16); blas through OpenBLAS's
//   sgemm; loops the model's own OpenMP loops, bit-identical for any thread count; auto, the default: dnnl, else
//   blas, whichever the build found)
//   --comm threads|mpi|nccl (threads: --ranks N threads of this process; mpi: one rank per MPI process, as many as
//   the launcher started, `mpirun -np N train_gpt2 --comm mpi`; rank 0 plans and prints; nccl, with --backend cuda:
//   MPI processes as for mpi, one GPU each (its local rank), the training's collectives on NCCL over the chunks in
//   GPU memory, MPI only for the plan and the printed losses)
//   --comm-timeout S (300: a process rank waiting longer for a collective ends the job, naming the peers on its
//   machine that are stopped or gone)
//   --global-batch N (rows of all ranks together, shared equally; the same batches on any rank count)
//   --backend host|cuda (host: the passes on the CPU; cuda: the passes on the GPU (device_model.hpp: Thrust functors,
//   cuBLAS in fp32), where the build has CUDA. One rank (or NCCL's processes): the chunks live in the GPU's memory
//   under the device budget (runtime<Plan, gpu_backend>), the passes compute on them in place (bf16 and fp16 widened
//   on the device) and the fused CUDA Adam updates the states there (the CPU's Adam those offloaded or streamed).
//   Several thread ranks (or --gpu-chunks off): chunk memory and the optimizer stay in the host backend's tiers, each
//   pass's parameters copied to the GPU and its gradients back)
#include <chunkwise/comm/thread_comm.hpp>
#include <chunkwise/optim/schedule.hpp>
#include <chunkwise/plan/dispatch.hpp>
#include <chunkwise/plan/explain.hpp>
#include <chunkwise/plan/search.hpp>
#include <chunkwise/measure/cache.hpp>
#include <chunkwise/measure/host.hpp>
#include <chunkwise/measure/rate_cache.hpp>
#include <chunkwise/backend/host.hpp>
#include <chunkwise/runtime/runtime.hpp>

#include "chunked_trainer.hpp"
#if CHUNKWISE_GPT2_CUDA
#include "device_executor.hpp"
#include "gpu_backend.hpp"
#if CHUNKWISE_GPT2_CUDA && CHUNKWISE_HAS_NCCL
#include <chunkwise/comm/cuda/nccl_comm.cuh>
#endif
#endif
#include "process_ranks.hpp"
#include "data_loader.hpp"
#include "drive_speed.hpp"
#ifndef CHUNKWISE_GPT2_BLAS
#define CHUNKWISE_GPT2_BLAS 0  // the build found no OpenBLAS
#endif
#ifndef CHUNKWISE_GPT2_DNNL
#define CHUNKWISE_GPT2_DNNL 0  // nor oneDNN
#endif
#if CHUNKWISE_GPT2_BLAS
#include "blas_matmul.hpp"
#endif
#if CHUNKWISE_GPT2_DNNL
#include "dnnl_matmul.hpp"
#endif
#include "llmc_files.hpp"
#include "gpt2_model.hpp"
#include "reference_trainer.hpp"
#include "timing.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <new>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <unistd.h>

namespace {

using namespace chunkwise;

// The default run: 8 layers of 256 channels, 6.4 M parameters, so 98 MiB of training state (fp32 parameters,
// gradients, Adam's m and v) and 23 MiB of activations against a 32 MiB device: only plans that stream chunks fit,
// and only with activation checkpointing (6.7 MiB kept). About 75 ms a step on two cores.
constexpr byte_count default_device_budget = 32 * MiB;

struct options {
  gpt2::model_config model{256, 64, 256, 4, 8, 2};
  std::size_t steps = 200;
  int ranks = 1;
  int ranks_here = 1;  // the ranks sharing this machine's cores and memory: all of them as threads
  std::string comm = "threads";  // the ranks: threads of this process, or MPI processes (mpi)
  std::size_t global_batch = 0;  // --global-batch: rows of all ranks together (0: --batch rows per rank)
  bool batch_given = false;
  double comm_timeout = 300;  // seconds a process rank waits for a collective before it names its peers and ends
  std::string plan;
  byte_count device_budget = default_device_budget;  // per rank; 0: the machine's measured memory
  bool device_budget_given = false;
  float lr = 3e-4f;  // at 1e-3 the default model sits on the unigram plateau (loss 3.1) for its 200 steps
  std::size_t warmup = 0;
  float lr_final_fraction = 1.0f;
  float clip = 0.0f;
  dtype type = dtype::fp32;
  std::uint64_t seed = 1337;
  std::string data = gpt2::default_data_file;
  std::string measure_cache;
  std::size_t eval_every = 50;
  std::string checkpoint;
  bool resume = false;
  bool recalibrate = false;  // measure the passes' compute rate now, replacing the cached one
  std::string nvme_dir;
  std::string backend = "host";
  bool gpu_chunks = true;  // --backend cuda: the chunks in GPU memory where the run allows (else host chunks, mirror)
  std::string recompute = "auto";  // activation checkpointing: auto (when nothing fits without it), on, off
  std::string matmul = "auto";  // host backend: dnnl (oneDNN), blas (OpenBLAS), loops (gpt2_model.hpp's); auto
  std::string init_from;  // an llm.c checkpoint: the model's shape and initial parameters
  std::string save_llmc;  // where to write the trained parameters as an llm.c checkpoint
  bool shape_given = false;  // --layers, --channels, --heads or --vocab (an imported checkpoint sets the shape)
};

/// The cores each rank's BLAS products and AdamW may use: the machine's, shared among the ranks on it.
unsigned cores_per_rank(const options& o) { return static_cast<unsigned>(gpt2::cores_per_rank(o.ranks_here)); }

/// The learning rate of each step: warm-up, then constant or cosine decay over the run.
optim::warmup_cosine schedule(const options& o) {
  return {.peak = o.lr, .warmup = o.warmup, .total = o.steps, .final_fraction = o.lr_final_fraction};
}

std::size_t count_flag(const std::string& flag, const std::string& text) {
  const auto value = parse_count(text, flag);
  if (value == 0) throw_error(error_code::invalid_argument, flag + " expects a positive integer, got '" + text + "'");
  return value;
}

options parse(int argc, char** argv) {
  options o;
  bool context_given = false;
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    const auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw_error(error_code::invalid_argument, flag + " needs a value");
      return args[++i];
    };
    if (flag == "--steps") o.steps = count_flag(flag, value());
    else if (flag == "--ranks") o.ranks = static_cast<int>(count_flag(flag, value()));
    else if (flag == "--plan") o.plan = value();
    else if (flag == "--device-budget") {
      o.device_budget = parse_bytes(value());
      o.device_budget_given = true;
    }
    else if (flag == "--lr") o.lr = std::stof(value());
    else if (flag == "--warmup") o.warmup = parse_count(value(), flag);
    else if (flag == "--lr-final-frac") o.lr_final_fraction = std::stof(value());
    else if (flag == "--clip") o.clip = std::stof(value());
    else if (flag == "--dtype") {
      const std::string name = value();
      if (!parse_dtype(name, o.type) || (o.type != dtype::fp32 && o.type != dtype::bf16 && o.type != dtype::fp16))
        throw_error(error_code::invalid_argument, "--dtype '" + name + "': use fp32, bf16 or fp16");
    }
    else if (flag == "--seed") o.seed = count_flag(flag, value());
    else if (flag == "--layers") o.model.layers = count_flag(flag, value()), o.shape_given = true;
    else if (flag == "--channels") o.model.channels = count_flag(flag, value()), o.shape_given = true;
    else if (flag == "--heads") o.model.heads = count_flag(flag, value()), o.shape_given = true;
    else if (flag == "--vocab") {
      o.model.vocab = count_flag(flag, value());
      o.model.padded_vocab = o.model.vocab > 256 ? gpt2::llmc_padded_vocab(o.model.vocab) : 0;  // as llm.c pads
      o.shape_given = true;
    }
    else if (flag == "--init-from") o.init_from = value();
    else if (flag == "--save-llmc") o.save_llmc = value();
    else if (flag == "--context") o.model.context = count_flag(flag, value()), context_given = true;
    else if (flag == "--batch") o.model.batch = count_flag(flag, value()), o.batch_given = true;
    else if (flag == "--global-batch") o.global_batch = count_flag(flag, value());
    else if (flag == "--comm") o.comm = value();
    else if (flag == "--comm-timeout") o.comm_timeout = std::stod(value());
    else if (flag == "--data") o.data = value();
    else if (flag == "--measure-cache") o.measure_cache = value();
    else if (flag == "--eval-every") o.eval_every = count_flag(flag, value());
    else if (flag == "--checkpoint") o.checkpoint = value();
    else if (flag == "--resume") o.resume = true;
    else if (flag == "--recalibrate") o.recalibrate = true;
    else if (flag == "--nvme-dir") o.nvme_dir = value();
    else if (flag == "--backend") o.backend = value();
    else if (flag == "--gpu-chunks") {
      const std::string v = value();
      if (v != "on" && v != "off") throw_error(error_code::invalid_argument, "--gpu-chunks '" + v + "': use on or off");
      o.gpu_chunks = v == "on";
    }
    else if (flag == "--matmul") o.matmul = value();
    else if (flag == "--recompute") o.recompute = value();
    else if (flag == "--help" || flag == "-h") {
      std::printf("see the comment at the top of examples/train_gpt2/train_gpt2.cpp for the flags\n");
      std::exit(0);
    } else {
      throw_error(error_code::invalid_argument, "unknown option '" + flag + "'; see --help");
    }
  }
  if (o.ranks > 64) throw_error(error_code::invalid_argument, "--ranks: at most 64 thread ranks");
  o.ranks_here = o.ranks;
  if (o.comm != "threads" && o.comm != "mpi" && o.comm != "nccl")
    throw_error(error_code::invalid_argument, "--comm '" + o.comm + "': use threads, mpi or nccl");
  if (o.comm == "nccl" && o.backend != "cuda")
    throw_error(error_code::invalid_argument, "--comm nccl: NCCL reduces the chunks in GPU memory; it goes with "
                                              "--backend cuda");
  if (!(o.comm_timeout > 0) || !std::isfinite(o.comm_timeout))
    throw_error(error_code::invalid_argument, "--comm-timeout: seconds > 0, got " + std::to_string(o.comm_timeout));
  if (o.global_batch != 0 && o.batch_given)
    throw_error(error_code::invalid_argument, "--batch (rows per rank) and --global-batch (rows of all ranks) "
                                              "are two ways to say one thing; give one");
  if (o.backend != "host" && o.backend != "cuda")
    throw_error(error_code::invalid_argument, "--backend '" + o.backend + "': use host or cuda");
  if (o.recompute != "auto" && o.recompute != "on" && o.recompute != "off")
    throw_error(error_code::invalid_argument, "--recompute '" + o.recompute + "': use auto, on or off");
  if (o.matmul != "auto" && o.matmul != "dnnl" && o.matmul != "blas" && o.matmul != "loops")
    throw_error(error_code::invalid_argument, "--matmul '" + o.matmul + "': use auto, dnnl, blas or loops");
  if (o.resume && o.checkpoint.empty())
    throw_error(error_code::invalid_argument, "--resume needs --checkpoint DIR: the directory to continue from");
  if (!(o.clip >= 0.0f) || !std::isfinite(o.clip))
    throw_error(error_code::invalid_argument, "--clip: a gradient norm >= 0 (0: no clipping), got " +
                                                  std::to_string(o.clip));
  schedule(o).validate();
  if (!o.init_from.empty()) {
    if (o.shape_given)
      throw_error(error_code::invalid_argument, "--init-from takes the model's shape from the checkpoint; leave out "
                                                "--layers, --channels, --heads and --vocab");
    const std::size_t context = o.model.context, batch = o.model.batch;
    o.model = gpt2::llmc::config_of(gpt2::llmc::read_checkpoint_shape(o.init_from));
    o.model.batch = batch;
    if (!context_given) o.model.context = std::min<std::size_t>(context, o.model.context);
    else o.model.context = context;  // longer than maxT: read_checkpoint says so
  }
  o.model.recompute = o.recompute == "on";  // after --init-from, which replaces the model's shape
  return o;
}

/// The rank count settles the rows per rank (--global-batch, shared equally) once the ranks are known (under
/// --comm mpi: the processes the launcher started).
void settle_batch(options& o) {
  if (o.global_batch != 0) {
    if (o.global_batch % static_cast<std::size_t>(o.ranks) != 0)
      throw_error(error_code::invalid_argument,
                  "--global-batch " + std::to_string(o.global_batch) + " cannot be shared equally by " +
                      std::to_string(o.ranks) + " ranks; use a multiple of " + std::to_string(o.ranks));
    o.model.batch = o.global_batch / static_cast<std::size_t>(o.ranks);
  }
  gpt2::validate(o.model);
}

/// The activations the trainer keeps per rank for a shape (the traced schedule's peak: forward's saved tensors plus a
/// pass's working set; under recompute one block's), in host memory as llm.c keeps them.
byte_count activation_bytes(const gpt2::model_config& config) {
  return gpt2::trace_profile(config).peak_activation_bytes();
}

/// --backend cuda at one rank, or on NCCL's processes (which reduce device memory only): the chunks in the GPU's
/// memory, the passes computing on them there. Several thread ranks on one GPU would need a communicator whose
/// collectives read device memory.
bool runs_on_device_chunks(const options& o) {
#if CHUNKWISE_GPT2_CUDA
  return o.backend == "cuda" && (o.comm == "nccl" || (o.gpu_chunks && o.ranks == 1));
#else
  (void)o;
  return false;
#endif
}

/// Device memory the passes hold beside their activations for the whole run, which the plan charges with them: on
/// 16-bit (bf16, fp16) device chunks, the staging areas the parameters are widened into and the gradients are
/// computed in.
byte_count device_pass_staging_bytes(const options& o) {
#if CHUNKWISE_GPT2_CUDA
  if (runs_on_device_chunks(o) && o.type != dtype::fp32) return gpt2::device_workspace::staging_bytes(o.model);
#endif
  (void)o;
  return 0;
}
/// ... and on any device chunks, the scratch block: the token arrays, the row reductions' sums, cuBLAS's workspace.
byte_count device_pass_scratch_bytes(const options& o) {
#if CHUNKWISE_GPT2_CUDA
  if (runs_on_device_chunks(o)) return gpt2::device_workspace::scratch_bytes(o.model);
#endif
  (void)o;
  return 0;
}

/// The model profile the planner sees: the schedule traced for this run's shape, precision and recompute setting.
model_profile traced_model(const options& o) {
  model_profile traced = gpt2::trace_profile(o.model, o.type);
  // Held through every pass, as the activations' peak is held.
  const byte_count held = device_pass_staging_bytes(o) + device_pass_scratch_bytes(o);
  for (auto& pass : traced.passes) pass.activation_bytes += held;
  // The runtime gets a schedule; clipping and fp16's overflow check defer the updates.
  traced.updates_overlap_backward = o.clip == 0.0f && o.type != dtype::fp16;
  return traced;
}

/// Refuses a shape whose activations this machine's memory cannot hold, before anything allocates them: what it
/// needs, what there is, and the longest context and largest batch that would fit. Under --recompute auto, a shape
/// that fits only with activation checkpointing turns it on (and says so).
void check_activations_fit(options& o, byte_count host_memory) {
  const auto ranks = static_cast<byte_count>(o.ranks_here);  // the ranks whose activations share this machine
  const byte_count needed = activation_bytes(o.model) * ranks;
  if (host_memory == 0 || needed <= host_memory) return;
  if (o.recompute == "auto" && !o.model.recompute) {
    gpt2::model_config checkpointed = o.model;
    checkpointed.recompute = true;
    const byte_count checkpointed_bytes = activation_bytes(checkpointed) * ranks;
    if (checkpointed_bytes <= host_memory) {
      std::printf("activation checkpointing: on (every block's activations need %s, this machine has %s; recomputing "
                  "each block in backward keeps %s)\n", format_bytes(needed).c_str(), format_bytes(host_memory).c_str(),
                  format_bytes(checkpointed_bytes).c_str());
      o.model.recompute = true;
      return;
    }
  }
  // The largest value of `field` below its current one whose activations fit (0 if none does).
  const auto largest = [&](std::size_t gpt2::model_config::*field) {
    std::size_t low = 0, high = o.model.*field;
    while (high - low > 1) {
      const std::size_t mid = low + (high - low) / 2;
      gpt2::model_config shape = o.model;
      shape.*field = mid;
      (activation_bytes(shape) * ranks <= host_memory ? low : high) = mid;
    }
    return low;
  };
  const std::size_t context = largest(&gpt2::model_config::context), batch = largest(&gpt2::model_config::batch);
  std::string fits = context > 0 ? "--context " + std::to_string(context) + " at batch " + std::to_string(o.model.batch)
                                 : "no context at batch " + std::to_string(o.model.batch);
  fits += batch > 0 ? ", or --batch " + std::to_string(batch) + " at context " + std::to_string(o.model.context)
                    : " (no batch fits context " + std::to_string(o.model.context) + ")";
  throw_error(error_code::out_of_memory,
              "train_gpt2: the activations of batch " + std::to_string(o.model.batch) + " x context " +
                  std::to_string(o.model.context) + " need " + format_bytes(needed) + " (" +
                  std::to_string(o.ranks) + " rank(s); attention keeps B*heads*T*T scores per layer), this machine has " +
                  format_bytes(host_memory) + " of memory; what would fit: " + fits +
                  (o.model.recompute ? " (with activation checkpointing already on" : " (with --recompute off") +
                  "; fewer ranks or layers also shrink them)");
}

/// The training state as the planner counts it (fp32 parameters, gradients and Adam's m and v) against the device
/// budget: the lines printed before the explain table.
void print_memory(const options& o, const model_profile& model, byte_count budget, byte_count measured) {
  // Parameters and gradients in the chunks' type; fp32 master weights (16-bit types only) and Adam's two moments.
  const byte_count parameters = model.tensor_bytes(), elements = parameters / size_of(o.type);
  const byte_count master = o.type == dtype::fp32 ? 0 : 4 * elements, moments = 8 * elements;
  const byte_count state = 2 * parameters + master + moments;
  if (!o.device_budget_given)
    std::printf("device budget %s per rank (the default, emulating a small GPU; --device-budget 0 for this machine's "
                "measured %s per rank)\n", format_bytes(budget).c_str(), format_bytes(measured).c_str());
  else if (o.device_budget == 0)
    std::printf("device budget %s per rank (--device-budget 0: this machine's measured memory)\n",
                format_bytes(budget).c_str());
  else
    std::printf("device budget %s per rank (--device-budget; this machine's measured memory is %s per rank)\n",
                format_bytes(budget).c_str(), format_bytes(measured).c_str());
  const std::string type(to_string(o.type));
  const byte_count staging = device_pass_staging_bytes(o), scratch = device_pass_scratch_bytes(o);
  std::string staging_note;
  if (scratch > 0)
    staging_note = ", the device passes' scratch (" + format_bytes(scratch) + ": token arrays, row sums, cuBLAS's "
                   "workspace)" + (staging > 0 ? " and" : "");
  if (staging > 0) staging_note += " 16-bit chunks' staging areas (" + format_bytes(staging) + ")";
  if (!staging_note.empty()) staging_note += " included";
  std::printf("training state %s, as the planner counts it: parameters %s + gradients %s (%s)%s + Adam's m and v %s "
              "(fp32);\n  activations %s at their peak%s\n", format_bytes(state).c_str(),
              format_bytes(parameters).c_str(), format_bytes(parameters).c_str(), type.c_str(),
              master == 0 ? "" : (" + master weights " + format_bytes(master) + " (fp32)").c_str(),
              format_bytes(moments).c_str(), format_bytes(model.peak_activation_bytes()).c_str(),
              staging_note.c_str());
  const byte_count sharded = (state + static_cast<byte_count>(o.ranks) - 1) / static_cast<byte_count>(o.ranks);
  if (sharded > budget) {
    std::string not_even;
    if (o.ranks > 1)
      not_even =
          ", not even sharded over " + std::to_string(o.ranks) + " ranks (" + format_bytes(sharded) + " per rank)";
    std::printf("-> the training state does not fit the device%s:\n"
                "   no plan that keeps every chunk there with its gradients and Adam states can run. The search looks\n"
                "   for one that streams chunks from a pinned host or NVMe home, or keeps the Adam states off the "
                "device.\n",
                not_even.c_str());
  } else if (state > budget) {
    std::printf("-> the training state fits the device only sharded over the %d ranks (%s per rank, ZeRO-3); with the\n"
                "   activations and working buffers, the table says which plans fit.\n", o.ranks,
                format_bytes(sharded).c_str());
  } else {
    std::printf("-> the training state fits the device: plans that keep every chunk there are in the running, if the\n"
                "   activations and working buffers fit too (the table says).\n");
  }
}

std::string milliseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f ms", seconds * 1e3);
  return text;
}

/// Where the chosen plan keeps the chunks and what moves, in words.
template <class Plan>
std::string plan_in_words(const prediction& p) {
  const auto& k = p.knobs;
  const std::uint64_t streamed = k.chunks - k.resident_chunks;
  std::string text = std::to_string(k.chunks) + " chunks of up to " + format_bytes(k.chunk_bytes);
  if (streamed == 0) {
    text += ", all on the device";
  } else {
    text += ": " + std::to_string(streamed) + " live in " + std::string(Plan::placement::home_space::name) +
            " memory with their gradients and Adam states (updated there)\n        and stream through " +
            std::to_string(k.device_blocks - k.resident_chunks) +
            " device blocks, prefetched in the profiled order and evicted by next use";
    if (k.resident_chunks > 0) text += "; " + std::to_string(k.resident_chunks) + " stay on the device";
  }
  if (k.offloaded_resident_chunks > 0)
    text += "; the Adam states of " + std::to_string(k.offloaded_resident_chunks) + " of the " +
            std::to_string(k.resident_chunks) + " device chunks live in " +
            std::string(Plan::optimizer_execution::offload_space::name) + " memory, updated there";
  return text;
}

/// The chosen plan and why: the fastest that fits (or forced by --plan), the runner-up, what does not fit and by
/// how much, and what the plan does with the chunks.
template <class PlanSet, class Plan>
void print_choice(const std::array<prediction, PlanSet::size>& plans, std::size_t chosen, std::size_t best,
                  bool forced, byte_count budget) {
  const auto names = PlanSet::names();
  const prediction& p = plans[chosen];
  std::size_t fit = 0, misfits = 0, too_big = 0;
  byte_count least = ~byte_count{0}, most = 0;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].feasible) {
      ++fit;
      continue;
    }
    ++misfits;
    if (plans[i].limit != plan_limit::device_memory) continue;
    ++too_big;
    least = std::min(least, plans[i].needed);
    most = std::max(most, plans[i].needed);
  }
  std::printf("chosen: %s\n", names[chosen].c_str());
  if (forced)
    std::printf("  why:  forced by --plan (%s); predicted %s per step with %s of device memory\n",
                (chosen == best ? std::string("also the search's choice") : "the search would choose " + names[best])
                    .c_str(),
                milliseconds(p.time.step).c_str(), format_bytes(p.memory.device).c_str());
  else
    std::printf("  why:  %s: predicted %s per step with %s of the %s device budget\n",
                (fit == 1 ? std::string("the only plan that fits") : "the fastest of the " + std::to_string(fit) +
                                                                         " plans that fit").c_str(),
                milliseconds(p.time.step).c_str(), format_bytes(p.memory.device).c_str(), format_bytes(budget).c_str());
  std::printf("        %s\n", explain_bound<PlanSet>(plans, chosen).c_str());
  if (too_big > 0)
    std::printf("        %zu plan(s) do not fit the device: they need %s to %s, %s to %s more than the budget\n",
                too_big, format_bytes(least).c_str(), format_bytes(most).c_str(), format_bytes(least - budget).c_str(),
                format_bytes(most - budget).c_str());
  if (misfits > too_big)
    std::printf("        %zu plan(s) break another limit (the table says which)\n", misfits - too_big);
  std::printf("  what: %s\n", plan_in_words<Plan>(p).c_str());
}

/// What rank 0's planning took from the measure cache, for its summary: when the compute rate it planned with was
/// measured, and the NVMe drive's speed, which the run's own drive time corrects for the next run.
struct planning_notes {
  std::int64_t compute_rate_cached_at = 0;  // seconds since the Unix epoch; 0: measured by this run
  gpt2::drive_speed drive;
};

/// A rank's part of the run, whatever runs it (a thread, a process): the plan's knobs, the device budget per rank
/// and the initial parameters.
struct rank_setup {
  const options& o;
  const model_profile& model;
  byte_count device_budget;
  const prediction& chosen;
  const tensor_initializer& initialize;
  const planning_notes& notes;  // rank 0's
};

/// Test hooks (CHUNKWISE_GPT2_KILL_AT=RANK:STEP, CHUNKWISE_GPT2_STOP_AT=RANK:STEP): that rank kills itself with
/// SIGKILL, or stops itself with SIGSTOP, in the middle of that step, after its forward pass, as a crashed or a hung
/// process would.
void fault_if_asked(int rank, std::size_t step) {
  for (const auto& [variable, signal] :
       {std::pair{"CHUNKWISE_GPT2_KILL_AT", SIGKILL}, std::pair{"CHUNKWISE_GPT2_STOP_AT", SIGSTOP}}) {
    const char* at = std::getenv(variable);
    int fault_rank = -1;
    unsigned long long fault_step = 0;
    if (at != nullptr && std::sscanf(at, "%d:%llu", &fault_rank, &fault_step) == 2 && fault_rank == rank &&
        fault_step == step) {
      std::fprintf(stderr, "train_gpt2 (rank %d): %s: signal %d in step %zu\n", rank, variable, signal, step);
      std::raise(signal);
    }
  }
}

/// The runtime's settings for the chosen plan: its knobs (chunk size, device blocks, offloaded chunks, the layout's
/// candidate), the device budget per rank, and what the trainer asks of the optimizer.
runtime_options runtime_settings(const rank_setup& setup) {
  const options& o = setup.o;
  const auto& knobs = setup.chosen.knobs;
  runtime_options settings;
  settings.device_budget = setup.device_budget;
  settings.offloaded_chunks = knobs.offloaded_resident_chunks;
  settings.device_blocks = knobs.device_blocks;
  settings.chunk_bytes = knobs.chunk_bytes;
  settings.layout_candidate = knobs.layout_candidate;
  if (!o.nvme_dir.empty()) settings.nvme_directory = o.nvme_dir;
  // The rate is known before each step: each chunk's update starts once its gradient is reduced (unless
  // clipping, which needs every gradient's norm first).
  settings.learning_rate = schedule(o);
  settings.clip_norm = o.clip;
  // AdamW's SIMD kernel on the cores left to each rank (the updates are memory-bound: 28 bytes per parameter).
  settings.optimizer_threads = cores_per_rank(o);
  // fp16's range needs the loss scaled (and overflowed steps skipped); bf16 has fp32's range.
  if (o.type == dtype::fp16) settings.loss_scaling = optim::loss_scaler_config{};
  return settings;
}

/// Rank 0's account of the run: a line per step and per evaluation as they happen, the summary at the end.
class progress_log {
 public:
  progress_log(const options& o, std::size_t first_step) : o_(o), first_step_(first_step) {}

  /// Where a step's time went (zero_grad, forward and backward, the update), printed under
  /// CHUNKWISE_GPT2_KERNEL_TIMES.
  void add_parts(double zero_grad, double passes, double update) {
    parts_[0] += zero_grad, parts_[1] += passes, parts_[2] += update;
  }

  template <class Runtime>
  void step(std::size_t step, float loss, double seconds, const Runtime& rt) {
    step_seconds_.push_back(seconds);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double tokens = static_cast<double>((step - first_step_ + 1) * o_.model.batch *
                                              static_cast<std::size_t>(o_.ranks) * o_.model.context);
    if (step == first_step_) first_loss_ = loss, first_home_ = rt.home_stats();
    last_loss_ = loss;
    last_home_ = rt.home_stats();
    std::string extra;
    if (o_.clip > 0.0f) extra += "  norm " + std::to_string(rt.last_grad_norm()).substr(0, 6);
    if (o_.type == dtype::fp16) extra += "  loss scale " + std::to_string(static_cast<long>(rt.loss_scale()));
    if (rt.last_step_skipped()) extra += "  (skipped: gradients overflowed fp16)";
    std::printf("step %4zu/%zu  loss %.4f  lr %.2e%s  %4.0f ms  %.0f tokens/s  moved %s (rank 0)\n", step, o_.steps,
                loss, static_cast<double>(schedule(o_)(rt.steps() > 0 ? rt.steps() : 1)), extra.c_str(),
                seconds * 1e3, tokens / elapsed, format_bytes(rt.traffic().total()).c_str());
    std::fflush(stdout);
  }

  void validation(float loss) {
    std::printf("           validation loss %.4f\n", loss);
    last_validation_ = loss;
  }

  /// The losses, the bytes moved, the median step against the prediction, peaks and the device cache.
  template <class Runtime>
  void summary(const Runtime& rt, const prediction& chosen, const planning_notes& notes) const {
    if (step_seconds_.empty()) return;
    const std::size_t steps = step_seconds_.size();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::printf("\ndone: %zu steps in %.1f s; training loss %.4f at step %zu -> %.4f at step %zu, validation "
                "loss %.4f\n", steps, seconds, first_loss_, first_step_, last_loss_, o_.steps, last_validation_);
    const auto moved = rt.traffic();
    const auto cache = rt.cache_stats();
    const std::string home(cache.home_space.empty() ? std::string_view("home") : cache.home_space);
    std::string text;
    const auto add = [&](byte_count bytes, const std::string& what) {
      if (bytes != 0) text += (text.empty() ? "" : ", ") + format_bytes(bytes) + " " + what;
    };
    add(moved.fetched, "of chunks streamed " + home + "->device (" + format_bytes(moved.fetched / steps) + " a step)");
    add(cache.bytes_device_to_home, "written back device->" + home);
    add(moved.gathered, "gathered from other ranks");
    add(moved.reduced, "of gradients reduced");
    add(moved.published, "of updates published");
    std::printf("moved (rank 0, %zu steps): %s\n", steps, text.empty() ? "nothing" : text.c_str());
    if (std::getenv("CHUNKWISE_GPT2_KERNEL_TIMES") != nullptr) {
      std::printf("step parts over %zu steps: zero_grad %.1f ms, forward and backward %.1f ms, step %.1f ms\n", steps,
                  parts_[0] * 1e3, parts_[1] * 1e3, parts_[2] * 1e3);
#if CHUNKWISE_GPT2_CUDA
      gpt2::print_kernel_times();
#endif
    }
    if (steps > 1) {
      // The steady state: the first step (cold caches, first allocations) is left out.
      const std::vector<double> steady(step_seconds_.begin() + 1, step_seconds_.end());
      std::printf("timing: median step %.3f ms (predicted %.0f ms) over %zu steps (the first excluded), "
                  "device peak %s, pinned host peak %s\n",
                  gpt2::median_of(steady) * 1e3, chosen.time.step * 1e3, steady.size(),
                  format_bytes(rt.device_stats().peak).c_str(), format_bytes(rt.host_stats().peak).c_str());
      // A prediction far off with a cached compute rate: the machine may have changed speed since it was measured
      // (by more than its phases move it, 30-50% here; a small model's step is off by 20-30% from run to run).
      const double ratio = gpt2::median_of(steady) / chosen.time.step;
      if (notes.compute_rate_cached_at != 0 && chosen.time.step > 0 && (ratio > 1.5 || ratio < 1 / 1.5))
        std::printf("the median step is %.2fx the prediction, whose compute rate is the one cached at %s: if this "
                    "machine's speed has moved since, --recalibrate measures it again\n", ratio,
                    gpt2::utc_date(notes.compute_rate_cached_at).c_str());
    }
    if (rt.streamed_chunks() > 0)
      std::printf("device cache (rank 0, %zu of %zu chunks streamed): %s\n", rt.streamed_chunks(),
                  rt.layout().chunks.size(), rt.cache_stats().summary().c_str());
    if (const auto nvme = rt.nvme_updates(); nvme.updates > 0)
      std::printf("NVMe updates (rank 0): %s read a step; working blocks: %llu from the device cache, %llu read\n",
                  format_bytes(nvme.bytes_read / steps).c_str(),
                  static_cast<unsigned long long>(nvme.params_handed_over),
                  static_cast<unsigned long long>(nvme.params_read));
    print_drive(chosen, notes.drive);
  }

 private:
  /// The NVMe home store over the steps after the first, against the cost model's drive time (the profile's rates
  /// for this plan's block size, time-shared). A drive whose rate moved since it was measured shows here, apart from
  /// the rest of the model. With several ranks each has its own store on the drive and the model's time is theirs.
  void print_drive(const prediction& chosen, const gpt2::drive_speed& drive) const {
    const auto steps = static_cast<double>(step_seconds_.size() - 1);
    const double busy = (last_home_.busy_seconds - first_home_.busy_seconds) / std::max(steps, 1.0);
    if (steps < 1 || busy <= 0) return;
    const auto per_step = [&](byte_count last, byte_count first) {
      return format_bytes(static_cast<byte_count>(static_cast<double>(last - first) / steps));
    };
    char model[128] = "";
    if (o_.ranks == 1 && chosen.time.nvme > 0)
      std::snprintf(model, sizeof model, "; the cost model's drive time %.1f ms: the drive ran at %.2fx the predicted "
                    "rate", chosen.time.nvme * 1e3, chosen.time.nvme / busy);
    std::printf("NVMe drive (rank 0, the steps after the first): busy %.1f ms a step, reading %s and writing %s%s\n",
                busy * 1e3, per_step(last_home_.bytes_read, first_home_.bytes_read).c_str(),
                per_step(last_home_.bytes_written, first_home_.bytes_written).c_str(), model);
    // One rank alone on the drive: its rate under this traffic, for the next run. (Several ranks share it, each
    // with its own store: one rank's bytes over its busy time are not the drive's rate.)
    if (o_.ranks == 1) {
      const std::string line = drive.observe(last_home_.bytes_read - first_home_.bytes_read,
                                             last_home_.bytes_written - first_home_.bytes_written,
                                             last_home_.busy_seconds - first_home_.busy_seconds,
                                             chosen.knobs.nvme_block);
      if (!line.empty()) std::printf("%s\n", line.c_str());
    }
  }

  const options& o_;
  std::size_t first_step_;
  tier_stats first_home_, last_home_;  // the NVMe home store after the first step and after the last
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::vector<double> step_seconds_;
  float first_loss_ = 0, last_loss_ = 0, last_validation_ = 0;
  std::array<double, 3> parts_{};
};

/// Where the step's passes run: the CPU loops on chunk memory (through fp32_compute), or --backend cuda's device
/// passes, on a device mirror of host chunks (device_executor) or on the runtime's own device chunks
/// (device_chunk_executor).
template <class Runtime>
class step_passes {
  static constexpr bool device_chunks = !Runtime::chunks_on_host;

 public:
  step_passes(Runtime& rt, const options& o, int rank) {
    if constexpr (!device_chunks) {
      compute_.emplace(rt);
      if (o.backend != "cuda") {
        activation_memory_ = take_device_memory(rt, gpt2::activations<float>::total_bytes(o.model), "activations");
        acts_ = std::make_unique<gpt2::activations<float>>(o.model, activation_memory_.data());
        on_cpu_.emplace(rt, *compute_, *acts_);
      }
    }
#if CHUNKWISE_GPT2_CUDA
    if (o.backend != "cuda") return;
    // On the runtime's device chunks the activations (and 16-bit staging areas) are in its device tier (the GPU's)
    // too, where the plan charged them; staged from host chunks, the runtime's device is host memory, and the
    // device passes keep their own.
    gpt2::device_workspace::lent_memory lent;
    if constexpr (device_chunks) {
      activation_memory_ = take_device_memory(rt, gpt2::activations<float>::total_bytes(o.model), "activations");
      lent.activations = activation_memory_.data();
      scratch_memory_ = take_device_memory(rt, device_pass_scratch_bytes(o), "token arrays, row sums and cuBLAS's "
                                                                            "workspace");
      lent.scratch = scratch_memory_.data();
      if (const byte_count staging = device_pass_staging_bytes(o); staging > 0) {
        staging_memory_ = take_device_memory(rt, staging, "16-bit chunks' staging areas");
        lent.staging = staging_memory_.data();
      }
    }
    workspace_ = std::make_unique<gpt2::device_workspace>(o.model, /*bf16_products=*/o.type == dtype::bf16, lent);
    if constexpr (device_chunks) on_device_chunks_.emplace(rt, *workspace_, o.model);
    else {
      mirrored_.emplace(rt, *compute_);
      on_device_.emplace(*mirrored_, *workspace_, o.model);
    }
    gpt2::reset_kernel_times();  // the calibration's are not the run's
    if (rank == 0)
      std::printf("backend: the passes on %s, %s\n", workspace_->device_name(),
                  device_chunks ? "computing on the chunks in device memory"
                                : "each pass's tensors staged from host chunk memory");
#else
    (void)rank;
#endif
  }

  /// --backend cuda: the device memory the passes hold beside the plan's (see device_workspace::own_device_bytes).
  void print_own_device_memory() const {
#if CHUNKWISE_GPT2_CUDA
    if (!workspace_) return;
    if (device_chunks)  // every buffer lent: the activations, the scratch, 16-bit chunks' staging areas
      std::printf("device passes (rank 0): %s of device memory of their own, outside the device budget (all their "
                  "buffers are in the device tier the plan charged; the CUDA context is not counted)\n",
                  format_bytes(workspace_->own_device_bytes()).c_str());
    else
      std::printf("device passes (rank 0): %s of device memory of their own, outside the device budget: for host "
                  "chunks the activations, the scratch (token arrays, row sums, cuBLAS's workspace), a parameter "
                  "mirror and a staging area\n", format_bytes(workspace_->own_device_bytes()).c_str());
#endif
  }

  /// schedule(executor): the forward (and backward) passes of one batch from the profile's first pass.
  template <class Schedule>
  float run(Schedule&& schedule) {
#if CHUNKWISE_GPT2_CUDA
    if constexpr (device_chunks) {
      on_device_chunks_->restart();
      return schedule(*on_device_chunks_);
    } else if (on_device_) {
      mirrored_->restart();
      return schedule(*on_device_);
    }
#endif
    if constexpr (!device_chunks) {
      on_cpu_->restart();
      return schedule(*on_cpu_);
    }
    throw_error(error_code::unsupported, "train_gpt2: chunks in device memory need the device passes");
  }

 private:
  // `bytes` of the device tier beside the chunks, which the plan charged with the activations (the profile's peak).
  static typename Runtime::workspace take_device_memory(Runtime& rt, byte_count bytes, const char* what) {
    try {
      return rt.device_workspace(bytes);
    } catch (const chunkwise::error& e) {
      if (e.code() != error_code::out_of_memory) throw;
      std::string tier = e.what();
      tier.erase(0, tier.find(": ") + 2);  // the "chunkwise: " prefix, which the new error adds again
      throw_error(error_code::out_of_memory, "train_gpt2: the " + std::string(what) + " (" + format_bytes(bytes) +
                                                 ") do not fit the device beside the chunks: " + tier);
    }
  }

  std::optional<fp32_compute<Runtime>> compute_;
  typename Runtime::workspace activation_memory_, scratch_memory_, staging_memory_;
  std::unique_ptr<gpt2::activations<float>> acts_;  // in activation_memory_
  std::optional<gpt2::chunk_executor<Runtime>> on_cpu_;
#if CHUNKWISE_GPT2_CUDA
  std::unique_ptr<gpt2::device_workspace> workspace_;
  std::optional<gpt2::chunk_tensors<Runtime>> mirrored_;
  std::optional<gpt2::device_executor<gpt2::chunk_tensors<Runtime>>> on_device_;
  std::optional<gpt2::device_chunk_executor<Runtime, gpt2::default_stream_passes>> on_device_chunks_;
#endif
};

/// Trains rank comm.rank() under Plan on its rows of every global batch (the sampler's shard: no rank waits for
/// another's data) with the chunks in Backend's memory; rank 0 prints the progress and the summary. `host_comm`
/// (the same ranks) averages the printed losses: `comm` itself, unless its collectives take device memory only.
template <class Plan, class Backend, communicator Comm, communicator HostComm>
void train_rank(const rank_setup& setup, Comm& comm, HostComm& host_comm) {
  using clock = std::chrono::steady_clock;
  const options& o = setup.o;
  const auto& config = o.model;
  const int r = comm.rank();

  // This rank's rows of every global batch, training and validation.
  const std::size_t global_batch = config.batch * static_cast<std::size_t>(o.ranks);
  const gpt2::batch_shard shard{static_cast<std::size_t>(r), static_cast<std::size_t>(o.ranks)};
  gpt2::data_loader train_data(o.data, gpt2::data_split::train, global_batch, config.context, o.seed, config.vocab,
                               shard);
  gpt2::data_loader validation_data(o.data, gpt2::data_split::validation, global_batch, config.context, o.seed,
                                    config.vocab, shard);

  // The model's parameters, gradients and Adam states in chunkwise's chunks, under the plan.
  runtime<Plan, Backend, Comm> rt(setup.model, comm, setup.initialize, runtime_settings(setup));
  std::size_t first_step = 1;
  if (o.resume) {
    rt.load_checkpoint(o.checkpoint);
    first_step = rt.steps() + 1;
    for (std::size_t skipped = 1; skipped < first_step; ++skipped) train_data.next_batch();
    if (r == 0) std::printf("resumed from %s after step %zu\n", o.checkpoint.c_str(), first_step - 1);
  }
  const auto mean_loss = [&](float loss) {  // the global batch's loss: the mean over ranks
    float all = loss;
    host_comm.all_reduce(std::span<const float>(&loss, 1), std::span<float>(&all, 1), reduce_op::average).wait();
    return all;
  };

  // The step's schedule (schedule.hpp) on chunk memory: forward returns the loss; evaluations run forward only.
  step_passes passes(rt, o, r);
  const auto run = [&](const gpt2::data_loader& batch, bool backward) {
    const int* x = batch.tokens().data();
    const int* y = batch.targets().data();
    return passes.run([&](auto& executor) {
      const auto loss = static_cast<float>(gpt2::forward(executor, config, x, y));
      if (backward) {
        fault_if_asked(r, rt.steps() + 1);
        gpt2::backward(executor, config, x, y);
      }
      return loss;
    });
  };

  progress_log log(o, first_step);
  for (std::size_t step = first_step; step <= o.steps; ++step) {
    train_data.next_batch();
    const auto step_start = clock::now();
    rt.zero_grad();
    const auto zeroed = clock::now();
    const float loss = mean_loss(run(train_data, true));
    const auto passed = clock::now();
    rt.step();
    const auto updated = clock::now();
    log.add_parts(std::chrono::duration<double>(zeroed - step_start).count(),
                  std::chrono::duration<double>(passed - zeroed).count(),
                  std::chrono::duration<double>(updated - passed).count());
    if (r == 0) log.step(step, loss, std::chrono::duration<double>(updated - step_start).count(), rt);

    if (step % o.eval_every == 0 || step == o.steps) {
      // Validation: the forward passes only, after the update (chunks go back to ready or released).
      validation_data.reset();
      validation_data.next_batch();
      const float validation = mean_loss(run(validation_data, false));
      if (r == 0) log.validation(validation);
      if (!o.checkpoint.empty()) {
        rt.save_checkpoint(o.checkpoint);
        if (r == 0) std::printf("           saved %s\n", o.checkpoint.c_str());
      }
    }
  }
  if (r == 0) log.summary(rt, setup.chosen, setup.notes);
  if (r == 0) passes.print_own_device_memory();

  if (!o.save_llmc.empty()) {  // every rank reads (a collective call for sharded plans), rank 0 writes
    std::vector<std::vector<float>> trained;
    for (std::uint32_t t = 0; t < setup.model.tensors.size(); ++t) trained.push_back(rt.read_parameters(t));
    if (r == 0) {
      const int version = o.type == dtype::bf16 ? 5 : 3;  // llm.c's bf16 and fp32 formats
      gpt2::llmc::write_checkpoint(o.save_llmc, config, trained, version);
      std::printf("saved the parameters as an llm.c checkpoint (version %d): %s\n", version, o.save_llmc.c_str());
    }
  }
}

/// Trains under Plan with one thread per rank (a communicator over shared memory).
template <class Plan>
void train_threads(const rank_setup& setup) {
  thread_world world(setup.o.ranks);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(setup.o.ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < setup.o.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        gpt2::compute_on_rank_cores(setup.o.ranks_here);
        auto comm = world.comm(r);
#if CHUNKWISE_GPT2_CUDA
        if (runs_on_device_chunks(setup.o))
          return train_rank<Plan, gpt2::gpu_backend>(setup, comm, comm);
#endif
        train_rank<Plan, host_backend>(setup, comm, comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// --matmul: the engine of the host's matrix products (none: the model's loops), and a line saying which.
void install_matmul_engine(const options& o) {
  const bool dnnl = o.matmul == "dnnl" || (o.matmul == "auto" && CHUNKWISE_GPT2_DNNL);
  const bool blas = o.matmul == "blas" || (o.matmul == "auto" && !dnnl && CHUNKWISE_GPT2_BLAS);
  if (dnnl) {
#if CHUNKWISE_GPT2_DNNL
    gpt2::installed_matmul_engine() = &gpt2::dnnl_matmul_engine(o.type == dtype::bf16);
#else
    throw_error(error_code::unsupported, "--matmul dnnl: this train_gpt2 was built without oneDNN (install "
                                         "libdnnl-dev and configure again)");
#endif
  } else if (blas) {
#if CHUNKWISE_GPT2_BLAS
    gpt2::installed_matmul_engine() = &gpt2::blas_matmul_engine(static_cast<int>(cores_per_rank(o)));
#else
    throw_error(error_code::unsupported, "--matmul blas: this train_gpt2 was built without OpenBLAS (install "
                                         "libopenblas-openmp-dev and configure again)");
#endif
  }
  if (gpt2::installed_matmul_engine() == nullptr)
    std::printf("matrix products: the model's own loops%s\n",
                o.matmul == "loops" ? "" : " (this build found neither oneDNN nor OpenBLAS)");
  else
    std::printf("matrix products: %s, %u thread(s) per rank (--matmul loops: the model's own loops)\n",
                gpt2::installed_matmul_engine()->name, cores_per_rank(o));
}

}  // namespace

/// The rate the model's passes compute at, measured or read from the cache, and where it came from.
struct calibration {
  cached_rate rate;
  [[nodiscard]] std::string provenance() const {
    if (rate.measured_now) return "measured now, cached in " + rate.file.string();
    return "measured " + gpt2::utc_date(rate.measured_at) + " (cached; --recalibrate measures again)";
  }
};

/// The passes' rate for this run: everything it depends on is in the key (a rebuilt trainer measures again).
/// Thread ranks: all of this machine's ranks computing at once in this process. MPI processes a launcher bound to
/// their own cores: one rank on this process's cores (its threads would otherwise share them: 2 processes on 2 cores
/// measured half the rate the step ran at).
calibration calibrate_passes(const options& o, const std::filesystem::path& cache) {
  const int computing = o.backend == "cuda" || (o.comm != "threads" && gpt2::bound_by_launcher()) ? 1 : o.ranks_here;
  const auto* engine = gpt2::installed_matmul_engine();
  char key[512];
  const bool device_chunks = runs_on_device_chunks(o);
  std::snprintf(key, sizeof key, "train_gpt2 passes: backend %s%s, matmul %s, %s, %zu layers, %zu channels, %zu heads, "
                "%zu vocabulary rows, context %zu, batch %zu, recompute %s, %d rank(s) computing at once, build %s",
                o.backend.c_str(), o.backend != "cuda" ? "" : device_chunks ? " (device chunks)" : " (host chunks)",
                engine != nullptr ? engine->name : "loops", std::string(to_string(o.type)).c_str(),
                o.model.layers, o.model.channels, o.model.heads, o.model.vocab_rows(), o.model.context, o.model.batch,
                o.model.recompute ? "on" : "off", computing, program_build_stamp().c_str());
  rate_cache_options options;
  options.measure_again = o.recalibrate;
  return {measure_or_load_rate(cache, key, [&] {
#if CHUNKWISE_GPT2_CUDA
    if (o.backend == "cuda")  // passes on device chunks compute their gradients there; on host chunks, copied down
      return gpt2::measure_device_pass_flops(o.model, o.type == dtype::bf16,
                                             device_chunks ? gpt2::gradient_sink::device : gpt2::gradient_sink::host);
#endif
    return gpt2::measure_pass_flops(o.model, computing, o.type);
  }, options)};
}

/// What rank 0 decided, for every rank: the plan, its prediction, the device budget per rank and whether blocks
/// recompute their activations (which changes the traced model). `ok` false: rank 0 failed and says why.
struct run_decision {
  bool ok = false;
  bool recompute = false;
  std::uint64_t plan = 0;  // the index in gpt2::trainable_plans
  byte_count device_budget = 0;
  prediction chosen;
};
static_assert(std::is_trivially_copyable_v<run_decision>, "broadcast as bytes to the processes");

/// The machine as measured (or its cached profile): the GPU's where the chunks live in its memory (90% of its free
/// memory per rank, pinned copies, cuBLAS, the fused Adam), else the host's (its device memory: a quarter of the
/// available memory per rank, emulated).
machine_profile measured_machine(const options& o, const std::filesystem::path& cache) {
  const measure_options settings{.device_memory = 0, .ranks = static_cast<std::uint32_t>(o.ranks)};
#if CHUNKWISE_GPT2_CUDA
  if (runs_on_device_chunks(o)) return gpt2::measure_gpu_machine(cache, settings);
#endif
  return measure_or_load<host_backend>(cache, settings);
}

/// Profiles the model, measures the machine (or loads its profile), prints the memory lines and the explain table,
/// and chooses the plan: the fastest that fits, or --plan's. Throws with the table printed when none fits.
run_decision plan_the_run(options& o, const gpt2::machine_links& links, planning_notes& notes) {
  model_profile model = traced_model(o);
  if (runs_on_device_chunks(o))
    std::printf("train_gpt2: trains a GPT-2 on the GPU with its parameters, gradients and Adam states in chunkwise "
                "chunks, in the GPU's\nmemory under a byte budget; chunkwise chooses where the chunks live and move "
                "(the plan) and says why.\n\n");
  else
    std::printf("train_gpt2: trains a GPT-2 on the CPU with its parameters, gradients and Adam states in chunkwise "
                "chunks, on a device\nemulated in host memory under a byte budget; chunkwise chooses where the "
                "chunks live and move (the plan) and says why.\n\n");
  std::printf("model: GPT-2 with %zu layers, %zu channels, %zu heads, vocabulary %zu (%zu rows), context %zu, batch "
              "%zu per rank: %llu parameters, %zu tensors, %zu passes (traced), %.3f GFLOP per step per rank\n",
              o.model.layers, o.model.channels, o.model.heads, o.model.vocab, o.model.vocab_rows(), o.model.context,
              o.model.batch,
              static_cast<unsigned long long>(model.parameter_count()), model.tensors.size(), model.passes.size(),
              static_cast<double>(model.total_flops()) / 1e9);
  if (!o.init_from.empty())
    std::printf("parameters: imported from %s (llm.c checkpoint, version %d)\n", o.init_from.c_str(),
                gpt2::llmc::read_checkpoint_shape(o.init_from).version);
  std::fflush(stdout);
  std::filesystem::path cache = o.measure_cache;
  if (cache.empty()) {
    const char* home = std::getenv("HOME");
    cache = std::filesystem::path(home != nullptr ? home : ".") / ".cache" / "chunkwise";
  }
  // The machine as measured, then this run's device budget in its place.
  machine_profile machine = measured_machine(o, cache);
  // The drive at the speed a run on it observed, where one did.
  notes.drive = gpt2::drive_speed(cache, o.nvme_dir.empty() ? std::filesystem::temp_directory_path()
                                                            : std::filesystem::path(o.nvme_dir),
                                  machine, o.recalibrate);
  machine = notes.drive.machine();
  if (const std::string line = notes.drive.planning_line(); !line.empty()) std::printf("%s\n", line.c_str());
  const byte_count measured_memory = machine.device_memory;
  check_activations_fit(o, machine.host_memory);
  if (o.model.recompute) model = traced_model(o);
  if (o.device_budget != 0) machine.device_memory = o.device_budget;
  // Processes on several machines: the measured link between them, and this machine's processes as its devices.
  if (links.machines > 1) {
    if (static_cast<std::uint32_t>(o.ranks) % links.machines != 0)
      throw_error(error_code::invalid_argument,
                  std::to_string(o.ranks) + " processes on " + std::to_string(links.machines) +
                      " machines: the planner needs the same number of processes on every machine");
    machine.machines = links.machines;
    machine.devices = static_cast<std::uint32_t>(o.ranks) / links.machines;
    machine.inter_machine = links.inter_machine;
    machine.inter_machine_latency_seconds = links.latency_seconds;
    std::printf("machines: %u of %u process(es) each; between them an all-reduce reaches %.2f GB/s bus bandwidth at "
                "16 MiB, %.0f us per call\n", machine.machines, machine.devices,
                machine.inter_machine.at(16 * MiB) / 1e9, machine.inter_machine_latency_seconds * 1e6);
  }
  // The compute rate of this trainer's own pass functions (the profile's GEMM rate is a peak), cached beside the
  // machine profile.
  const double gemm_flops = machine.device_flops_per_second;
  const calibration compute = calibrate_passes(o, cache);
  machine.device_flops_per_second = compute.rate.value;
  notes.compute_rate_cached_at = compute.rate.measured_now ? 0 : compute.rate.measured_at;
  std::printf("compute: the model's %s passes run at %.2f GFLOP/s per rank with %d rank(s) on this machine%s "
              "(the machine profile's plain blocked GEMM: %.2f); %s\n\n", o.backend == "cuda" ? "device" : "CPU",
              machine.device_flops_per_second / 1e9, o.ranks_here,
              o.type == dtype::fp32 ? "" : (", with the " + std::string(to_string(o.type)) + " conversions").c_str(),
              gemm_flops / 1e9, compute.provenance().c_str());
  // The fixed cost of a collective call among this run's ranks of one machine, measured with them (the profile's is
  // 2 thread ranks'): thread ranks outnumbering the cores take turns, MPI processes pay MPI's own.
  if (o.comm == "threads" && o.ranks > 1)
    machine.collective_latency_seconds = chunkwise::measure_thread_collective_latency(o.ranks);
  else if (links.local_latency_seconds > 0)
    machine.collective_latency_seconds = links.local_latency_seconds;
  if (o.ranks_here > 1)
    std::printf("collectives: %.0f us per call among this machine's %d %s\n", machine.collective_latency_seconds * 1e6,
                o.ranks_here, o.comm != "threads" ? "processes" : "thread ranks");
  print_memory(o, model, machine.device_memory, measured_memory);

  // The search: every plan's knobs against the cost model, the fastest that fits. When none fits, the table says
  // what each would need before the error does.
  using plan_set = gpt2::trainable_plans;
  const auto table_title = [&] {
    std::printf("\nplans (host backend, %d %s, device budget %s per rank; * the one trained):\n", o.ranks,
                o.comm != "threads" ? "MPI process(es)" : "thread rank(s)",
                format_bytes(machine.device_memory).c_str());
  };
  std::array<prediction, plan_set::size> plans;
  std::size_t best = 0;
  try {
    auto choice = [&] {
      try {
        return choose<plan_set>(model, machine);
      } catch (const chunkwise::error& e) {
        // No plan fits with every block's activations kept: activation checkpointing, when it makes one fit.
        if (e.code() != error_code::out_of_memory || o.recompute != "auto" || o.model.recompute) throw;
        options checkpointed = o;
        checkpointed.model.recompute = true;
        const model_profile smaller = traced_model(checkpointed);
        auto fits = choose<plan_set>(smaller, machine);  // throws the same way when even that does not fit
        std::printf("activation checkpointing: on (no plan fits the device with every block's activations kept, "
                    "%s at their peak; recomputing each block in backward keeps %s)\n",
                    format_bytes(model.peak_activation_bytes()).c_str(),
                    format_bytes(smaller.peak_activation_bytes()).c_str());
        o.model.recompute = true;
        model = smaller;
        return fits;
      }
    }();
    plans = choice.plans;
    best = choice.index;
  } catch (const chunkwise::error& e) {
    if (e.code() != error_code::out_of_memory) throw;
    table_title();
    std::printf("%s\n", explain_table<plan_set>(evaluate<plan_set>(model, machine), std::nullopt).c_str());
    std::fflush(stdout);  // the table before the error, also when stdout is a file
    throw;
  }
  std::size_t chosen = best;
  if (!o.plan.empty()) {
    chosen = find_plan<plan_set>(o.plan);
    if (!plans[chosen].feasible) {
      table_title();
      std::printf("%s\n", explain_table<plan_set>(plans, std::nullopt).c_str());
      std::fflush(stdout);
      throw_error(error_code::out_of_memory, "--plan " + o.plan + " does not fit: it needs " +
                                                   format_bytes(plans[chosen].needed) + " of " +
                                                   std::string(to_string(plans[chosen].limit)) + ", the machine has " +
                                                   format_bytes(plans[chosen].available));
    }
  }
  table_title();
  std::printf("%s\n", explain_table<plan_set>(plans, chosen).c_str());
  dispatch<plan_set>(chosen, [&]<class Plan>(std::type_identity<Plan>) {
    print_choice<plan_set, Plan>(plans, chosen, best, !o.plan.empty(), machine.device_memory);
  });
  std::printf("\n");
  run_decision decision{.ok = true, .recompute = o.model.recompute, .plan = chosen,
                        .device_budget = machine.device_memory, .chosen = plans[chosen]};
  return decision;
}

int main(int argc, char** argv) {
  // OpenMP's default spin-waiting threads fight the runtime's own threads (communicator workers, the optimizer pool,
  // transfer movers) and any other process for the cores: measured here, a step took 10x longer. The wait policy is
  // read when the OpenMP runtime loads, so set it and start again (once; an explicit setting is kept).
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    ::setenv("OMP_WAIT_POLICY", "passive", 1);
    ::execv("/proc/self/exe", argv);  // returns only on failure: then run with the default policy
  }
#if CHUNKWISE_HAS_MPI
  std::optional<gpt2::process_world> processes;  // --comm mpi
#endif
  [[maybe_unused]] bool training = false;  // past planning: a process that fails now must end its peers (MPI)
  // The error, with the process's rank when there are several; a process failing mid-run ends the job.
  const auto fail = [&](const char* message) {
#if CHUNKWISE_HAS_MPI
    if (processes && processes->size() > 1) {
      std::fprintf(stderr, "train_gpt2 (rank %d of %d): %s\n", processes->rank(), processes->size(), message);
      if (training) processes->abort(2);
      return 2;
    }
#endif
    std::fprintf(stderr, "%s\n", message);
    return 2;
  };
  try {
    options o = parse(argc, argv);
    if (o.comm == "mpi" || o.comm == "nccl") {
#if CHUNKWISE_HAS_MPI
      if (o.ranks != 1)
        throw_error(error_code::invalid_argument, "--ranks counts thread ranks; under --comm " + o.comm +
                                                  " the launcher starts the ranks (mpirun -np N)");
#if !(CHUNKWISE_GPT2_CUDA && CHUNKWISE_HAS_NCCL)
      if (o.comm == "nccl")
        throw_error(error_code::unsupported, "--comm nccl: this train_gpt2 was built without CUDA and NCCL (the CUDA "
                                             "toolkit and NCCL were not found, or CHUNKWISE_CUDA=OFF)");
#endif
      processes.emplace(argc, argv);
      o.ranks = processes->size();
      o.ranks_here = processes->local_ranks();
#if CHUNKWISE_GPT2_CUDA
      if (o.comm == "nccl") gpt2::use_local_gpu(processes->local_rank());
#endif
#else
      throw_error(error_code::unsupported, "--comm " + o.comm + ": this train_gpt2 was built without MPI (install "
                                             "libopenmpi-dev and configure again)");
#endif
    }
    settle_batch(o);
    gpt2::compute_on_rank_cores(o.ranks_here);  // an MPI process's rank computes on this thread
    if (o.backend == "host") install_matmul_engine(o);
    if (o.backend == "cuda") {
#if CHUNKWISE_GPT2_CUDA
      gpt2::device_workspace probe(gpt2::model_config{});  // no usable GPU: a clear error here, before planning
#else
      throw_error(error_code::unsupported, "--backend cuda: this train_gpt2 was built without CUDA (the CUDA "
                                             "toolkit was not found, or CHUNKWISE_CUDA=OFF)");
#endif
    }
    // Rank 0 plans (a process per rank measuring the machine at once would measure the contention, and could
    // choose differently); the others take its decision.
    run_decision decision;
    planning_notes notes;  // rank 0's
    gpt2::machine_links links;  // one machine, unless processes say otherwise
#if CHUNKWISE_HAS_MPI
    if (processes) links = processes->measure_links();
    if (processes && processes->rank() != 0) {
      decision = processes->from_rank0(decision);
      if (!decision.ok) return 2;  // rank 0 says why
      o.model.recompute = decision.recompute;
    } else
#endif
    {
      try {
        decision = plan_the_run(o, links, notes);
      } catch (...) {
#if CHUNKWISE_HAS_MPI
        if (processes) processes->from_rank0(run_decision{});  // the others stop with rank 0
#endif
        throw;
      }
#if CHUNKWISE_HAS_MPI
      if (processes) processes->from_rank0(decision);
#endif
    }
    const model_profile model = traced_model(o);
    // --init-from: the imported parameters (read once per process, before the ranks start), else GPT-2's
    // initialisation.
    std::vector<std::vector<float>> imported;
    if (!o.init_from.empty()) imported = gpt2::llmc::read_checkpoint(o.init_from, o.model);
    const tensor_initializer initialize =
        imported.empty() ? gpt2::initializer(o.model, o.seed) : [&imported](std::uint32_t t, std::span<float> values) {
          std::copy(imported[t].begin(), imported[t].end(), values.begin());
        };
    const rank_setup setup{o, model, decision.device_budget, decision.chosen, initialize, notes};
    training = true;
    dispatch<gpt2::trainable_plans>(decision.plan, [&]<class Plan>(std::type_identity<Plan>) {
#if CHUNKWISE_HAS_MPI
#if CHUNKWISE_GPT2_CUDA && CHUNKWISE_HAS_NCCL
      if (processes && o.comm == "nccl") {
        // NCCL's communicator of the processes' GPUs, its unique id from rank 0 through MPI; the losses printed are
        // averaged over MPI (host values).
        auto training_comm = make_nccl_comm(processes->comm(), nullptr);
        return train_rank<Plan, gpt2::gpu_backend>(setup, training_comm, processes->comm());
      }
#endif
      if (processes) {
        // The training's own communicator, whose waits end after --comm-timeout with the peers' states.
        mpi_comm training_comm(processes->comm().native(),
                               std::chrono::milliseconds(static_cast<long long>(o.comm_timeout * 1000)));
        return train_rank<Plan, host_backend>(setup, training_comm, training_comm);
      }
#endif
      train_threads<Plan>(setup);
    });
    return 0;
  } catch (const chunkwise::error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {  // what the checks above did not foresee: still a message, never an abort
    return fail("train_gpt2: out of memory: an allocation failed (this shape, rank count or plan needs more memory "
                "than the machine has; try a shorter --context, a smaller --batch or fewer --ranks)");
  } catch (const std::exception& e) {  // a library's own error (Thrust's on a failed kernel): its text, exit 2
    return fail((std::string("train_gpt2: ") + e.what()).c_str());
  }
}
