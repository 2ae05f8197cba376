#pragma once
// The runtime part: runtime<Plan, Comm> executes a chosen plan; the chunk life cycle; sharded checkpoints.
#include <chunkwise/runtime/checkpoint_file.hpp>
#include <chunkwise/runtime/chunk_state.hpp>
#include <chunkwise/runtime/runtime.hpp>
