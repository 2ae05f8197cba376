#!/usr/bin/env bash
# Installs from Debian's packages what is missing for building chunkwise (the README's Quick start calls it first).
#
#   tools/install-deps.sh                 # configure the default preset, build and run the example trainer
#   tools/install-deps.sh --tests         # and everything the tests and benches need besides
#   tools/install-deps.sh --tests PKG...  # and these Debian packages too (.ci/run: clang for the fuzzers)
#   tools/install-deps.sh --list [--tests]  # print the package names and exit
#
# Checks each package with dpkg-query first and calls apt-get only when something is missing, so a second run prints
# nothing. As root it runs apt-get itself; otherwise through sudo where sudo exists; otherwise it prints the apt-get
# command to run and exits 1. On a system without dpkg and apt-get it names what to install and exits 0 (CMake then
# says what it still misses).
set -euo pipefail

# The default preset configures the tests and benches too (find_package(doctest), find_package(benchmark)), so both
# belong to the smallest set that runs `cmake --preset default`. pkg-config: cmake/Findliburing.cmake asks it first.
# libdnnl-dev and libopenblas-openmp-dev: the example trainer's matrix products (oneDNN's, bf16 under --dtype bf16;
# OpenBLAS's OpenMP build; without either they run in the model's own loops).
base=(g++ cmake ninja-build pkg-config nlohmann-json3-dev liburing-dev doctest-dev libbenchmark-dev
      libopenblas-openmp-dev libdnnl-dev)
# The tests besides: the MPI communicator's tests (mpiexec), the two-machines test's network namespaces (iproute2),
# the PyTorch exporter's test (a venv from tools/python-env.sh needs python3-venv), bench/compare/nvme.sh (fio).
tests=(libopenmpi-dev openmpi-bin iproute2 python3 python3-venv fio)

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
want=("${base[@]}")
list=0
extra=()
for arg in "$@"; do
  case $arg in
    --tests) want+=("${tests[@]}") ;;
    --list) list=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "install-deps.sh: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
    *) extra+=("$arg") ;;
  esac
done
want+=("${extra[@]}")
if ((list)); then
  echo "${want[*]}"
  exit 0
fi

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  echo "install-deps.sh: no dpkg/apt-get here; install your system's equivalents of these Debian packages:" >&2
  echo "  ${want[*]}" >&2
  exit 0
fi

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0

command_line="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if ((EUID == 0)); then
  sudo=()
elif command -v sudo >/dev/null; then
  sudo=(sudo)
else
  echo "install-deps.sh: missing Debian packages: ${missing[*]}" >&2
  echo "install-deps.sh: not root and no sudo; as root, run:" >&2
  echo "  $command_line" >&2
  exit 1
fi

echo "install-deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { "${sudo[@]}" apt-get update -qq &&
       "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
  echo "install-deps.sh: apt-get failed; the command was:" >&2
  echo "  ${sudo[*]}${sudo:+ }$command_line" >&2
  exit 1
fi
