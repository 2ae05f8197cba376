#pragma once
// Placement: the placement_policy concept, resident / cached<Tier> / split<Tier>, and the device chunk cache.
#include <chunkwise/placement/cached.hpp>
#include <chunkwise/placement/concepts.hpp>
#include <chunkwise/placement/device_cache.hpp>
#include <chunkwise/placement/resident.hpp>
#include <chunkwise/placement/split.hpp>
