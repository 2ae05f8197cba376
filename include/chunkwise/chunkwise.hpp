#pragma once
// Everything in chunkwise that the host path provides.
#include <chunkwise/core.hpp>
#include <chunkwise/layout.hpp>
#include <chunkwise/profile.hpp>
