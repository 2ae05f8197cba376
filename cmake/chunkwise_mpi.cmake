# Optional MPI component: chunkwise::mpi adds CHUNKWISE_HAS_MPI=1 and links MPI::MPI_CXX, so that
# chunkwise/comm/mpi_comm.hpp compiles to the mpi_comm communicator (and to nothing without it).
# On by default where find_package(MPI) finds a C++ MPI (Debian: libopenmpi-dev openmpi-bin).
# Included from the top-level CMakeLists.txt after the other components; appends to chunkwise_export_targets.
find_package(MPI QUIET COMPONENTS CXX)
option(CHUNKWISE_MPI "Build the MPI communicator component (chunkwise::mpi)" ${MPI_CXX_FOUND})
if(CHUNKWISE_MPI)
  if(NOT MPI_CXX_FOUND)
    find_package(MPI REQUIRED COMPONENTS CXX)  # reports what is missing
  endif()
  add_library(chunkwise_mpi INTERFACE)
  add_library(chunkwise::mpi ALIAS chunkwise_mpi)
  set_target_properties(chunkwise_mpi PROPERTIES EXPORT_NAME mpi)
  target_compile_definitions(chunkwise_mpi INTERFACE CHUNKWISE_HAS_MPI=1)
  target_link_libraries(chunkwise_mpi INTERFACE chunkwise MPI::MPI_CXX)
  list(APPEND chunkwise_export_targets chunkwise_mpi)
endif()
