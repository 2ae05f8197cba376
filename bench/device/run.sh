#!/usr/bin/env bash
# The GPU session's one prepared check: build with CUDA, run the CUDA tests (tiers, collectives over NCCL, the fused
# Adam kernel, measurement, the trainer's cuBLAS engine), then time the example trainer with its matrix products on
# the CPU and through cuBLAS (--backend cuda), side by side, and report tokens/s and model FLOPs utilisation.
# Usage: bench/device/run.sh [OUT_DIR=$OUT or /tmp/chunkwise-device]   (on the device machine: `bash bench/device/run.sh`)
# MFU = the model's FLOPs per step (the traced profile's count) / the median step time / PEAK_FLOPS (default: H200's
# dense fp32 peak without tensor cores, 67e12; the products run in fp32, CUBLAS_DEFAULT_MATH).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-/tmp/chunkwise-device}}"
mkdir -p "$out"
peak="${PEAK_FLOPS:-67e12}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt" || true

cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHUNKWISE_CUDA=ON -DCHUNKWISE_BUILD_BENCH=OFF \
  > "$out/configure.log" 2>&1
cmake --build build/device -j"$(nproc)" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
ctest --test-dir build/device -R '^cuda_' --output-on-failure 2>&1 | tee "$out/cuda_tests.log"

# A GPT-2 small enough for a minute per backend, large enough that the products dominate: 6 layers, 512 channels.
model=(--layers 6 --channels 512 --heads 8 --context 256 --batch 8 --steps 12 --eval-every 1000 --device-budget 0)
for backend in host cuda; do
  OMP_NUM_THREADS="$(nproc)" build/device/examples/train_gpt2/train_gpt2 --backend "$backend" "${model[@]}" \
    > "$out/train_$backend.log" 2>&1 || { tail -20 "$out/train_$backend.log"; exit 1; }
done
python3 - "$out" "$peak" <<'PY'
import re, sys
out, peak = sys.argv[1], float(sys.argv[2])
steps = {}
for backend in ("host", "cuda"):
    text = open(f"{out}/train_{backend}.log").read()
    step = float(re.search(r"median step ([0-9.]+) ms", text).group(1)) * 1e-3
    flops = float(re.search(r"([0-9.]+) GFLOP per step", text).group(1)) * 1e9
    tokens = int(re.search(r"context (\d+), batch (\d+)", text).group(1)) * int(re.search(r"batch (\d+) per rank", text).group(1))
    loss = float(re.findall(r"loss ([0-9.]+)", text)[-1])
    steps[backend] = step
    print(f"{backend:5s} median step {step*1e3:9.2f} ms  {tokens/step:10.0f} tokens/s  {flops/step/1e9:9.2f} GFLOP/s  "
          f"mfu {flops/step/peak:.5f}  final loss {loss:.4f}")
print(f"device cuda_over_host_speedup={steps['host'] / steps['cuda']:.2f}")
PY
