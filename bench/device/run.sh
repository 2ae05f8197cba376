#!/usr/bin/env bash
# The GPU session's one prepared check, for a bare H200 machine that reaches no network: build with CUDA, run the
# CUDA tests under compute-sanitizer's memcheck, then GPT-2 at the 124M shape (12 layers, 768 channels, 12 heads,
# GPT-2's 50257 tokens padded to 50304, context 256, batch 4):
#   1. the loss after 4 steps, train_gpt2 --backend cuda (resident, and streamed under a 2 GiB device budget, below
#      its 3.3 GB of training state and activations) against --backend host: relative difference;
#   2. tokens/s and model FLOPs utilisation of --backend cuda, beside PyTorch on the same GPU (Hugging Face's
#      GPT2LMHeadModel with fused AdamW, and FSDP with CPU offload), in this one run: fp32 at that shape (and FSDP
#      with CPU offload against the streamed run), and bf16 at the throughput shape, batch 32 at context 256.
#   3. the row kernels (one warp per row) against the staged functors they replaced, side by side on the GPU
#      (gpt2_row_kernels_bench, bench/device/row_kernels.cu), and the products four ways: fp32, cuBLAS's fast bf16 on
#      fp32 operands (--dtype bf16 now), bf16 operands, and bf16 operands rounded first (gpt2_products_bench).
# Last line: device mfu=M tokens_per_s=T speedup_vs_torch=A speedup_vs_fsdp_offload=B loss_rel_diff=D
# mfu, tokens_per_s and speedup_vs_torch: --dtype bf16 (bf16 tensor-core products) at the throughput shape against
# the bf16 dense peak (790e12, BF16_PEAK_FLOPS) and PyTorch's bf16 autocast there; speedup_vs_fsdp_offload: the
# streamed fp32 run against FSDP with CPU offload. Lines before it give fp32's MFU against the dense fp32 peak
# without tensor cores (67e12, PEAK_FLOPS) and bf16's at the small shape.
#
# What the machine lacks travels with the working tree, made by bench/device/prepare.sh on a workstation: Debian's
# doctest-dev and nlohmann-json3-dev as .deb files in .device-debs/, unpacked into a prefix the build finds, and a
# build for sm_90 in .device-carry/ (train_gpt2, the tests, the libraries they link in lib/) that saves the compile
# there; one built from other sources (its SOURCES fingerprint, sources_fingerprint.sh) or that does not start there
# is ignored. NCCL from the toolkit, else from PyTorch's wheel.
#   run(command="bash bench/device/run.sh", carry=[".device-carry", ".device-debs"], timeout_s=540)
# Usage (on the device machine): bash bench/device/run.sh [OUT_DIR=$OUT or /tmp/chunkwise-device]
# MEMCHECK_TESTS="..." names the CUDA tests to run under memcheck (default: all, none under QUICK=1); DEADLINE_S (500)
# ends memcheck. QUICK=1 builds and tests only the trainer's device passes.
# memcheck reports memory errors only (--report-api-errors no): NCCL probes its kernels with calls that fail.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-/tmp/chunkwise-device}}"
mkdir -p "$out"
logs=/tmp/chunkwise-device-logs
rm -rf "$logs" && mkdir -p "$logs"
peak="${PEAK_FLOPS:-67e12}"
export PATH="/usr/local/cuda/bin:$PATH"
started=$(date +%s)
stamp() { echo "[$(( $(date +%s) - started )) s] $*"; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc; g++ --version | head -1; nvcc --version | tail -2; cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__)'
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

# The summary (its last line the issue's) from the logs so far; runs not made yet print as nan.
summarize() {
  python3 - "$logs" "$peak" "${BF16_PEAK_FLOPS:-790e12}" > "$logs/summary.txt" 2>&1 <<'PY'
import re, sys
logs, peak, bf16_peak = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def read(name):
    try: return open(f"{logs}/{name}").read()
    except OSError: return ""
def loss_at(text, step):
    m = re.search(rf"step +{step}/\d+ +loss ([0-9.]+)", text)
    return float(m.group(1)) if m else float("nan")
def median_ms(text):
    m = re.search(r"median step ([0-9.]+) ms", text)
    return float(m.group(1)) if m else float("nan")
cuda, streamed, host, torch = read("train_cuda.log"), read("train_cuda_streamed.log"), read("train_host.log"), read("torch.log")
mirror, bf16 = read("train_cuda_mirror.log"), read("train_cuda_bf16.log")
fp16, host_fp16 = read("train_cuda_fp16.log"), read("train_host_fp16.log")
def flops_of(text):
    m = re.search(r"([0-9.]+) GFLOP per step", text)
    return float(m.group(1)) * 1e9 if m else float("nan")
flops = flops_of(cuda)
tokens = 4 * 256
host_loss = loss_at(host, 4)
diffs = [abs(loss_at(t, 4) - host_loss) / host_loss for t in (cuda, streamed)]
print(f"loss at step 4: host {host_loss:.6f}, cuda {loss_at(cuda, 4):.6f}, cuda streamed {loss_at(streamed, 4):.6f}, "
      f"cuda with host chunks {loss_at(mirror, 4):.6f}")
print(f"chunks in GPU memory: median step {median_ms(cuda):.1f} ms; host chunks and a device mirror: "
      f"{median_ms(mirror):.1f} ms")
step = median_ms(cuda) * 1e-3
tps = tokens / step
streamed_tps = tokens / (median_ms(streamed) * 1e-3)
def torch_tps(mode):
    m = re.search(rf"torch {mode} tokens_per_s=([0-9.]+)", torch)
    return float(m.group(1)) if m else float("nan")
print(f"cuda: median step {step*1e3:.1f} ms, {tps:.0f} tokens/s, {flops/step/1e12:.3f} TFLOP/s; streamed "
      f"{streamed_tps:.0f} tokens/s; host median step {median_ms(host):.0f} ms; torch plain {torch_tps('plain'):.0f}, "
      f"fsdp_offload {torch_tps('fsdp_offload'):.0f} tokens/s")
bf16_step = median_ms(bf16) * 1e-3
print(f"bf16 (chunks and tensor-core products): median step {bf16_step*1e3:.1f} ms, {tokens/bf16_step:.0f} tokens/s, "
      f"mfu {flops/bf16_step/bf16_peak:.4f} of the bf16 dense peak; loss at step 4 {loss_at(bf16, 4):.6f}")
print(f"fp16 (chunks, loss scaling): loss at step 4 {loss_at(fp16, 4):.6f}, host {loss_at(host_fp16, 4):.6f}; "
      f"median step {median_ms(fp16):.1f} ms")
print(f"fp32: mfu {flops/step/peak:.4f} of the fp32 peak, speedup vs torch plain {tps/torch_tps('plain'):.3f}")
wide, torch_wide = read("train_cuda_bf16_wide.log"), read("torch_wide.log")
wide_step = median_ms(wide) * 1e-3
wide_tps = 32 * 256 / wide_step
wide_mfu = flops_of(wide) / wide_step / bf16_peak
m = re.search(r"torch plain tokens_per_s=([0-9.]+)", torch_wide)
torch_wide_tps = float(m.group(1)) if m else float("nan")
print(f"throughput shape (bf16, batch 32, context 256): median step {wide_step*1e3:.1f} ms, {wide_tps:.0f} tokens/s, "
      f"mfu {wide_mfu:.4f} of the bf16 dense peak; torch bf16 autocast {torch_wide_tps:.0f} tokens/s")
print(f"device mfu={wide_mfu:.4f} tokens_per_s={wide_tps:.0f} speedup_vs_torch={wide_tps/torch_wide_tps:.3f} "
      f"speedup_vs_fsdp_offload={streamed_tps/torch_tps('fsdp_offload'):.3f} loss_rel_diff={max(diffs):.2e}")
PY
}
# What comes back from $out (at most 8 files): the summary, the tests' verdicts and logs, the runs' logs, the build's.
publish() {
  summarize
  cp "$logs/summary.txt" "$out/"
  [ -f "$logs/tests.txt" ] && cp "$logs/tests.txt" "$out/"
  for f in "$logs"/chunkwise_cuda_*.log "$logs"/memcheck_*.log "$logs/gpt2_device_host.log"; do
    [ -f "$f" ] && { echo "== $f"; cat "$f"; }
  done > "$out/tests.log"
  for f in "$logs"/train_*.log "$logs/torch.log" "$logs/torch_wide.log"; do
    [ -f "$f" ] && { echo "== $f"; cat "$f"; }
  done > "$out/runs.log"
  [ -f "$logs/build.log" ] && tail -c 200000 "$logs/build.log" > "$out/build.log"
  return 0
}

prefix=/tmp/chunkwise-prefix
mkdir -p "$prefix"
if compgen -G '.device-debs/*.deb' > /dev/null; then
  for deb in .device-debs/*.deb; do dpkg -x "$deb" "$prefix"; done
else
  echo "run.sh: no .device-debs/*.deb (where Debian's registry is reachable: mkdir -p .device-debs && cd .device-debs" \
       "&& apt-get download doctest-dev nlohmann-json3-dev; then carry .device-debs); trying the system's" >&2
fi
# Debian's doctest config names /usr as its prefix: point it at the unpacked one.
doctest_targets="$prefix/usr/lib/cmake/doctest/doctestTargets.cmake"
[ -f "$doctest_targets" ] && sed -i "s|set(_IMPORT_PREFIX \"/usr\")|set(_IMPORT_PREFIX \"$prefix/usr\")|" "$doctest_targets"
nccl=()
if [ ! -f /usr/local/cuda/include/nccl.h ]; then
  nccl_root=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  if [ -n "$nccl_root" ] && [ -f "$nccl_root/include/nccl.h" ]; then
    [ -e "$nccl_root/lib/libnccl.so" ] || ln -sf "$nccl_root/lib/libnccl.so.2" "$nccl_root/lib/libnccl.so"
    nccl=(-DNCCL_ROOT="$nccl_root"); export LD_LIBRARY_PATH="$nccl_root/lib:${LD_LIBRARY_PATH:-}"
  else
    nccl=(-DCHUNKWISE_NCCL=OFF)
  fi
fi
# A build carried from a workstation with the same toolkit (.device-carry, sm_90; its libraries in lib/) saves this
# machine the compile; where it was built from other sources (its SOURCES fingerprint differs from these), or does
# not start here (other system libraries), build here.
bin=build/device
export LD_LIBRARY_PATH="$PWD/.device-carry/lib:${LD_LIBRARY_PATH:-}"
sources=$(bash bench/device/sources_fingerprint.sh) carried=
if [ -x .device-carry/examples/train_gpt2/train_gpt2 ]; then
  if [ "$(cat .device-carry/SOURCES 2>/dev/null)" != "$sources" ]; then
    stamp "the carried build is from other sources (SOURCES $(cat .device-carry/SOURCES 2>/dev/null || echo none)," \
          "these $sources): building here"
  elif .device-carry/examples/train_gpt2/train_gpt2 --help > "$logs/carried.log" 2>&1; then
    carried=1
  fi
fi
if [ -n "$carried" ]; then
  bin=.device-carry
  targets=$(cd .device-carry/tests/cuda 2>/dev/null && ls chunkwise_cuda_*_test 2>/dev/null | tr '\n' ' ')
  [ -n "${QUICK:-}" ] && targets=chunkwise_cuda_gpt2_device_test
  stamp "the carried build: train_gpt2, $targets"
else
  stamp "configure (NCCL: ${nccl[*]:-toolkit})"
  cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHUNKWISE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCHUNKWISE_BUILD_BENCH=OFF -DCHUNKWISE_MPI=OFF -DCHUNKWISE_URING=OFF -DCMAKE_PREFIX_PATH="$prefix/usr" \
    "${nccl[@]}" > "$logs/configure.log" 2>&1 ||
    { tail -30 "$logs/configure.log"; cp "$logs/configure.log" "$out/"; exit 1; }
  targets=$(ninja -C build/device -t targets all | grep -o '^chunkwise_cuda_[a-z0-9_]*_test' | sort -u | tr '\n' ' ')
  # QUICK=1: the trainer's passes only (their test, the runs, PyTorch), for a short device call
  [ -n "${QUICK:-}" ] && targets=chunkwise_cuda_gpt2_device_test
  stamp "build train_gpt2 chunkwise_gpt2_device_test $targets"
  ninja -C build/device -j"$(nproc)" train_gpt2 gpt2_row_kernels_bench gpt2_products_bench chunkwise_gpt2_device_test \
    $targets \
    > "$logs/build.log" 2>&1 ||
    { grep -B2 -A12 -m3 'error' "$logs/build.log" | head -80; cp "$logs/build.log" "$out/"; exit 1; }
fi

# Plain runs first (the quick verdict), memcheck last and only while the deadline allows (one device call). Every
# run's timeout is its own cap or what is left before END_S (530 s after the start, inside the call's 540), whichever
# is less, and what has been measured goes to $out after every stage (publish): a call stopped at its limit still
# brings back all it measured.
deadline=$(( started + ${DEADLINE_S:-500} ))
end=$(( started + ${END_S:-530} ))
# seconds a step may take: its cap, or what is left before the end (less a margin to publish); 0 when too little is
left_for() {
  local left=$(( end - $(date +%s) - 10 ))
  (( left > $1 )) && left=$1
  (( left < 15 )) && left=0
  echo $left
}
# bounded CAP command...: the command under `timeout` for left_for CAP seconds; rc 124 at once where none are left
# (timeout 0 would mean no limit)
bounded() {
  local limit; limit=$(left_for "$1"); shift
  if (( limit == 0 )); then echo "skipped: past the end (END_S)"; return 124; fi
  timeout "$limit" "$@"
}
stamp "CUDA tests"
for test in $targets; do
  bounded 90 "$bin/tests/cuda/$test" > "$logs/$test.log" 2>&1; rc=$?
  case $rc in 0) echo "PASS $test" ;; 77) echo "SKIP $test (no usable GPU)" ;;
              *) echo "FAIL $test (rc $rc)"; tail -25 "$logs/$test.log" ;; esac
done | tee "$logs/tests.txt"
if bounded 120 env OMP_NUM_THREADS=8 $bin/tests/chunkwise_gpt2_device_test > "$logs/gpt2_device_host.log" 2>&1
then echo "PASS chunkwise_gpt2_device_test (host OpenMP)"; else echo "FAIL chunkwise_gpt2_device_test (host)";
  tail -20 "$logs/gpt2_device_host.log"; fi | tee -a "$logs/tests.txt"
publish

# The row kernels (one warp per row) against the staged functors they replaced, at the throughput shape
stamp "row kernels, side by side"
bounded 60 "$bin/examples/train_gpt2/gpt2_row_kernels_bench" > "$logs/train_row_kernels.log" 2>&1 ||
  echo "gpt2_row_kernels_bench failed (rc $?)"
grep '^row kernels' "$logs/train_row_kernels.log"
# The products four ways (fp32, cuBLAS's fast bf16 on fp32 operands, bf16 operands, bf16 rounded first)
stamp "products, four ways"
bounded 60 "$bin/examples/train_gpt2/gpt2_products_bench" > "$logs/train_products.log" 2>&1 ||
  echo "gpt2_products_bench failed (rc $?)"
grep '^products' "$logs/train_products.log"

shape=(--layers 12 --channels 768 --heads 12 --vocab 50257 --context 256 --batch 4 --eval-every 1000
       --measure-cache /tmp/chunkwise-measure)
trainer=$bin/examples/train_gpt2/train_gpt2
run_trainer() {  # name, flags...
  local name=$1; shift
  stamp "train_gpt2 $name: $*"
  bounded 200 env OMP_NUM_THREADS="$(nproc)" "$trainer" "${shape[@]}" "$@" > "$logs/train_$name.log" 2>&1 ||
    { echo "train_gpt2 $name failed (rc $?)"; tail -30 "$logs/train_$name.log"; }
  publish
  # the plan and its inputs (the GPU's profile as measured, the budget, what the passes hold beside it), the steps
  local shown='^(measure: |device budget|training state|plan|chosen|backend|compute|step +[0-9]+/|timing|done'
  grep -E "$shown|device passes)" "$logs/train_$name.log" | head -50
}
run_trainer cuda --backend cuda --steps 12 --device-budget 0
# where the device time goes at the throughput shape, where the MFU is judged (bf16, batch 32: below); each operation
# is timed to its end, so these steps run slower than the untimed ones
CHUNKWISE_GPT2_KERNEL_TIMES=1 run_trainer cuda_kernel_times --backend cuda --dtype bf16 --batch 32 --steps 3 \
  --device-budget 0 --eval-every 1000 > /dev/null
sed -n '/^step parts/,$p' "$logs/train_cuda_kernel_times.log" | head -40
run_trainer cuda_streamed --backend cuda --steps 4 --device-budget 2GiB
# the same run with the host chunks and the device mirror (before the chunks lived on the GPU): the change side by side
run_trainer cuda_mirror --backend cuda --gpu-chunks off --steps 4 --device-budget 0
# bf16 chunks and bf16 tensor-core products (fp32 sums): the MFU against the H200's bf16 dense peak (BF16_PEAK_FLOPS)
run_trainer cuda_bf16 --backend cuda --dtype bf16 --steps 6 --device-budget 0
# The throughput shape, where the states fit and the MFU is judged: bf16 at batch 32, context 256 (8192 tokens a
# step; batch 4 is too little work a step for any GPU trainer to approach the peak), beside PyTorch's bf16 autocast
# at the same shape (below). Context 256, not GPT-2's 1024: the passes keep attention's (B, NH, T, T) arrays (no
# fused attention), whose traffic at 1024 would be most of what this measured.
run_trainer cuda_bf16_wide --backend cuda --dtype bf16 --steps 6 --device-budget 0 --batch 32
# fp16 chunks with loss scaling (fp32 products), beside the host backend's fp16 run
run_trainer cuda_fp16 --backend cuda --dtype fp16 --steps 4 --device-budget 0
run_trainer host_fp16 --backend host --dtype fp16 --steps 4 --device-budget 0
run_trainer host --backend host --steps 4 --device-budget 0

if [ -z "${SKIP_TORCH:-}" ]; then  # SKIP_TORCH=1: a call that measures only ours (the speedups print as nan)
  stamp "PyTorch at the same shape"
  bounded 300 env PYTHONUNBUFFERED=1 python3 bench/device/torch_gpt2.py --layers 12 --channels 768 --heads 12 \
    --vocab 50257 --context 256 --batch 4 --steps 8 > "$logs/torch.log" 2>&1 || tail -30 "$logs/torch.log"
  grep '^torch' "$logs/torch.log"
  bounded 200 env PYTHONUNBUFFERED=1 python3 bench/device/torch_gpt2.py --layers 12 --channels 768 --heads 12 \
    --vocab 50257 --context 256 --batch 32 --steps 6 --dtype bf16 --modes plain > "$logs/torch_wide.log" 2>&1 ||
    tail -30 "$logs/torch_wide.log"
  sed 's/^torch plain/torch bf16 wide/' "$logs/torch_wide.log" | grep '^torch'
  publish
fi

stamp "CUDA tests under compute-sanitizer memcheck (until the deadline)"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# the trainer's passes first; each test once
memcheck_tests=${MEMCHECK_TESTS-$(echo chunkwise_cuda_gpt2_device_test $targets | tr ' ' '\n' |
                                  awk 'NF && !seen[$0]++')}
[ -n "${QUICK:-}" ] && memcheck_tests=${MEMCHECK_TESTS-}
for test in $memcheck_tests; do
  left=$(( deadline - $(date +%s) )); (( left > $(left_for 600) )) && left=$(left_for 600)
  if (( left < 20 )); then echo "SKIP $test (memcheck: past the deadline)"; continue; fi
  if timeout "$left" "$sanitizer" --tool memcheck --leak-check no --report-api-errors no --error-exitcode 9 \
      "$bin/tests/cuda/$test" \
      > "$logs/memcheck_$test.log" 2>&1; then echo "PASS $test (memcheck)"
  else echo "FAIL $test (memcheck, rc $?)"; tail -25 "$logs/memcheck_$test.log"; fi
done | tee -a "$logs/tests.txt"
publish
cat "$logs/summary.txt"
stamp "done"

