#pragma once
// The inline ABI namespace, for the definitions that differ with an optional component. `nvme_tier`'s members and
// code differ with CHUNKWISE_HAS_URING (an io_uring ring or a pread/pwrite pool), and so do the classes and functions
// that hold or drive one. Those headers open `namespace chunkwise::inline CHUNKWISE_ABI`, whose name records the
// component: code names `chunkwise::nvme_tier` as always, the linker sees `chunkwise::abi1_uring1::nvme_tier`. Two
// translation units of one program built with and without io_uring then hold two distinct types instead of one name
// with two layouts, an ODR violation the linker would silently resolve to either (libstdc++'s dual string ABI avoids
// the same with its `__cxx11` inline namespace).
//
// A keyed header's details go to `namespace chunkwise::detail::inline CHUNKWISE_ABI`, never to a `detail` inside the
// keyed namespace: a second `detail` there would make every plain header's `namespace detail {` ambiguous.
//
// Everything else, chunkwise::error above all, stays in plain `namespace chunkwise`, so the same types pass between
// such translation units: an error thrown by io_uring code is caught as chunkwise::error by code built without it.
//
// The rule, enforced by tests/house/check_includes.cmake (ctest house_include_arrows): a header that tests a keyed
// component's macro, or includes a header that opens the keyed namespace, opens it too. Keyed today:
//   CHUNKWISE_HAS_URING  tier/nvme.hpp; runtime/runtime.hpp, runtime/home_storage.hpp, runtime/detail/assembly.hpp
//                        and runtime/detail/streamed_homes.hpp (NVMe homes);
//                        measure/ (it measures the NVMe tier; its specialisations follow its primary template).
// CHUNKWISE_HAS_CUDA/NCCL/MPI/JSON only add declarations (the .cuh headers, mpi_comm, the JSON headers the umbrellas
// include), so they are not keyed.

#if CHUNKWISE_HAS_URING
#define CHUNKWISE_ABI abi1_uring1
#else
#define CHUNKWISE_ABI abi1_uring0
#endif
