#!/usr/bin/env bash
# Runs the example trainer for a fixed number of steps under every feasible plan and under the automatic choice,
# in one run, and compares the cost model's predicted step time with the measured one.
# Usage: bench/compare/plans.sh [BUILD_DIR=build/default] [STEPS=60] [RANKS=1] [train_gpt2 model and budget flags...]
# ROUNDS (environment, default 3): runs per plan, in alternating order; the median counts.
# Prints a table (plan, predicted step s, measured step s, error) and as its last line
#   plans max_prediction_error=E regret=R
# Each run calibrates its compute rate and predicts in its own process; the predictions are medians over rounds too.
# E: the largest |measured - predicted| / measured; R: the chosen plan's measured step time over the fastest
# measured, minus 1. Measured step time: the trainer's median step after the first (cold) one, the median over rounds.
set -euo pipefail
build="${1:-build/default}"
steps="${2:-60}"
ranks="${3:-1}"
shift $(( $# < 3 ? $# : 3 ))
# Without extra flags: the tiny model with the machine's memory, where every plan fits and can be compared (the
# trainer's own default budget is chosen so that only streaming plans fit).
(( $# > 0 )) || set -- --device-budget 0 --layers 2 --channels 64 --batch 4
trainer="$build/examples/train_gpt2/train_gpt2"
[[ -x "$trainer" ]] || { echo "plans.sh: no $trainer; build the train_gpt2 target first" >&2; exit 2; }

export OMP_WAIT_POLICY=passive
explain="$("$trainer" --steps 1 --eval-every 1 --ranks "$ranks" "$@" 2>/dev/null)"
python3 - "$trainer" "$steps" "$ranks" "$explain" "$@" <<'PY'
import re, subprocess, sys
trainer, steps, ranks, explain, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
seconds = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
plans, chosen = [], None
for line in explain.splitlines():
    m = re.match(r"^([* ]) (\S+/\S+/\S+/\S+)\s+([0-9.]+) (s|ms|us)\s", line)
    if m:
        plans.append((m.group(2), float(m.group(3)) * seconds[m.group(4)]))
        if m.group(1) == "*":
            chosen = m.group(2)
import os, statistics
rounds = int(os.environ.get("ROUNDS", "3"))
samples = {name: [] for name, _ in plans}
predictions = {name: [] for name, _ in plans}
for round_ in range(rounds):
    for name, _ in (plans if round_ % 2 == 0 else reversed(plans)):
        out = subprocess.run([trainer, "--plan", name, "--steps", str(steps), "--eval-every", str(steps), "--ranks",
                              str(ranks)] + extra, capture_output=True, text=True, check=True).stdout
        samples[name].append(float(re.search(r"median step ([0-9.]+) ms", out).group(1)) * 1e-3)
        # The run's own prediction: each run calibrates the compute rate in its own process, as it measures.
        m = re.search(r"^[* ] " + re.escape(name) + r"\s+([0-9.]+) (s|ms|us)\s", out, re.M)
        predictions[name].append(float(m.group(1)) * seconds[m.group(2)])
rows = []
for name, _ in plans:
    measured = statistics.median(samples[name])
    predicted = statistics.median(predictions[name])
    rows.append((name, predicted, measured, abs(measured - predicted) / measured))
print(f"{'plan':58s} {'predicted s':>12s} {'measured s':>12s} {'error':>7s}")
for name, predicted, measured, error in rows:
    mark = "*" if name == chosen else " "
    print(f"{mark}{name:57s} {predicted:12.5f} {measured:12.5f} {error:7.1%}")
fastest = min(r[2] for r in rows)
chosen_measured = [r[2] for r in rows if r[0] == chosen][0]
print(f"plans max_prediction_error={max(r[3] for r in rows):.3f} regret={chosen_measured / fastest - 1:.3f}")
PY
