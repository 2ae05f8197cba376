#pragma once
// Core vocabulary: byte units, dtypes and their conversions, tensor specs, the error type and its checked-call family,
// the one hash, the one checksum, the one checkpoint container, atomic files, the one worker-thread type
// and its bounded poll.
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/checked_call.hpp>
#include <chunkwise/core/checkpoint_format.hpp>
#include <chunkwise/core/checksum.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/hash.hpp>
#include <chunkwise/core/mpi_checked_call.hpp>
#include <chunkwise/core/poll_until.hpp>
#include <chunkwise/core/tensor_spec.hpp>
#include <chunkwise/core/worker_threads.hpp>
