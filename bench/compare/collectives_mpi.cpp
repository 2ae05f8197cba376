// collectives_mpi: chunkwise's mpi_comm beside plain MPI on the same buffers, in one run (bench/compare/collectives.sh
// builds and starts it). For each operation and size, rounds alternate ours and MPI's (all_gather / MPI_Allgather,
// reduce_scatter / MPI_Reduce_scatter_block, all_reduce / MPI_Allreduce, fp32 sums): 7 pairs, each the median of
// `rounds` rounds of ours then of MPI's (a round: `repeats` calls between barriers); a pair's ratio is MPI's time
// over ours, and the median over pairs counts (a burst of other work on a shared machine falls on one pair). Prints
// a line per operation and size, then
//   collectives ratio_vs_mpi=R
// R: the lowest over the three operations of the geometric mean over sizes of MPI's time / ours (1: as fast).
// Not a Google Benchmark binary: its iteration counts are decided per process, and a collective needs every
// process to make the same calls.
#include <chunkwise/comm/mpi_comm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace {

/// The median over `rounds` of `repeats` calls of `call`, between barriers (seconds per call, rank 0's clock).
double median_seconds(int rounds, int repeats, const std::function<void()>& call, std::vector<double>& samples) {
  samples.clear();
  for (int round = 0; round < rounds; ++round) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (int i = 0; i < repeats; ++i) call();
    MPI_Barrier(MPI_COMM_WORLD);
    samples.push_back((MPI_Wtime() - start) / repeats);
  }
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  chunkwise::mpi_environment mpi(argc, argv);
  chunkwise::mpi_comm comm;
  const int rank = comm.rank(), ranks = comm.size();
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  // Per-rank element counts of a chunk shard: 256 KiB to 16 MiB of fp32 (the sizes chunks are cut to).
  const std::vector<std::size_t> sizes{64 * 1024, 1024 * 1024, 4 * 1024 * 1024};
  const char* names[] = {"all_gather", "reduce_scatter", "all_reduce"};
  double log_ratio[3] = {};
  std::vector<double> samples;
  for (const std::size_t n : sizes) {
    std::vector<float> shard(n, 1.0f + static_cast<float>(rank)), full(n * static_cast<std::size_t>(ranks), 0.5f),
        out(n);
    const int repeats = n >= 1024 * 1024 ? 3 : 20;
    const int bytes = static_cast<int>(n * sizeof(float));
    const std::function<void()> ours[3] = {
        [&] { comm.all_gather(std::span<const float>(shard), std::span<float>(full)).wait(); },
        [&] {
          comm.reduce_scatter(std::span<const float>(full), std::span<float>(out), chunkwise::reduce_op::sum).wait();
        },
        [&] { comm.all_reduce(std::span<const float>(shard), std::span<float>(out), chunkwise::reduce_op::sum).wait(); },
    };
    const std::function<void()> theirs[3] = {
        [&] { MPI_Allgather(shard.data(), bytes, MPI_BYTE, full.data(), bytes, MPI_BYTE, MPI_COMM_WORLD); },
        [&] {
          MPI_Reduce_scatter_block(full.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        },
        [&] { MPI_Allreduce(shard.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
    };
    for (int op = 0; op < 3; ++op) {
      ours[op]();  // warm-up: buffers touched, connections made
      theirs[op]();
      // Interleaved pairs: the machine's noise falls on both.
      std::vector<double> ratios, ours_times, mpi_times;
      for (int pair = 0; pair < 7; ++pair) {
        ours_times.push_back(median_seconds(rounds, repeats, ours[op], samples));
        mpi_times.push_back(median_seconds(rounds, repeats, theirs[op], samples));
        ratios.push_back(mpi_times.back() / ours_times.back());
      }
      const auto median = [](std::vector<double> v) {
        std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
        return v[v.size() / 2];
      };
      const double ratio = median(ratios);
      log_ratio[op] += std::log(ratio) / static_cast<double>(sizes.size());
      if (rank == 0)
        std::printf("%-15s %2d ranks %8.2f MiB per rank: ours %9.3f ms, MPI %9.3f ms (medians), MPI/ours %.3f\n",
                    names[op], ranks, static_cast<double>(n * sizeof(float)) / (1024.0 * 1024.0),
                    median(ours_times) * 1e3, median(mpi_times) * 1e3, ratio);
    }
  }
  double lowest = 1e30;
  for (int op = 0; op < 3; ++op) {
    const double ratio = std::exp(log_ratio[op]);
    lowest = std::min(lowest, ratio);
    if (rank == 0) std::printf("%-15s over all sizes: MPI/ours %.3f\n", names[op], ratio);
  }
  if (rank == 0) std::printf("collectives ratio_vs_mpi=%.3f\n", lowest);
  return 0;
}
