#pragma once
// Communicators: the seam, the in-process thread_comm, the bootstrap rendezvous (a file, or TCP at the address the
// launcher names), the launchers' rank variables and (built with the MPI component) mpi_comm. nccl_comm lives in
// chunkwise/comm/cuda/nccl_comm.cuh, for CUDA translation units.
#include <chunkwise/comm/bootstrap_file.hpp>
#include <chunkwise/comm/bootstrap_tcp.hpp>
#include <chunkwise/comm/launcher.hpp>
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/comm/mpi_comm.hpp>
#include <chunkwise/comm/thread_comm.hpp>
