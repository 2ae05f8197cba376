#pragma once
// The memory_tier contract, for every tier (as RMM's typed resource suites): `tier_factory<T>::make(budget)` builds
// one, and TEST_CASE_TEMPLATE_APPLY(memory_tier_contract, ...) runs the suite on it.
#include <chunkwise/core/error.hpp>
#include <chunkwise/tier/concepts.hpp>

#include <doctest/doctest.h>

#include <memory>
#include <tuple>
#include <string>
#include <vector>

namespace chunkwise::test {

template <class Tier>
struct tier_factory;  // static std::unique_ptr<Tier> make(byte_count budget); static stream_ref stream(Tier&)

}  // namespace chunkwise::test

TEST_CASE_TEMPLATE_DEFINE("memory_tier contract: budget, stats, sync and stream-ordered forms", Tier,
                          memory_tier_contract) {
  using namespace chunkwise;
  static_assert(memory_tier<Tier>);
  constexpr byte_count block = 64 * KiB;
  auto tier = chunkwise::test::tier_factory<Tier>::make(4 * block);
  CHECK(tier->capacity() >= 4 * block);
  const byte_count capacity = tier->capacity();
  CHECK(tier->stats().capacity == capacity);
  CHECK(tier->stats().in_use == 0);

  // Fill the budget; then one more allocation fails with out_of_memory and takes nothing.
  std::vector<typename Tier::handle_type> handles;
  byte_count used = 0;
  while (used + block <= capacity) {
    handles.push_back(tier->allocate_sync(block, 0));
    used = tier->stats().in_use;
  }
  CHECK(handles.size() >= 4);
  const byte_count full = tier->stats().in_use;
  bool threw = false;
  try {
    (void)tier->allocate_sync(block, 0);
  } catch (const chunkwise::error& e) {
    threw = true;
    CHECK(e.code() == error_code::out_of_memory);
    CHECK(std::string(e.what()).find(std::to_string(capacity)) != std::string::npos);
  }
  CHECK(threw);
  CHECK(tier->stats().in_use == full);
  CHECK(tier->stats().peak == full);

  // Stream-ordered forms release what the sync forms took.
  auto&& stream = chunkwise::test::tier_factory<Tier>::stream(*tier);
  for (auto handle : handles) tier->deallocate(stream, handle, block, 0);
  chunkwise::test::tier_factory<Tier>::settle(*tier);
  CHECK(tier->stats().in_use == 0);
  CHECK(tier->stats().peak == full);
  auto again = tier->allocate(stream, block, 0);
  CHECK(tier->stats().in_use > 0);
  tier->deallocate_sync(again, block, 0);
  CHECK(tier->stats().in_use == 0);

  // Traffic counters only grow by what is noted.
  const auto before = tier->stats();
  tier->note_read(10);
  tier->note_written(20);
  CHECK(tier->stats().bytes_read == before.bytes_read + 10);
  CHECK(tier->stats().bytes_written == before.bytes_written + 20);
}
