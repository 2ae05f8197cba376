#pragma once
// Model profiles: byte counts and access order of one training iteration (analytic GPT-2), machine profiles. With the
// json component (CHUNKWISE_HAS_JSON, from chunkwise::json; nlohmann_json) also their JSON load and save, and that of
// the rates a program measures for itself.
#include <chunkwise/profile/gpt2.hpp>
#include <chunkwise/profile/model_profile.hpp>
#include <chunkwise/profile/tracer.hpp>
#include <chunkwise/profile/machine_profile.hpp>
#if CHUNKWISE_HAS_JSON
#include <chunkwise/profile/json.hpp>
#include <chunkwise/profile/machine_json.hpp>
#include <chunkwise/profile/rates_json.hpp>
#endif
