#pragma once
// house_abi_mix: one program, two translation units that include chunkwise/tier/nvme.hpp, one built with the io_uring
// component (CHUNKWISE_HAS_URING) and one without. nvme_tier's members differ between them (an io_uring ring or a
// thread pool), so without the inline ABI namespace (core/abi.hpp) the program would hold two definitions of one
// class and the linker would keep either one's inline members for both: an ODR violation. With it, each translation
// unit has its own chunkwise::abi1_uringN::nvme_tier and both work. Only plain types cross between the two.
#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>

namespace abi_mix {

/// What one translation unit saw: its ABI namespace, its nvme_tier, the I/O path its store used and the round trip.
struct report {
  std::string abi;            // the inline namespace chunkwise lives in here: "abi1_uring1" or "abi1_uring0"
  bool built_with_uring = false;
  std::size_t tier_bytes = 0;  // sizeof(nvme_tier) in this translation unit
  std::string io_path;        // "io_uring" or "threads"
  std::string describe;       // nvme_tier::describe()
  bool exact = false;         // the block read back equals the block written, byte for byte
  std::string error;          // what a chunkwise::error said, if one was thrown
};

/// Writes one block of `seed`'s bytes into an nvme_tier in `directory`, runs `meanwhile` (the other half, so that
/// both stores are open at once), reads the block back and compares.
using meanwhile_fn = std::function<void()>;
report round_trip_with_uring(const std::filesystem::path& directory, unsigned seed,
                             const meanwhile_fn& meanwhile);  // abi_mix_uring.cpp
report round_trip_without_uring(const std::filesystem::path& directory, unsigned seed,
                                const meanwhile_fn& meanwhile);  // abi_mix_plain.cpp

}  // namespace abi_mix
