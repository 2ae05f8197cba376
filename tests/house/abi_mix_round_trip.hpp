#pragma once
// The body both halves of house_abi_mix run, compiled once in each (internal linkage: a function with external
// linkage here would itself be one name with two definitions).
#include "abi_mix.hpp"

#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/tier/nvme.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#define ABI_MIX_STRINGIFY_(x) #x
#define ABI_MIX_STRINGIFY(x) ABI_MIX_STRINGIFY_(x)

namespace abi_mix {
namespace {

report round_trip(const std::filesystem::path& directory, unsigned seed, const meanwhile_fn& meanwhile) {
  using namespace chunkwise;
  report out;
  out.abi = ABI_MIX_STRINGIFY(CHUNKWISE_ABI);
#if CHUNKWISE_HAS_URING
  out.built_with_uring = true;
#endif
  out.tier_bytes = sizeof(nvme_tier);
  try {
    constexpr byte_count block = 64 * KiB;
    nvme_options options;
    options.directory = directory;
    options.capacity = 2 * block;
    options.block_bytes = block;
    options.io_bytes = 16 * KiB;  // four requests per block
    nvme_tier store(options);
    out.io_path = store.io_path() == nvme_io_path::io_uring ? "io_uring" : "threads";
    out.describe = store.describe();

    // O_DIRECT buffers: aligned to the store's io_alignment.
    const auto buffer = [&] {
      return std::unique_ptr<unsigned char, decltype(&std::free)>(
          static_cast<unsigned char*>(std::aligned_alloc(nvme_tier::io_alignment, block)), &std::free);
    };
    auto written = buffer();
    auto read = buffer();
    std::mt19937 rng(seed);
    for (byte_count i = 0; i < block; ++i) written.get()[i] = static_cast<unsigned char>(rng());
    std::memset(read.get(), 0, block);

    const nvme_block b = store.allocate_sync(block);
    store.write(b, written.get(), block);
    if (meanwhile) meanwhile();
    store.read(b, read.get(), block);
    store.deallocate_sync(b, block);
    out.exact = std::memcmp(written.get(), read.get(), block) == 0;
  } catch (const chunkwise::error& e) {
    out.error = e.what();
  }
  return out;
}

}  // namespace
}  // namespace abi_mix
