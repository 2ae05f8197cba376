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
#include <chunkwise/profile/machine_profile.hpp>

#include <cstdint>

namespace gpt2 {

/// The machines of the job and the links inside and between them, as the cost model takes them (machine_profile's
/// machines, inter_machine, inter_machine_latency_seconds, collective_latency_seconds). Thread ranks: one machine.
struct machine_links {
  std::uint32_t machines = 1;
  chunkwise::bandwidth_curve inter_machine;
  double latency_seconds = 0;
  double local_latency_seconds = 0;  // an MPI collective call among one machine's processes; 0: one process each
};

}  // namespace gpt2

#if CHUNKWISE_HAS_MPI
#include <chunkwise/core/mpi_checked_call.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <type_traits>
#include <vector>

namespace gpt2 {

class process_world {
 public:
  process_world(int& argc, char**& argv) : environment_(argc, argv) {
    // The processes sharing this machine's cores: MPI's shared-memory split of the world.
    MPI_Comm local = MPI_COMM_NULL;
    CHUNKWISE_MPI_TRY(MPI_Comm_split_type(world_.native(), MPI_COMM_TYPE_SHARED, world_.rank(), MPI_INFO_NULL, &local),
                      "train_gpt2");
    CHUNKWISE_MPI_TRY(MPI_Comm_size(local, &local_ranks_), "train_gpt2");
    CHUNKWISE_MPI_TRY(MPI_Comm_rank(local, &local_rank_), "train_gpt2");
    machine_ = world_.rank();  // the machine's name: its first process's world rank
    CHUNKWISE_MPI_TRY(MPI_Bcast(&machine_, 1, MPI_INT, 0, local), "train_gpt2");
    MPI_Comm_free(&local);
    if (world_.rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
      std::fprintf(stderr, "train_gpt2 (rank %d): could not silence stdout\n", world_.rank());
  }

  [[nodiscard]] chunkwise::mpi_comm& comm() noexcept { return world_; }
  [[nodiscard]] int rank() const noexcept { return world_.rank(); }
  [[nodiscard]] int size() const noexcept { return world_.size(); }
  /// The processes of this job on this machine (they share its cores and memory).
  [[nodiscard]] int local_ranks() const noexcept { return local_ranks_; }
  /// This process's place among the processes of its machine (0 .. local_ranks() - 1): its GPU under --comm nccl.
  [[nodiscard]] int local_rank() const noexcept { return local_rank_; }

  /// Rank 0's `value`, on every rank.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  T from_rank0(T value) {
    world_.broadcast(std::span<T>(&value, 1), 0).wait();
    return value;
  }

  /// The machines (one process each, the machine's first, all-reducing) and the link between them: the bus
  /// bandwidth of an all-reduce of 64 KiB to 16 MiB and the time of an 8-byte one; and the time of an 8-byte
  /// all-reduce among the processes of one machine (rank 0's), the fixed cost the planner charges a collective call
  /// inside a machine (the host profile's is thread_comm's). A collective call of every process.
  machine_links measure_links() {
    machine_links links;
    auto here = world_.split(machine_, world_.rank());
    if (here.size() > 1) links.local_latency_seconds = seconds_per_call(here, 2, 50);
    int leader = local_rank_ == 0 ? 1 : 0, leaders = 0;
    CHUNKWISE_MPI_TRY(MPI_Allreduce(&leader, &leaders, 1, MPI_INT, MPI_SUM, world_.native()), "train_gpt2");
    links.machines = static_cast<std::uint32_t>(leaders);
    if (leaders > 1) {
      auto between = world_.split(leader ? 0 : 1, world_.rank());
      if (leader) {
        links.latency_seconds = seconds_per_call(between, 2, 20);
        const double m = leaders;
        for (const std::size_t bytes : {64u << 10, 1u << 20, 16u << 20})
          links.inter_machine.add(bytes, static_cast<double>(bytes) * 2 * (m - 1) / m /
                                             seconds_per_call(between, bytes / sizeof(float), bytes >= (1u << 20) ? 2 : 10));
      }
    }
    return from_rank0(links);  // world rank 0 is the first machine's first process
  }

  /// Ends every process of the job with `code` (after the caller printed why).
  [[noreturn]] void abort(int code) {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  /// Seconds per all-reduce of `count` floats among `comm`'s processes: the median of 5 rounds of `repeats` calls,
  /// after one that makes the connections and touches the buffers.
  static double seconds_per_call(chunkwise::mpi_comm& comm, std::size_t count, int repeats) {
    std::vector<float> in(count, 1.0f), out(count);
    const auto once = [&] {
      comm.all_reduce(std::span<const float>(in), std::span<float>(out), chunkwise::reduce_op::sum).wait();
    };
    once();
    std::vector<double> samples;
    for (int round = 0; round < 5; ++round) {
      CHUNKWISE_MPI_TRY(MPI_Barrier(comm.native()), "train_gpt2");
      const double start = MPI_Wtime();
      for (int i = 0; i < repeats; ++i) once();
      samples.push_back((MPI_Wtime() - start) / repeats);
    }
    std::nth_element(samples.begin(), samples.begin() + 2, samples.end());
    return samples[2];
  }

  chunkwise::mpi_environment environment_;
  chunkwise::mpi_comm world_;
  int local_ranks_ = 1;
  int local_rank_ = 0;
  int machine_ = 0;  // the world rank of this machine's first process
};

}  // namespace gpt2

#endif  // CHUNKWISE_HAS_MPI
