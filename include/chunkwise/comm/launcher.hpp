#pragma once
// Who started this process, and as which rank: the variables the launchers users already have set for every process
// they start. Used to bootstrap communicators without MPI (nccl_comm through bootstrap_tcp.hpp under torchrun or
// srun), and to know the ranks on this machine.
//
//   torchrun / torch.distributed.run   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   Slurm's srun                       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (or
//                                      SLURM_TASKS_PER_NODE's first count), SLURM_LAUNCH_NODE_IPADDR
//   Open MPI's mpirun                  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                                      OMPI_COMM_WORLD_LOCAL_SIZE
//   MPICH / Intel MPI (PMI)            PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
// The first launcher whose rank and size are both set wins, in that order (torchrun inside a Slurm allocation sets
// RANK beside SLURM_PROCID: the process is torchrun's). MASTER_ADDR and MASTER_PORT, where set, name the rendezvous
// whatever the launcher; under Slurm without them the address is the launch node's and the port is left to the
// caller. Nothing set: one process, rank 0 of 1. A variable that is set but not a number, or a rank outside the
// size, is an error naming the variable and its value.
#include <chunkwise/core/error.hpp>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace chunkwise {

struct launcher_ranks {
  std::string launcher = "none";  // torchrun, slurm, openmpi, pmi, or none (a single process)
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // this machine's processes
  std::string master_address;          // the rendezvous; empty where the launcher names none
  int master_port = 0;                 // 0: not given
};

namespace detail {

/// The variable's value as a number, nullopt where it is not set; an error naming it where it is not a number.
inline std::optional<long> launcher_number(const std::function<const char*(const char*)>& lookup, const char* name) {
  const char* text = lookup(name);
  if (text == nullptr) return std::nullopt;
  const std::string_view value(text);
  long number = 0;
  // Slurm's task counts may read "4(x2)": the leading count is this node's.
  const auto [end, code] = std::from_chars(value.data(), value.data() + value.size(), number);
  const bool rest_ok = end == value.data() + value.size() ||
                       (*end == '(' && std::string_view(name) == "SLURM_TASKS_PER_NODE");
  if (code != std::errc() || end == value.data() || !rest_ok || number < 0)
    raise(error_code::invalid_argument, std::string("launcher: ") + name + "='" + std::string(value) +
                                            "' is not a count or rank (a non-negative integer)");
  return number;
}

}  // namespace detail

/// This process's ranks as its launcher set them, read through `lookup` (the environment by default).
inline launcher_ranks launcher_environment(
    const std::function<const char*(const char*)>& lookup = [](const char* name) { return std::getenv(name); }) {
  struct scheme {
    const char *name, *rank, *size, *local_rank, *local_size;
  };
  constexpr scheme schemes[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
  };
  launcher_ranks ranks;
  for (const auto& s : schemes) {
    const auto rank = detail::launcher_number(lookup, s.rank);
    const auto size = detail::launcher_number(lookup, s.size);
    if (!rank || !size) continue;
    if (*size < 1 || *rank >= *size)
      detail::raise(error_code::invalid_argument, std::string("launcher (") + s.name + "): " + s.rank + "=" +
                                                      std::to_string(*rank) + " is not a rank of " + s.size + "=" +
                                                      std::to_string(*size) + " (ranks are 0 to size - 1)");
    ranks.launcher = s.name;
    ranks.rank = static_cast<int>(*rank);
    ranks.size = static_cast<int>(*size);
    auto local_size = detail::launcher_number(lookup, s.local_size);
    if (!local_size && std::string_view(s.name) == "slurm")
      local_size = detail::launcher_number(lookup, "SLURM_TASKS_PER_NODE");
    // Without the local variables, every process is taken to be on a machine of its own.
    ranks.local_rank = static_cast<int>(detail::launcher_number(lookup, s.local_rank).value_or(0));
    ranks.local_size = static_cast<int>(local_size.value_or(1));
    if (ranks.local_size < 1 || ranks.local_rank >= ranks.local_size)
      detail::raise(error_code::invalid_argument,
                    std::string("launcher (") + s.name + "): local rank " + std::to_string(ranks.local_rank) +
                        " is not below the " + std::to_string(ranks.local_size) + " processes on this machine (" +
                        s.local_rank + ", " + s.local_size + ")");
    if (std::string_view(s.name) == "slurm")
      if (const char* node = lookup("SLURM_LAUNCH_NODE_IPADDR")) ranks.master_address = node;
    break;
  }
  if (const char* address = lookup("MASTER_ADDR")) ranks.master_address = address;
  if (const auto port = detail::launcher_number(lookup, "MASTER_PORT")) {
    if (*port < 1 || *port > 65535)
      detail::raise(error_code::invalid_argument,
                    "launcher: MASTER_PORT=" + std::to_string(*port) + " is not a TCP port (1 to 65535)");
    ranks.master_port = static_cast<int>(*port);
  }
  return ranks;
}

}  // namespace chunkwise
