// house_abi_mix, the half built with the io_uring component (chunkwise::uring: CHUNKWISE_HAS_URING=1).
#if !CHUNKWISE_HAS_URING
#error "abi_mix_uring.cpp is the half with io_uring: build it with chunkwise::uring"
#endif
#include "abi_mix_round_trip.hpp"

abi_mix::report abi_mix::round_trip_with_uring(const std::filesystem::path& directory, unsigned seed,
                                               const meanwhile_fn& meanwhile) {
  return round_trip(directory, seed, meanwhile);
}
