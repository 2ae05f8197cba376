#!/usr/bin/env bash
# The pipeline's overlap, side by side in one run: the example trainer under the resident plan and under a streamed
# plan (cached<pinned_host>: every chunk's parameters fetched from pinned host homes through the device cache each
# step, Adam on the home) whose home tier is fast enough to hide the traffic; both again with --clip 1.0, which
# defers every update to step() (the global norm needs every gradient), to show what exact clipping costs.
# Usage: bench/compare/overlap.sh [BUILD_DIR=build/default] [STEPS=20] [RANKS=1] [train_gpt2 model flags...]
# ROUNDS (environment, default 3): runs per configuration, in alternating order; the median counts.
# The same for NVMe homes (cached<nvme>), where each update reads and writes the chunk's states on the store.
# Last line: overlap streamed_over_resident=R clipped_streamed_over_streamed=C clipped_nvme_over_nvme=N
# (goal: R <= 1.10; C and N: what exact clipping's deferred updates cost). The line before it gives the cost
# model's R for this machine: on the host backend the copies share the cores with compute and cannot all hide.
# The default shape (8 layers, 256 channels, 8 rows of 64 tokens) is one whose traffic a home can hide on this
# host: a step moves the parameters in and the gradients out (about 60 MiB) whatever the batch. On a GPU those are
# DMA beside the kernels; on the host backend they are memcpy on the cores the passes compute on, so on a 2-core
# machine their CPU time shows in the step unless compute dwarfs it. With 2 rows (the trainer's default) the copies
# are an eighth of the step or more, and R was 1.08-1.20 (predicted 1.10-1.29); with 8 rows a twentieth. BUDGET
# (environment, default 48MiB): the streamed plans' device budget per rank, half the default shape's training state,
# its activations (27 MiB) included; `BUDGET=32MiB overlap.sh build/default 20 1 --layers 8 --channels 256
# --batch 2` runs the 2-row shape.
# Step time: the trainer's median step after the first (cold) one; measured and predicted: medians over ROUNDS runs.
# Each run calibrates its compute rate (--recalibrate, not the cached one) and predicts its own step in its own
# process; the table's error is the median over rounds of (measured - predicted) / measured, each run against its own
# prediction, and the predicted R is the median over rounds of the ratio of the streamed and resident runs'
# predictions (run one after the other), as this machine's speed moves by 30-50% over tens of seconds: medians of
# predictions taken apart once gave 0.98.
set -euo pipefail
build="${1:-build/default}"
steps="${2:-20}"
ranks="${3:-1}"
shift $(( $# < 3 ? $# : 3 ))
(( $# > 0 )) || set -- --layers 8 --channels 256 --batch 8
trainer="$build/examples/train_gpt2/train_gpt2"
[[ -x "$trainer" ]] || { echo "overlap.sh: no $trainer; build the train_gpt2 target first" >&2; exit 2; }
export OMP_WAIT_POLICY=passive BUDGET="${BUDGET:-48MiB}"
python3 - "$trainer" "$steps" "$ranks" "$@" <<'PY'
import os, re, statistics, subprocess, sys
trainer, steps, ranks, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
# The resident plan with the machine's memory; the streamed one under BUDGET, so its cache holds only some of the
# chunks. Every configuration recomputes its blocks' activations in backward, as the streamed ones must to fit
# BUDGET, so the ratios compare the chunks' traffic and not activation checkpointing's extra forward (a third more
# compute).
same_activations = ["--recompute", "on"]
resident = same_activations + ["--device-budget", "0", "--plan", "min_waste/resident/replicated/follows_home"]
streamed_budget = same_activations + ["--device-budget", os.environ["BUDGET"]]
streamed = streamed_budget + ["--plan", "min_waste/cached<pinned_host>/sharded/follows_home"]
# NVMe homes: each update reads and writes its chunk's states on the store, beside backward or (clipping) after it.
nvme = streamed_budget + ["--plan", "min_waste/cached<nvme>/sharded/follows_home"]
configs = [
    ("resident", resident),
    ("streamed", streamed),
    ("resident, clip 1.0", resident + ["--clip", "1.0"]),
    ("streamed, clip 1.0", streamed + ["--clip", "1.0"]),
    ("nvme", nvme),
    ("nvme, clip 1.0", nvme + ["--clip", "1.0"]),
]
rounds = int(os.environ.get("ROUNDS", "3"))
samples = {name: [] for name, _ in configs}
predictions = {name: [] for name, _ in configs}  # each run calibrates its compute rate: medians, as the steps
moved = {}
for r in range(rounds):
    for name, flags in (configs if r % 2 == 0 else list(reversed(configs))):
        out = subprocess.run([trainer, "--steps", steps, "--eval-every", steps, "--ranks", ranks, "--recalibrate"]
                             + flags + extra, capture_output=True, text=True, check=True).stdout
        samples[name].append(float(re.search(r"median step ([0-9.]+) ms", out).group(1)))
        predictions[name].append(float(re.search(r"\(predicted ([0-9.]+) ms\)", out).group(1)))
        moved[name] = re.search(r"^moved \(rank 0, [0-9]+ steps\): (.*)$", out, re.M).group(1)
        stall = re.search(r"stalled ([0-9.]+ ms)", out)
        if stall: moved[name] += f"; cache stalled {stall.group(1)}"
        drive = re.search(r"the drive ran at ([0-9.]+x) the predicted rate", out)
        if drive: moved[name] += f"; drive at {drive.group(1)} the predicted rate"
median = {name: statistics.median(v) for name, v in samples.items()}
predicted = {name: statistics.median(v) for name, v in predictions.items()}
error = {name: statistics.median((m - p) / m for m, p in zip(samples[name], predictions[name])) for name in samples}
print(f"{'configuration':22s} {'median step ms':>15s} {'predicted':>10s} {'error':>7s}  moved (rank 0, whole run)")
for name, _ in configs:
    print(f"{name:22s} {median[name]:15.1f} {predicted[name]:10.1f} {error[name]:7.1%}  {moved[name]}")
    print(f"{'':22s} rounds (predicted/measured ms): "
          + " ".join(f"{p:.1f}/{m:.1f}" for p, m in zip(predictions[name], samples[name])))
# What the cost model says the streamed plan costs over the resident one on this machine: on the host backend the
# copies run on the cores the passes compute on, so only a machine whose copies are DMA (a GPU's) can hide them all.
paired = statistics.median(s / r for s, r in zip(predictions["streamed"], predictions["resident"]))
print(f"predicted streamed_over_resident={paired:.3f}")
print(f"overlap streamed_over_resident={median['streamed'] / median['resident']:.3f} "
      f"clipped_streamed_over_streamed={median['streamed, clip 1.0'] / median['streamed']:.3f} "
      f"clipped_nvme_over_nvme={median['nvme, clip 1.0'] / median['nvme']:.3f}")
PY
