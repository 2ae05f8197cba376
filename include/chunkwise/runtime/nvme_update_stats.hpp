#pragma once
// What the optimizer updates of chunks with NVMe homes did (runtime::nvme_updates()), counted by
// runtime/detail/nvme_update_pipeline.hpp.
#include <chunkwise/core/bytes.hpp>

#include <cstdint>

namespace chunkwise {

/// Updates run, how many found their blocks read ahead (prepared) rather than reading them then, the working blocks
/// they needed: handed over from the device cache's copy, or read from the drive; and the bytes they read from the
/// drive.
struct nvme_update_stats {
  std::uint64_t updates = 0, read_ahead = 0, params_handed_over = 0, params_read = 0;
  byte_count bytes_read = 0;
};

}  // namespace chunkwise
