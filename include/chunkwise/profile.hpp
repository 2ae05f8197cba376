#pragma once
// Model profiles: byte counts and access order of one training iteration (analytic GPT-2, JSON).
#include <chunkwise/profile/gpt2.hpp>
#include <chunkwise/profile/json.hpp>
#include <chunkwise/profile/model_profile.hpp>
#include <chunkwise/profile/tracer.hpp>
#include <chunkwise/profile/machine_json.hpp>
#include <chunkwise/profile/machine_profile.hpp>
