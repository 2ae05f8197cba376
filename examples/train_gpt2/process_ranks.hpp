#pragma once
// The trainer's ranks as MPI processes (--comm mpi): `mpirun -np N train_gpt2 --comm mpi ...`, one rank per process,
// on one machine or several. Whatever started the processes (mpirun, or Slurm's srun where Open MPI was built with
// its PMI) MPI_Init finds the job through it; this file asks nothing of the launcher itself.
//
// Rank 0 plans and prints; the other processes write nothing to stdout (errors still go to stderr with their rank)
// and take rank 0's decision (the plan and its knobs), so a measurement that differs from process to process cannot
// split the job between two plans. A process that fails while training ends the job (MPI_Abort): its peers would
// otherwise wait in their next collective for a rank that is gone. A process that dies outright (a signal) is the
// launcher's to report: mpirun ends the others and names the rank that died.
#include <chunkwise/comm/mpi_comm.hpp>

#if CHUNKWISE_HAS_MPI
#include <chunkwise/core/mpi_checked_call.hpp>

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <span>
#include <type_traits>

namespace gpt2 {

class process_world {
 public:
  process_world(int& argc, char**& argv) : environment_(argc, argv) {
    // The processes sharing this machine's cores: MPI's shared-memory split of the world.
    MPI_Comm local = MPI_COMM_NULL;
    CHUNKWISE_MPI_TRY(MPI_Comm_split_type(world_.native(), MPI_COMM_TYPE_SHARED, world_.rank(), MPI_INFO_NULL, &local),
                      "train_gpt2");
    CHUNKWISE_MPI_TRY(MPI_Comm_size(local, &local_ranks_), "train_gpt2");
    MPI_Comm_free(&local);
    if (world_.rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
      std::fprintf(stderr, "train_gpt2 (rank %d): could not silence stdout\n", world_.rank());
  }

  [[nodiscard]] chunkwise::mpi_comm& comm() noexcept { return world_; }
  [[nodiscard]] int rank() const noexcept { return world_.rank(); }
  [[nodiscard]] int size() const noexcept { return world_.size(); }
  /// The processes of this job on this machine (they share its cores and memory).
  [[nodiscard]] int local_ranks() const noexcept { return local_ranks_; }

  /// Rank 0's `value`, on every rank.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  T from_rank0(T value) {
    world_.broadcast(std::span<T>(&value, 1), 0).wait();
    return value;
  }

  /// Ends every process of the job with `code` (after the caller printed why).
  [[noreturn]] void abort(int code) {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  chunkwise::mpi_environment environment_;
  chunkwise::mpi_comm world_;
  int local_ranks_ = 1;
};

}  // namespace gpt2

#endif  // CHUNKWISE_HAS_MPI
