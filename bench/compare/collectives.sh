#!/usr/bin/env bash
# chunkwise's mpi_comm beside plain MPI (MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce) on the same buffers
# and process count, in one run (bench/compare/collectives_mpi.cpp says how it times).
# Usage: bench/compare/collectives.sh [PROCESSES=2] [ROUNDS=5]
# Last line: collectives ratio_vs_mpi=R (the lowest over the three operations of MPI's time / ours; goal >= 0.9).
# Builds with mpicxx against this checkout's headers (chunkwise is header-only) into $BUILD_DIR (default
# build/collectives). Runs as root and oversubscribed where it must (Open MPI refuses both by default).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
processes="${1:-2}"
rounds="${2:-5}"
build="${BUILD_DIR:-$root/build/collectives}"
command -v mpicxx > /dev/null || { echo "collectives.sh: no mpicxx; install libopenmpi-dev openmpi-bin" >&2; exit 2; }
mkdir -p "$build"
binary="$build/collectives_mpi"
if [[ ! -x "$binary" || "$here/collectives_mpi.cpp" -nt "$binary" || -n "$(find "$root/include" -newer "$binary" -name '*.hpp' -print -quit)" ]]; then
  mpicxx -std=c++20 -O2 -DNDEBUG -DCHUNKWISE_HAS_MPI=1 -I"$root/include" "$here/collectives_mpi.cpp" -o "$binary"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# One machine: shared memory (no ptrace-based single copy, which containers forbid).
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}" OMPI_MCA_btl_vader_single_copy_mechanism=none
mpiexec -n "$processes" "$binary" "$rounds"
