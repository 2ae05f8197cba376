#pragma once
// The runtime part: runtime<Plan, Backend, Comm> executes a chosen plan (on host_backend everywhere, on
// isolated_backend, a device the host cannot address, for checks without a GPU; the CUDA backend's parts come with
// runtime/cuda/backend_parts.cuh); its pieces (home storage, gradient pipeline, optimizer stage); the chunk life
// cycle; sharded checkpoints; fp32_compute for CPU trainers.
#include <chunkwise/backend/host.hpp>
#include <chunkwise/runtime/checkpoint.hpp>
#include <chunkwise/runtime/checkpoint_file.hpp>
#include <chunkwise/runtime/chunk_state.hpp>
#include <chunkwise/runtime/fp32_compute.hpp>
#include <chunkwise/runtime/isolated_device.hpp>
#include <chunkwise/runtime/runtime.hpp>
