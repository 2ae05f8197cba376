#pragma once
// Backends: the backend concept and the host backend (worker-thread streams). CUDA: backend/cuda/backend.cuh.
#include <chunkwise/backend/concepts.hpp>
#include <chunkwise/backend/host.hpp>
