#pragma once
// The cores each rank computes on. Ranks sharing a machine divide its cores; each rank's OpenMP loops must then use
// only its share: a thread started with std::thread takes OpenMP's default team (every core), so 3 thread ranks on
// 2 cores ran 6 OpenMP threads, and a step took 7x longer than with one thread each (measured: 170 ms against 23 ms).
#include <algorithm>
#include <thread>

#include <sched.h>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace gpt2 {

/// The cores this process may run on: fewer than the machine's where a launcher bound it (mpirun binds each of a
/// few processes to a core).
inline int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, CPU_COUNT(&set));
}

/// Whether a launcher bound this process to some of the machine's cores (its ranks then compute on those alone).
inline bool bound_by_launcher() { return usable_cores() < static_cast<int>(std::thread::hardware_concurrency()); }

/// The cores of this machine divided among the `ranks_here` ranks on it (at least one each), no more than this
/// process may use.
inline int cores_per_rank(int ranks_here) {
  const int share = static_cast<int>(std::thread::hardware_concurrency()) / std::max(ranks_here, 1);
  return std::max(1, std::min(share, usable_cores()));
}

/// Makes the calling thread's OpenMP loops use its rank's share of the cores; call it first in every rank's thread.
inline void compute_on_rank_cores(int ranks_here) {
#ifdef _OPENMP
  omp_set_num_threads(cores_per_rank(ranks_here));
#else
  (void)ranks_here;
#endif
}

}  // namespace gpt2
