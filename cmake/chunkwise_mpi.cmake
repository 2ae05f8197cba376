# Optional MPI component: chunkwise::mpi adds CHUNKWISE_HAS_MPI=1 and links MPI::MPI_CXX, so that
# chunkwise/comm/mpi_comm.hpp compiles to the mpi_comm communicator (and to nothing without it).
# On by default where find_package(MPI) finds a C++ MPI (Debian: libopenmpi-dev openmpi-bin).
# Included from the top-level CMakeLists.txt after the other components; appends to chunkwise_components.
find_package(MPI QUIET COMPONENTS CXX)
# Not an option() with the detection as its default: that is cached at the first configure, so a build directory
# configured before Open MPI was installed (Quick start line 1, then line 2) would never build it. -DCHUNKWISE_MPI=ON/OFF
# still decides.
if(NOT DEFINED CACHE{CHUNKWISE_MPI})
  set(CHUNKWISE_MPI ${MPI_CXX_FOUND})
endif()
if(CHUNKWISE_MPI)
  if(NOT MPI_CXX_FOUND)
    find_package(MPI REQUIRED COMPONENTS CXX)  # reports what is missing
  endif()
  chunkwise_add_component(mpi CHUNKWISE_HAS_MPI chunkwise MPI::MPI_CXX)
endif()
