#!/usr/bin/env bash
# The NVMe tier against the physical limit: fio's sequential O_DIRECT read and write (io_uring engine) with the same
# request size, queue depth and file system as our store, then our NVMe tier's sequential block reads and writes
# (bench/tier_bench.cpp, nvme_compare_*). Runs each side ROUNDS times, alternating which goes first, and keeps each
# side's median round, so a noisy shared disk hurts both alike. Last line: `nvme read_ratio_vs_fio=R write_ratio_vs_fio=W` (goal: both >= 0.85).
#
# Usage: bench/compare/nvme.sh [build-dir]
#   BS_KIB (1024)  request size in KiB      QD (4)        queue depth       SIZE_MIB (1024)  file size
#   DIR ($TMPDIR or /tmp)  file system      ROUNDS (5)    repetitions       BLOCK_MIB (64)   our chunk block size
set -euo pipefail

build_dir=${1:-build}
bench=$build_dir/bench/chunkwise_tier_bench
BS_KIB=${BS_KIB:-1024}
QD=${QD:-4}
SIZE_MIB=${SIZE_MIB:-1024}
DIR=${DIR:-${TMPDIR:-/tmp}}
ROUNDS=${ROUNDS:-5}
BLOCK_MIB=${BLOCK_MIB:-64}

command -v fio >/dev/null || { echo "nvme.sh: fio not found (apt-get install fio)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "nvme.sh: python3 not found" >&2; exit 2; }
[[ -x $bench ]] || { echo "nvme.sh: $bench not built (cmake --build $build_dir --target chunkwise_tier_bench)" >&2; exit 2; }
[[ -d $DIR ]] || { echo "nvme.sh: directory $DIR does not exist" >&2; exit 2; }

fio_file=$DIR/chunkwise-fio-$$.bin
trap 'rm -f "$fio_file"' EXIT

# fio bandwidth in bytes/s for rw=read|write.
fio_run() {
  fio --name="seq$1" --filename="$fio_file" --rw="$1" --bs="${BS_KIB}k" --iodepth="$QD" --ioengine=io_uring \
      --direct=1 --size="${SIZE_MIB}m" --fallocate=native --output-format=json 2>/dev/null |
    python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['$1']['bw_bytes'])"
}

# Our bandwidth in bytes/s for read|write.
ours_run() {
  CHUNKWISE_BENCH_DIR=$DIR CHUNKWISE_BENCH_NVME_BYTES="${SIZE_MIB}MiB" CHUNKWISE_BENCH_BLOCK_BYTES="${BLOCK_MIB}MiB" \
  CHUNKWISE_BENCH_IO_KIB=$BS_KIB CHUNKWISE_BENCH_QUEUE_DEPTH=$QD \
    "$bench" --benchmark_filter="^nvme_compare_$1/" --benchmark_format=json 2>/dev/null |
    python3 -c "
import json, sys
runs = json.load(sys.stdin)['benchmarks']
if not runs or 'error_message' in runs[0]:
    sys.exit('nvme.sh: our bench failed: ' + (runs[0].get('error_message', '?') if runs else 'no result'))
print(runs[0]['bytes_per_second'], file=sys.stdout)
print(runs[0].get('label', ''), file=sys.stderr)"
}

best() { python3 -c "import sys; print(max(float(x) for x in sys.argv[1:]))" "$@"; }
median() { python3 -c "import statistics, sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
gbs() { python3 -c "import sys; print(f'{float(sys.argv[1]) / 1e9:.2f} GB/s')" "$1"; }

echo "nvme.sh: ${BS_KIB} KiB requests, queue depth $QD, O_DIRECT, ${SIZE_MIB} MiB in $DIR, $ROUNDS rounds"
# Each side writes its file and then reads it back (our read bench writes its store before timing), so both reads
# follow their own fresh write; the side that goes first alternates by round. A shared (virtual) disk is noisy, with
# occasional rounds twice as fast as the rest for either side: the ratios use each side's median round; the best
# rounds are printed too.
fio_w=(); ours_w=(); fio_r=(); ours_r=()
label=$(mktemp)
run_fio() { fio_w+=("$(fio_run write)"); fio_r+=("$(fio_run read)"); }
run_ours() { ours_w+=("$(ours_run write 2>/dev/null)"); ours_r+=("$(ours_run read 2>"$label")"); }
for ((round = 1; round <= ROUNDS; ++round)); do
  if ((round % 2)); then run_fio; run_ours; else run_ours; run_fio; fi
  echo "round $round: write fio $(gbs "${fio_w[-1]}") ours $(gbs "${ours_w[-1]}");" \
       "read fio $(gbs "${fio_r[-1]}") ours $(gbs "${ours_r[-1]}")"
done
echo "our store: $(cat "$label")"; rm -f "$label"
echo "best: write fio $(gbs "$(best "${fio_w[@]}")") ours $(gbs "$(best "${ours_w[@]}")");" \
     "read fio $(gbs "$(best "${fio_r[@]}")") ours $(gbs "$(best "${ours_r[@]}")")"
fw=$(median "${fio_w[@]}"); ow=$(median "${ours_w[@]}"); fr=$(median "${fio_r[@]}"); or=$(median "${ours_r[@]}")
echo "median: write fio $(gbs "$fw") ours $(gbs "$ow"); read fio $(gbs "$fr") ours $(gbs "$or")"
python3 -c "import sys; r, w = float(sys.argv[1]) / float(sys.argv[2]), float(sys.argv[3]) / float(sys.argv[4]); print(f'nvme read_ratio_vs_fio={r:.2f} write_ratio_vs_fio={w:.2f}')" "$or" "$fr" "$ow" "$fw"
