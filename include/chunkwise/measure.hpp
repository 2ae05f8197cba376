#pragma once
// The measure part: microbenchmarks of a backend, its tiers, communicator and optimizers into a machine_profile.
// With the json component (CHUNKWISE_HAS_JSON, from chunkwise::json) also the cache, measure_or_load.
#include <chunkwise/measure/host.hpp>
#include <chunkwise/measure/measure.hpp>
#if CHUNKWISE_HAS_JSON
#include <chunkwise/measure/cache.hpp>
#endif
