#!/usr/bin/env bash
# Our CPU AdamW beside the memory bandwidth, DeepSpeed's DeepSpeedCPUAdam and torch.optim.AdamW (foreach and
# fused; the faster counts), on the same parameter count and thread count, in one run. Not part of the tests.
#
#   bench/compare/cpu_adam.sh                 # 64 Mi parameters (1 GiB per fp32 array: far beyond the caches)
#   PARAMS=268435456 THREADS=1 ROUNDS=2 bench/compare/cpu_adam.sh
#
# Every contender is timed the same way: single steps, best of all, over ROUNDS interleaved rounds (ours, then each
# peer), so a burst of load from other processes on a shared machine does not favour whoever ran in a quiet moment.
#
# PyTorch and DeepSpeed come from the tests' and benches' one virtual environment (tools/python-env.sh: outside the
# checkout, $CHUNKWISE_VENV or ~/.cache/chunkwise/venv; torch the first time, DeepSpeed added on demand).
# DeepSpeed's CPUAdam JIT-builds a C++ extension (ninja, g++). Last line:
#   cpu_adam ratio_vs_bandwidth=B speedup_vs_deepspeed=D speedup_vs_torch=T
# B = our AdamW at 28 bytes per parameter / in-place read-modify-write bandwidth (x += s*y), same size and threads.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
params=${PARAMS:-67108864}
threads=${THREADS:-$(nproc)}
steps=${STEPS:-4}
rounds=${ROUNDS:-3}
work=$(mktemp -d /tmp/chunkwise-cpu-adam.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "== building chunkwise_optim_bench in $build"
if [[ ! -f $build/build.ninja && ! -f $build/Makefile ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHUNKWISE_BUILD_EXAMPLES=OFF >/dev/null || exit 1
fi
cmake --build "$build" -j2 --target chunkwise_optim_bench >/dev/null || { echo "build failed"; exit 1; }

echo "== peers' virtual environment (tools/python-env.sh)"
have_python=1
if ! python=$("$root/tools/python-env.sh"); then
  echo "FAILED: no Python with torch (tools/python-env.sh); PyTorch and DeepSpeed are not compared"
  have_python=0
elif ! "$root/tools/python-env.sh" ninja packaging psutil py-cpuinfo deepspeed >/dev/null; then
  echo "FAILED: pip install deepspeed; DeepSpeed is not compared"
fi

: >"$work/peers.jsonl"
for ((round = 1; round <= rounds; ++round)); do
  echo "== round $round/$rounds: chunkwise AdamW, triad and read-modify-write ($params parameters, $threads threads)"
  CHUNKWISE_BENCH_PARAMS=$params CHUNKWISE_BENCH_THREADS=$threads CHUNKWISE_BENCH_ITERATIONS=1 \
    "$build/bench/chunkwise_optim_bench" \
    --benchmark_filter='^(adamw_fp32|adamw_bf16_copy|rmw_bandwidth|triad_bandwidth)/' \
    --benchmark_repetitions=$((steps + 1)) --benchmark_out="$work/bench.$round.json" \
    --benchmark_out_format=json >/dev/null 2>"$work/bench.err" || { cat "$work/bench.err"; exit 1; }
  ((have_python)) || continue
  for peer in torch_foreach torch_fused deepspeed; do
    # DeepSpeed JIT-builds its extension once (cached under ~/.cache/torch_extensions); MAX_JOBS keeps it gentle.
    MAX_JOBS=2 "$python" "$root/bench/compare/cpu_adam_peers.py" "$peer" --params "$params" \
      --threads "$threads" --steps "$steps" >"$work/$peer.out" 2>"$work/$peer.err"
    if grep -q '^{' "$work/$peer.out"; then
      grep '^{' "$work/$peer.out" | tail -1 | tee -a "$work/peers.jsonl"
    else
      echo "{\"name\": \"$peer\", \"error\": \"exited without a result\"}" | tee -a "$work/peers.jsonl"
    fi
    if grep -q '"error"' "$work/$peer.out" 2>/dev/null || ! grep -q '^{' "$work/$peer.out"; then
      echo "   $peer failed; its last stderr lines:"
      tail -n 15 "$work/$peer.err" | sed 's/^/   | /'
    fi
  done
done

python3 "$root/bench/compare/cpu_adam_summary.py" "$params" "$threads" "$work/peers.jsonl" "$work"/bench.*.json
