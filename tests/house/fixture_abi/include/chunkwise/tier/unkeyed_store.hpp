#pragma once
// Fixture (tests/house/check_includes_catches.cmake): a header whose members differ with io_uring but which
// declares them outside the inline ABI namespace. The check must refuse line 7 and nothing else.
#include <chunkwise/core/abi.hpp>

namespace chunkwise {
#if CHUNKWISE_HAS_URING
struct unkeyed_store { int ring; };
#else
struct unkeyed_store { long pool; };
#endif
}  // namespace chunkwise
