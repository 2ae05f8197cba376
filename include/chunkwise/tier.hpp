#pragma once
// Memory tiers: spaces and legal moves, the memory_tier concept, the host-backend tiers, the NVMe store, the
// transfer engine. CUDA tiers: tier/cuda/*.cuh (nvcc only).
#include <chunkwise/tier/concepts.hpp>
#include <chunkwise/tier/host.hpp>
#include <chunkwise/tier/emulated_device.hpp>
#include <chunkwise/tier/nvme.hpp>
#include <chunkwise/tier/pinned_host.hpp>
#include <chunkwise/tier/spaces.hpp>
#include <chunkwise/tier/transfer_engine.hpp>
