#pragma once
// The measure part: microbenchmarks of a backend, its tiers, communicator and optimizers into a machine_profile.
// With the json component (CHUNKWISE_HAS_JSON, from chunkwise::json) also the caches: measure_or_load for the
// profile, measure_or_load_rate for a program's own rates.
#include <chunkwise/measure/host.hpp>
#include <chunkwise/measure/measure.hpp>
#if CHUNKWISE_HAS_JSON
#include <chunkwise/measure/cache.hpp>
#include <chunkwise/measure/rate_cache.hpp>
#endif
