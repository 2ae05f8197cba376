#pragma once
// Communicators: the seam, the in-process thread_comm and (when built with MPI) mpi_comm. nccl_comm lives in
// chunkwise/comm/cuda/nccl_comm.cuh and is included by CUDA translation units only.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/comm/thread_comm.hpp>
