#pragma once
// The inline ABI namespace. Every chunkwise name lives in `chunkwise::CHUNKWISE_ABI`, an inline namespace whose spelling
// records the optional components that change a definition. Code names `chunkwise::x` as always; the linker sees
// `chunkwise::abi1_uring1::x`. Two translation units of one program built with and without such a component then
// hold two distinct types instead of one name with two layouts (an ODR violation the linker would silently resolve to
// either, as libstdc++'s `_GLIBCXX_USE_CXX11_ABI` and CCCL's `THRUST_NS_QUALIFIER` avoid in the same way).
//
// Keyed components, and why:
//   CHUNKWISE_HAS_URING  nvme_tier's members (an io_uring ring or a thread pool) differ with it.
// CHUNKWISE_HAS_CUDA/NCCL/MPI only add declarations (the `.cuh` headers, `mpi_comm`): a program may mix translation
// units with and without them and pass chunkwise types between them, so they are not keyed.
// A header whose definition comes to depend on a component adds the component here.

#if CHUNKWISE_HAS_URING
#define CHUNKWISE_ABI abi1_uring1
#else
#define CHUNKWISE_ABI abi1_uring0
#endif
