// house_abi_mix, the half built without the io_uring component (chunkwise::chunkwise only).
#if defined(CHUNKWISE_HAS_URING)
#error "abi_mix_plain.cpp is the half without io_uring: build it without chunkwise::uring"
#endif
#include "abi_mix_round_trip.hpp"

abi_mix::report abi_mix::round_trip_without_uring(const std::filesystem::path& directory, unsigned seed,
                                                  const meanwhile_fn& meanwhile) {
  return round_trip(directory, seed, meanwhile);
}
