#pragma once
// The plan set chunkwise-plan and the example trainer carry: data parallel, ZeRO-2, ZeRO-3, ZeRO-Offload, partial
// optimizer offload, a device cache over pinned host homes (Gemini/Elixir), resident-prefix streaming, and NVMe homes
// (ZeRO-Infinity); Elixir's private chunks: the tied embedding in a chunk of its own, kept resident by the split
// placement (it is used at both ends of every step), the rest streamed in chunks of at most 64 MiB; last, hybrid
// sharding (ZeRO-3 inside groups of 2, 4 or 8 ranks, replicated across groups: FSDP's HYBRID_SHARD), which wins when
// the groups are the machines of a job and the link between machines is slow. A hybrid plan whose group does not
// divide the ranks is infeasible, with the reason. The search picks among them; --plan forces one.
#include <chunkwise/collective/hybrid.hpp>
#include <chunkwise/collective/replicated.hpp>
#include <chunkwise/collective/shard_grads.hpp>
#include <chunkwise/collective/sharded.hpp>
#include <chunkwise/layout/min_waste.hpp>
#include <chunkwise/layout/private_chunks.hpp>
#include <chunkwise/placement/cached.hpp>
#include <chunkwise/placement/resident.hpp>
#include <chunkwise/placement/split.hpp>
#include <chunkwise/plan/optimizer_execution.hpp>
#include <chunkwise/plan/plan.hpp>

namespace chunkwise {

using default_plans =
    plan_set<plan<layout::min_waste<>, resident, replicated, optimizer_follows_home>,
             plan<layout::min_waste<>, resident, shard_grads, optimizer_follows_home>,
             plan<layout::min_waste<>, resident, sharded, optimizer_follows_home>,
             plan<layout::min_waste<>, resident, sharded, optimizer_auto<space::pinned_host>>,
             plan<layout::min_waste<>, resident, shard_grads, optimizer_offload<space::pinned_host>>,
             plan<layout::min_waste<>, cached<space::pinned_host>, sharded, optimizer_follows_home>,
             plan<layout::min_waste<>, split<space::pinned_host>, sharded, optimizer_follows_home>,
             plan<layout::min_waste<>, cached<space::nvme>, sharded, optimizer_follows_home>,
             plan<layout::private_chunks<>, split<space::pinned_host>, sharded, optimizer_follows_home>,
             plan<layout::min_waste<>, resident, hybrid<2>, optimizer_follows_home>,
             plan<layout::min_waste<>, resident, hybrid<4>, optimizer_follows_home>,
             plan<layout::min_waste<>, resident, hybrid<8>, optimizer_follows_home>>;

}  // namespace chunkwise
