#!/usr/bin/env bash
# The example trainer's speed beside the GEMM peak of the same BLAS and PyTorch's step, at the shape the trainer
# issue compares with llm.c (12 layers, 768 channels, 12 heads, byte vocabulary, batch 4, context 64, one rank, the
# resident plan, fp32), in one run. Not part of the tests.
#
#   bench/compare/trainer.sh [BUILD_DIR] [STEPS]        # BUILD_DIR: a Release build (default build/default), STEPS 6
#   LLMC_DIR=/path/to/llm.c bench/compare/trainer.sh    # and llm.c's CPU trainer (train_gpt2.c, its own Makefile)
#
# llm.c (optional, LLMC_DIR: a checkout of karpathy/llm.c): built with `make train_gpt2`, it starts from the
# gpt2_124M.bin our trainer writes at this shape (--save-llmc: the interop is part of what is measured) and reads the
# shipped text as byte-token shards where it looks for Tiny Shakespeare; its own loop prints each step's time (the
# median of its steps 1..STEPS is taken; its sampling at step 20, which needs GPT-2's tokenizer, is never reached).
# Ours: train_gpt2's median step (the first left out), and its GFLOP/s from the model's FLOP count (the profile's:
# forward and backward of every product and attention), with OpenBLAS's products (the GEMM peak's BLAS; the last
# line's); then, where the build has oneDNN, with its products in fp32 and under --dtype bf16 (bf16 operands).
# GEMM peak: the fastest of chunkwise_gemm_bench's products
# (OpenBLAS sgemm at the model's shapes, THREADS threads). PyTorch: bench/compare/trainer_torch.py (Hugging Face's
# GPT2LMHeadModel, fused AdamW) from the benches' virtual environment (tools/python-env.sh), skipped without torch.
# Last line:  trainer gflops=G fraction_of_gemm_peak=F
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build/default}
steps=${2:-6}
threads=${THREADS:-$(nproc)}
shape=(--layers 12 --channels 768 --heads 12 --context 64 --batch 4)
work=$(mktemp -d /tmp/chunkwise-trainer.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "== building train_gpt2 and chunkwise_gemm_bench in $build"
cmake --build "$build" -j2 --target train_gpt2 chunkwise_gemm_bench >/dev/null || { echo "build failed"; exit 1; }

echo "== GEMM: chunkwise_gemm_bench (the trainer's BLAS at its products)"
"$build/bench/chunkwise_gemm_bench" --benchmark_min_time=0.3 --benchmark_format=json >"$work/gemm.json" 2>/dev/null ||
  { echo "FAILED: chunkwise_gemm_bench"; exit 1; }
read -r gemm_peak gemm_label < <(python3 - "$work/gemm.json" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
best = max(runs, key=lambda r: r["GFLOP/s"])
print(f'{best["GFLOP/s"]:.2f} {best.get("label", "").replace(" ", "_")}')
PY
)
echo "gemm peak ${gemm_peak} GFLOP/s (${gemm_label//_/ }, $threads threads)"

# ours NAME ARGS...: train_gpt2 at the shape, resident plan; prints its median step in ms (its lines: $work/NAME.txt)
ours() {
  local name=$1
  shift
  OMP_NUM_THREADS=$threads "$build/examples/train_gpt2/train_gpt2" "${shape[@]}" --steps "$steps" --eval-every 1000000 \
    --plan min_waste/resident/replicated/follows_home --device-budget 0 "$@" >"$work/$name.txt" 2>&1 ||
    { tail -5 "$work/$name.txt" >&2; echo "FAILED: train_gpt2 $*" >&2; return 1; }
  grep -E "^matrix products|^compute:|^timing" "$work/$name.txt" >&2
  sed -n 's/^timing: median step \([0-9.]*\) ms.*/\1/p' "$work/$name.txt"
}
echo "== ours: train_gpt2 ${shape[*]}, resident plan, $steps steps, fp32 through the same BLAS"
ours_ms=$(ours ours --matmul blas) || exit 1
gflop_per_step=$(sed -n 's/.*, \([0-9.]*\) GFLOP per step per rank.*/\1/p' "$work/ours.txt" | head -1)
[[ -n $gflop_per_step && -n $ours_ms ]] || { echo "FAILED: no timing line from train_gpt2"; exit 1; }
# oneDNN's products where the build has them: fp32, and bf16 chunks with bf16 operands (AVX-512 BF16)
dnnl_ms="" bf16_ms=""
if grep -q "^CHUNKWISE_DNNL_LIBRARY:FILEPATH=/" "$build/CMakeCache.txt" 2>/dev/null; then
  echo "== ours: oneDNN's products, fp32 and --dtype bf16"
  dnnl_ms=$(ours dnnl --matmul dnnl) && bf16_ms=$(ours bf16 --matmul dnnl --dtype bf16) || dnnl_ms="" bf16_ms=""
else
  echo "== ours with oneDNN: skipped (this build found no oneDNN: libdnnl-dev)"
fi
tokens=$((4 * 64))

llmc_ms=""
if [[ -n ${LLMC_DIR:-} ]]; then
  echo "== llm.c: $LLMC_DIR/train_gpt2 (make train_gpt2), from our checkpoint of this shape"
  if make -C "$LLMC_DIR" train_gpt2 >/dev/null 2>&1; then
    mkdir -p "$work/llmc/dev/data/tinyshakespeare"
    OMP_NUM_THREADS=$threads "$build/examples/train_gpt2/train_gpt2" "${shape[@]}" --steps 1 --eval-every 1000000 \
      --plan min_waste/resident/replicated/follows_home --device-budget 0 --save-llmc "$work/llmc/gpt2_124M.bin" \
      >/dev/null 2>&1 || echo "FAILED: writing the llm.c checkpoint"
    python3 - "$root/examples/train_gpt2/data/kjv_genesis_exodus.txt" "$work/llmc/dev/data/tinyshakespeare" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
cut = len(data) * 9 // 10
for name, part in (("train", data[:cut]), ("val", data[cut:])):
    with open(f"{sys.argv[2]}/tiny_shakespeare_{name}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(part), *([0] * 253)))
        f.write(struct.pack(f"<{len(part)}H", *part))
PY
    # Stopped once it has printed step STEPS (its loop runs 40 steps and samples at step 20).
    (cd "$work/llmc" && OMP_NUM_THREADS=$threads exec timeout 600 "$LLMC_DIR/train_gpt2" >"$work/llmc.txt" 2>&1) &
    llmc_pid=$!
    while kill -0 "$llmc_pid" 2>/dev/null && ! grep -q "^step $steps:" "$work/llmc.txt" 2>/dev/null; do sleep 1; done
    kill "$llmc_pid" 2>/dev/null; wait "$llmc_pid" 2>/dev/null
    llmc_ms=$(python3 - "$work/llmc.txt" "$steps" <<'PY'
import re, statistics, sys
times = [float(m.group(2)) for m in re.finditer(r"step (\d+): train loss [0-9.]+ \(took ([0-9.]+) ms\)", open(sys.argv[1]).read())
         if 1 <= int(m.group(1)) <= int(sys.argv[2])]
print(f"{statistics.median(times):.1f}" if times else "")
PY
)
    grep -m2 -E "^step [01]:" "$work/llmc.txt" || true
    [[ -n $llmc_ms ]] || { echo "FAILED: no step times from llm.c"; tail -3 "$work/llmc.txt"; }
  else
    echo "FAILED: make train_gpt2 in $LLMC_DIR"
  fi
fi

torch_line=""
echo "== PyTorch: bench/compare/trainer_torch.py (the benches' virtual environment)"
if python=$("$root/tools/python-env.sh" 2>/dev/null); then
  torch_line=$("$python" "$root/bench/compare/trainer_torch.py" --steps "$steps" --threads "$threads" 2>/dev/null | tail -1)
  echo "${torch_line:-FAILED: trainer_torch.py}"
else
  echo "skipped: no Python with torch and transformers (tools/python-env.sh)"
fi

python3 - "$gflop_per_step" "$ours_ms" "$gemm_peak" "$tokens" "$torch_line" "$llmc_ms" "$dnnl_ms" "$bf16_ms" <<'PY'
import sys
gflop, ours_ms, peak, tokens, torch_line = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
llmc_ms = float(sys.argv[6]) if sys.argv[6] else None
others = [(name, float(ms)) for name, ms in (("ours, oneDNN fp32", sys.argv[7]), ("ours, oneDNN bf16", sys.argv[8])) if ms]
torch_s = float(torch_line.split()[1].split("=")[1]) if torch_line.startswith("torch median_step_s=") else None
ours_s = ours_ms / 1e3
gflops = gflop / ours_s
for name, ms in [("ours, OpenBLAS fp32", ours_ms)] + others:
    vs_torch = f"  (/ torch step time: {ms / 1e3 / torch_s:.2f})" if torch_s else ""
    print(f"{name:20s} {tokens / (ms / 1e3):9.1f} tokens/s  {gflop / (ms / 1e3):7.2f} GFLOP/s  step {ms:8.1f} ms{vs_torch}")
if torch_s:
    print(f"{'torch fp32':20s} {tokens / torch_s:9.1f} tokens/s  {gflop / torch_s:7.2f} GFLOP/s  step {torch_s * 1e3:8.1f} ms")
if llmc_ms:
    print(f"llm.c  {tokens / (llmc_ms / 1e3):9.1f} tokens/s  {gflop / (llmc_ms / 1e3):7.2f} GFLOP/s  step {llmc_ms:8.1f} ms"
          f"  (ours / llm.c step time: {ours_ms / llmc_ms:.2f})")
print(f"trainer gflops={gflops:.2f} fraction_of_gemm_peak={gflops / peak:.3f}")
PY
