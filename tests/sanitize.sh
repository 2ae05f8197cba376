#!/usr/bin/env bash
# Builds and runs the tests under the sanitizers, as CI does (.ci/run):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (leaks checked, any finding fatal) over every test labelled
#         `unit` (each part's doctest binary and the MPI communicator's test; not the compile-fail, consumer and
#         example tests, which run no code of ours under the sanitizer);
#   tsan  ThreadSanitizer over the tests labelled `threads`: communicators, collectives and the runtime.
# The presets (CMakePresets.json) hold the flags, the test targets to build, the label filter and the sanitizer
# options; this script runs them in order and prints the time of each stage. Build trees: build/asan, build/tsan.
# Usage: tests/sanitize.sh [asan|tsan|all] (default all). Environment: SANITIZE_JOBS (build jobs, default: nproc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

which="${1:-all}"
case "$which" in
  asan | tsan) sanitizers=("$which") ;;
  all) sanitizers=(asan tsan) ;;
  *) echo "sanitize.sh: expected asan, tsan or all, got '$which'" >&2; exit 2 ;;
esac
jobs="${SANITIZE_JOBS:-$(nproc)}"

for preset in "${sanitizers[@]}"; do
  start=$SECONDS
  echo "== $preset: configure and build the test targets"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  built=$SECONDS
  echo "== $preset: run"
  ctest --preset "$preset"
  echo "== $preset: built in $((built - start)) s, ran in $((SECONDS - built)) s"
done
