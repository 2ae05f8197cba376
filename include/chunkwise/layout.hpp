#pragma once
// Chunk layouts: tensors -> chunks (fixed, min_waste, per_tensor) and the chunk_layout concept.
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/layout/concepts.hpp>
#include <chunkwise/layout/fixed.hpp>
#include <chunkwise/layout/min_waste.hpp>
#include <chunkwise/layout/per_tensor.hpp>
#include <chunkwise/layout/private_chunks.hpp>
