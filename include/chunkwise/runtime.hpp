#pragma once
// The runtime part: runtime<Plan, Backend, Comm> executes a chosen plan (on host_backend everywhere; the CUDA
// backend's parts come with backend/cuda); its pieces (home storage, gradient pipeline, optimizer stage); the chunk
// life cycle; sharded checkpoints.
#include <chunkwise/backend/host.hpp>
#include <chunkwise/runtime/checkpoint.hpp>
#include <chunkwise/runtime/checkpoint_file.hpp>
#include <chunkwise/runtime/chunk_state.hpp>
#include <chunkwise/runtime/runtime.hpp>
