#pragma once
// Test-only fault injectors for the NVMe tier, thread_comm and atomic files (namespace chunkwise::testing).
#include <chunkwise/testing/atomic_write_faults.hpp>
#include <chunkwise/testing/nvme_faults.hpp>
#include <chunkwise/testing/thread_comm_faults.hpp>
