#pragma once
// Core vocabulary: byte units, dtypes and their conversions, tensor specs, the error type.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/tensor_spec.hpp>
