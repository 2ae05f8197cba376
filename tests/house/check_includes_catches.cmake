# The negative self-tests of check_includes.cmake (ctest house_include_arrows_catches): run on fixture trees against
# the real docs/architecture.md, the check must fail and name the refused line by file and line.
#   - tests/house/fixture/: one include the arrows table refuses among allowed ones; exactly that one is refused;
#   - tests/house/fixture_abi/: a header that tests CHUNKWISE_HAS_URING outside the inline ABI namespace.
#   cmake -P tests/house/check_includes_catches.cmake
cmake_minimum_required(VERSION 3.25)

get_filename_component(_source_root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

# Runs the check on FIXTURE's include tree; fails unless the check fails with EXPECTED in its output. Sets
# ${OUT_REFUSED} to how many lines it refused.
function(expect_refusal fixture expected out_refused)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -DINCLUDE_DIR=${CMAKE_CURRENT_LIST_DIR}/${fixture}/include
            -DDOC=${_source_root}/docs/architecture.md -DROOT=${_source_root}
            -P ${CMAKE_CURRENT_LIST_DIR}/check_includes.cmake
    RESULT_VARIABLE _result OUTPUT_VARIABLE _output ERROR_VARIABLE _output)
  message(STATUS "the check said on ${fixture}:\n${_output}")
  if(_result EQUAL 0)
    message(FATAL_ERROR "check_includes passed ${fixture}, which holds a line it must refuse:\n  ${expected}")
  endif()
  string(FIND "${_output}" "${expected}" _at)
  if(_at LESS 0)
    message(FATAL_ERROR "check_includes failed on ${fixture}, but without the line\n  ${expected}")
  endif()
  string(REGEX MATCHALL "\\.hpp:[0-9]+: " _refused "${_output}")
  list(LENGTH _refused _count)
  set(${out_refused} ${_count} PARENT_SCOPE)
endfunction()

expect_refusal(fixture "tests/house/fixture/include/chunkwise/layout/wrong_arrow.hpp:9: layout may not include runtime (chunkwise/runtime/runtime.hpp)" _count)
if(NOT _count EQUAL 1)
  message(FATAL_ERROR "check_includes refused ${_count} includes of the fixture tree; exactly one is wrong")
endif()
expect_refusal(fixture_abi "tests/house/fixture_abi/include/chunkwise/tier/unkeyed_store.hpp:7: tests CHUNKWISE_HAS_URING but declares outside the ABI namespace" _count)
message(STATUS "check_includes refuses the fixtures' wrong lines: a wrong arrow, and a header outside the ABI namespace")
