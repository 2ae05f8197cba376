#pragma once
// The placement_policy contract: byte counts every policy must keep, checked over a grid of chunk sizes, chunk
// counts and block counts (TEST_CASE_TEMPLATE_APPLY(placement_policy_contract, ...)).
#include <chunkwise/placement/concepts.hpp>

#include <doctest/doctest.h>

#include <concepts>
#include <tuple>

TEST_CASE_TEMPLATE_DEFINE("placement_policy contract: every chunk has a home and the device holds what it says",
                          Policy, placement_policy_contract) {
  using namespace chunkwise;
  static_assert(placement_policy<Policy>);
  static_assert((Policy::device_bytes(MiB, 8, 2), true));  // usable in constant expressions
  using home = typename Policy::home_space;
  for (byte_count chunk : {byte_count{1000}, 4 * KiB, 64 * MiB}) {
    for (std::size_t chunks : {1, 2, 7, 64}) {
      byte_count previous_device = 0;
      for (std::size_t blocks : {1, 2, 3, 5, 8, 64, 100}) {
        CAPTURE(chunk);
        CAPTURE(chunks);
        CAPTURE(blocks);
        const byte_count device = Policy::device_bytes(chunk, chunks, blocks);
        const std::size_t resident = Policy::resident_chunks(chunks, blocks);
        CHECK(resident <= chunks);
        CHECK(device <= byte_count{chunks} * chunk);                // never more than all chunks
        CHECK(device >= byte_count{resident} * chunk);              // resident chunks are on the device
        CHECK(device >= previous_device);                           // more blocks never hold less
        previous_device = device;
        if (Policy::uses_device_cache && resident < chunks) CHECK(device > byte_count{resident} * chunk);  // room to stream
        // Every non-resident chunk has a home off the device.
        const byte_count homed = byte_count{chunks - resident} * chunk;
        if constexpr (std::same_as<home, space::nvme>) {
          CHECK(Policy::nvme_bytes(chunk, chunks, blocks) >= homed);
        } else if constexpr (!std::same_as<home, space::device>) {
          CHECK(Policy::host_bytes(chunk, chunks, blocks) >= homed);
          CHECK(Policy::nvme_bytes(chunk, chunks, blocks) == 0);
        } else {
          CHECK(resident == chunks);
          CHECK(Policy::host_bytes(chunk, chunks, blocks) == 0);
        }
      }
    }
  }
}
