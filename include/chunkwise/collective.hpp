#pragma once
// Collective strategies: how ranks share chunks (replicated, shard_grads = ZeRO-2, sharded = ZeRO-3, hybrid<G>).
#include <chunkwise/collective/chunk_collectives.hpp>
#include <chunkwise/collective/concepts.hpp>
#include <chunkwise/collective/hybrid.hpp>
#include <chunkwise/collective/pending.hpp>
#include <chunkwise/collective/replicated.hpp>
#include <chunkwise/collective/shard.hpp>
#include <chunkwise/collective/shard_grads.hpp>
#include <chunkwise/collective/sharded.hpp>
