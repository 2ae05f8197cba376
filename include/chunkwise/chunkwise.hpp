#pragma once
// Everything in chunkwise that the host path provides, each part through its umbrella (the CUDA parts are the
// `.cuh` headers under */cuda/; the test-only fault injectors are <chunkwise/testing.hpp>). The JSON parts (profile and
// machine JSON, explain_json, measure_or_load) come with the json component: where CHUNKWISE_HAS_JSON is defined.
#include <chunkwise/backend.hpp>
#include <chunkwise/collective.hpp>
#include <chunkwise/comm.hpp>
#include <chunkwise/core.hpp>
#include <chunkwise/layout.hpp>
#include <chunkwise/measure.hpp>
#include <chunkwise/optim.hpp>
#include <chunkwise/placement.hpp>
#include <chunkwise/plan.hpp>
#include <chunkwise/profile.hpp>
#include <chunkwise/runtime.hpp>
#include <chunkwise/tier.hpp>
