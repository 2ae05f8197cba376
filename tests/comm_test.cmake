# comm_test hook: with the MPI component, a second binary (tests/mpi/comm_mpi_test.cpp) runs as 2 processes under
# mpiexec: ctest entry comm_mpi. Open MPI refuses to run as root (CI containers) and refuses more processes than
# detected cores; the environment below is its equivalent of --allow-run-as-root --oversubscribe, and other MPIs
# ignore it. Open MPI's own allocations look leaked to LeakSanitizer at exit (sanitizer builds): leak checking is off
# for this test only; the thread_comm tests check our code for leaks. The two processes share one machine: shared
# memory only (btl self,vader, without the ptrace-based single copy that containers forbid), which also keeps
# ThreadSanitizer away from a lock-order report inside Open MPI's TCP transport.
if(TARGET chunkwise::mpi)
  add_executable(chunkwise_comm_mpi_test ${CMAKE_CURRENT_SOURCE_DIR}/mpi/comm_mpi_test.cpp)
  target_include_directories(chunkwise_comm_mpi_test PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(chunkwise_comm_mpi_test PRIVATE doctest::doctest chunkwise::mpi chunkwise_dev_flags)
  add_test(NAME comm_mpi
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:chunkwise_comm_mpi_test> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(comm_mpi PROPERTIES TIMEOUT 120 PROCESSORS 2 ENVIRONMENT
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;ASAN_OPTIONS=detect_leaks=0;\
OMPI_MCA_btl=self,vader;OMPI_MCA_btl_vader_single_copy_mechanism=none")
endif()
