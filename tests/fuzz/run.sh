#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz/ with clang++ (ASan + UBSan) and runs each for a bounded time on a
# copy of its seed corpus. Exits non-zero on any finding (crash, failed check, leak, timeout, out-of-memory) and
# prints the reproducer. Usage: tests/fuzz/run.sh [seconds per target, default 60]
# Environment: CXX (default clang++), FUZZ_BUILD_DIR (default build/fuzz), FUZZ_JOBS (parallel builds, default 1),
# FUZZ_SEED and FUZZ_RUNS (a fixed seed and input count make a run repeatable: what CI uses, so a green run stays
# green; the time limit still caps it).
# Reproduce a finding: build/fuzz/<target> <reproducer file>
set -euo pipefail

seconds="${1:-60}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cxx="${CXX:-clang++}"
build="${FUZZ_BUILD_DIR:-$root/build/fuzz}"
targets=(fuzz_model_profile fuzz_machine_profile fuzz_layout)

if [[ ! "$seconds" =~ ^[0-9]+$ ]] || (( 10#$seconds == 0 )); then
  echo "run.sh: seconds must be a positive whole number (0 would fuzz forever), got '$seconds'" >&2
  exit 2
fi
if ! "$cxx" --version 2>/dev/null | grep -q clang; then
  echo "run.sh: $cxx is not clang (libFuzzer needs clang++; set CXX)" >&2
  exit 2
fi

mkdir -p "$build"
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I"$root/include")
pids=()
for t in "${targets[@]}"; do
  echo "== building $t"
  "$cxx" "${flags[@]}" "$here/$t.cpp" -o "$build/$t" &
  pids+=($!)
  if (( ${#pids[@]} >= ${FUZZ_JOBS:-1} )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p"; done

work="$(mktemp -d "${TMPDIR:-/tmp}/chunkwise-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
artifacts="$build/artifacts"
mkdir -p "$artifacts"
status=0
for t in "${targets[@]}"; do
  corpus="$work/$t"
  mkdir -p "$corpus"
  cp "$here/corpus/$t/"* "$corpus/"
  dict=()
  [[ "$t" != fuzz_layout ]] && dict=(-dict="$here/json.dict")
  repeatable=()
  [[ -n "${FUZZ_SEED:-}" ]] && repeatable+=(-seed="$FUZZ_SEED")
  [[ -n "${FUZZ_RUNS:-}" ]] && repeatable+=(-runs="$FUZZ_RUNS")
  echo "== running $t for ${seconds}s"
  log="$work/$t.log"
  # -timeout: one input taking over 10 s is a finding; -rss_limit_mb: so is more than 2 GiB.
  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     "$build/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       "${dict[@]}" "${repeatable[@]}" -artifact_prefix="$artifacts/$t-" "$corpus" >"$log" 2>&1; then
    { grep -E '^(stat::number_of_executed_units|Done )' "$log" || true; } | tr '\n' ' '; echo
  else
    status=1
    echo "!! $t found a problem; log tail:"
    tail -n 60 "$log"
    grep -ho "Test unit written to .*" "$log" | sed 's/^/!! reproducer: /' || true
    echo "!! reproduce with: $build/$t <reproducer>"
  fi
done
exit "$status"
