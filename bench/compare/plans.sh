#!/usr/bin/env bash
# Runs the example trainer for a fixed number of steps under every feasible plan and under the automatic choice,
# in one run, and compares the cost model's predicted step time with the measured one.
# Usage: bench/compare/plans.sh [BUILD_DIR=build/default] [STEPS=60] [RANKS=settings] [train_gpt2 flags...]
#   RANKS settings (the default): four settings, each printing its own `plans` line, then a last line with the worst
#     of each figure: the tiny model with every plan fitting at 1, 2 and 4 thread ranks, and the trainer's default
#     model under its default device budget (32 MiB), where only plans that stream fit;
#   RANKS N: one setting, N thread ranks, with the flags given (default: the tiny model, every plan fitting).
# ROUNDS (environment, default 5): runs per plan, in alternating order; the median counts (a process now and then
#   runs its loops 30% slower throughout, calibration included: its own prediction follows, a regret would not).
# Per setting: a table (plan, predicted step s, measured step s, error) and the line
#   plans <setting> max_prediction_error=E regret=R
# and with RANKS settings, last:
#   plans worst max_prediction_error=E regret=R
# Each run calibrates its compute rate (--recalibrate, not the cached one) and collective cost and predicts its own
# step, in its own process. Measured step time: the trainer's median step after the first (cold) one. The figures
# pair what was measured together, as this machine's speed moves by 30-50% over tens of seconds (2 ranks: one
# round's processes predicted and measured 12.4/11.9 ms, the next round's 19.2/19.2):
#   E: the largest over plans of |median over rounds of (measured - predicted) / measured|, each run against its
#      own prediction (medians of predictions and of measurements taken apart would pair a slow phase's prediction
#      with a fast phase's step);
#   R: the chosen plan's median step over the fastest plan's, minus 1 (pairing rounds did not help here: a phase
#      can turn within a round).
# The table's predicted and measured columns are the medians over rounds. Thread ranks on a machine with fewer cores
# share them (4 ranks on 2 cores: each gets half).
set -euo pipefail
build="${1:-build/default}"
steps="${2:-60}"
ranks="${3:-settings}"
shift $(( $# < 3 ? $# : 3 ))
trainer="$build/examples/train_gpt2/train_gpt2"
[[ -x "$trainer" ]] || { echo "plans.sh: no $trainer; build the train_gpt2 target first" >&2; exit 2; }
tiny=(--device-budget 0 --layers 2 --channels 128 --batch 4)
export OMP_WAIT_POLICY=passive

compare() {  # compare NAME RANKS STEPS FLAGS...: one setting's table and plans line
  local name="$1" ranks="$2" steps="$3"
  shift 3
  local explain
  explain="$("$trainer" --steps 1 --eval-every 1 --ranks "$ranks" "$@" 2>/dev/null)"
  python3 - "$trainer" "$name" "$steps" "$ranks" "$explain" "$@" <<'PY'
import os, re, statistics, subprocess, sys
trainer, name, steps, ranks, explain, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6:]
seconds = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
plans, chosen = [], None
for line in explain.splitlines():
    m = re.match(r"^([* ]) (\S+/\S+/\S+/\S+)\s+([0-9.]+) (s|ms|us)\s", line)
    if m:
        plans.append(m.group(2))
        if m.group(1) == "*":
            chosen = m.group(2)
rounds = int(os.environ.get("ROUNDS", "5"))
samples = {plan: [] for plan in plans}
predictions = {plan: [] for plan in plans}
for round_ in range(rounds):
    for plan in (plans if round_ % 2 == 0 else reversed(plans)):
        out = subprocess.run([trainer, "--plan", plan, "--steps", str(steps), "--eval-every", str(steps), "--ranks",
                              ranks, "--recalibrate"] + extra, capture_output=True, text=True, check=True).stdout
        samples[plan].append(float(re.search(r"median step ([0-9.]+) ms", out).group(1)) * 1e-3)
        # The run's own prediction: each run calibrates in its own process (--recalibrate, not the cached rate), as
        # it measures.
        m = re.search(r"^[* ] " + re.escape(plan) + r"\s+([0-9.]+) (s|ms|us)\s", out, re.M)
        predictions[plan].append(float(m.group(1)) * seconds[m.group(2)])
rows = []
for plan in plans:
    measured = statistics.median(samples[plan])
    predicted = statistics.median(predictions[plan])
    # Each run against its own prediction, then the median over rounds (signed: a bias shows, phases cancel).
    error = statistics.median((m - p) / m for m, p in zip(samples[plan], predictions[plan]))
    rows.append((plan, predicted, measured, abs(error)))
print(f"\n{name}")
print(f"{'plan':58s} {'predicted s':>12s} {'measured s':>12s} {'error':>7s}   rounds (predicted/measured ms)")
for plan, predicted, measured, error in rows:
    mark = "*" if plan == chosen else " "
    pairs = " ".join(f"{p * 1e3:.1f}/{m * 1e3:.1f}" for p, m in zip(predictions[plan], samples[plan]))
    print(f"{mark}{plan:57s} {predicted:12.5f} {measured:12.5f} {error:7.1%}   {pairs}")
fastest = min(r[2] for r in rows)
regret = [r[2] for r in rows if r[0] == chosen][0] / fastest - 1
print(f"plans {name} max_prediction_error={max(r[3] for r in rows):.3f} regret={regret:.3f}")
PY
}

if [[ "$ranks" != settings ]]; then
  (( $# > 0 )) || set -- "${tiny[@]}"
  compare "ranks=$ranks" "$ranks" "$steps" "$@"
  exit 0
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for r in 1 2 4; do
  compare "ranks=$r,every-plan-fits" "$r" "$steps" "${tiny[@]}" "$@" | tee -a "$log"
done
# The default model streams under the default budget; its steps are ~10x the tiny model's, so a third as many.
compare "ranks=1,streaming(32MiB)" 1 "$(( steps / 3 > 5 ? steps / 3 : 5 ))" "$@" | tee -a "$log"
python3 - "$log" <<'PY'
import re, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("plans ")]
errors = [float(re.search(r"max_prediction_error=([0-9.]+)", l).group(1)) for l in lines]
regrets = [float(re.search(r"regret=(-?[0-9.]+)", l).group(1)) for l in lines]
print(f"\nplans worst max_prediction_error={max(errors):.3f} regret={max(regrets):.3f}")
PY
