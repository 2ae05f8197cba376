#pragma once
// The measure part: microbenchmarks of a backend, its tiers, communicator and optimizers into a machine_profile.
#include <chunkwise/measure/host.hpp>
#include <chunkwise/measure/measure.hpp>
