# The negative self-test of check_includes.cmake (ctest house_include_arrows_catches): run on the fixture tree
# (tests/house/fixture/include, one refused include among allowed ones) against the real docs/architecture.md, the
# check must fail, name the refused include by file and line, and refuse nothing else.
#   cmake -P tests/house/check_includes_catches.cmake
cmake_minimum_required(VERSION 3.25)

get_filename_component(_source_root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
set(_expected "tests/house/fixture/include/chunkwise/layout/wrong_arrow.hpp:9: layout may not include runtime (chunkwise/runtime/runtime.hpp)")

execute_process(
  COMMAND ${CMAKE_COMMAND} -DINCLUDE_DIR=${CMAKE_CURRENT_LIST_DIR}/fixture/include
          -DDOC=${_source_root}/docs/architecture.md -DROOT=${_source_root}
          -P ${CMAKE_CURRENT_LIST_DIR}/check_includes.cmake
  RESULT_VARIABLE _result OUTPUT_VARIABLE _output ERROR_VARIABLE _output)

message(STATUS "the check said:\n${_output}")
if(_result EQUAL 0)
  message(FATAL_ERROR "check_includes passed the fixture tree, which holds an include the table refuses")
endif()
string(FIND "${_output}" "${_expected}" _at)
if(_at LESS 0)
  message(FATAL_ERROR "check_includes failed, but without the line\n  ${_expected}")
endif()
string(REGEX MATCHALL "\\.hpp:[0-9]+: " _refused "${_output}")
list(LENGTH _refused _count)
if(NOT _count EQUAL 1)
  message(FATAL_ERROR "check_includes refused ${_count} includes of the fixture tree; exactly one is wrong")
endif()
message(STATUS "check_includes refuses the fixture's wrong include, and only it")

# The inline ABI namespace rule, on a second fixture: a header that tests CHUNKWISE_HAS_URING outside the keyed
# namespace (core/abi.hpp) is refused by file and line.
set(_expected_abi "tests/house/fixture_abi/include/chunkwise/tier/unkeyed_store.hpp:7: tests CHUNKWISE_HAS_URING but declares outside the ABI namespace")
execute_process(
  COMMAND ${CMAKE_COMMAND} -DINCLUDE_DIR=${CMAKE_CURRENT_LIST_DIR}/fixture_abi/include
          -DDOC=${_source_root}/docs/architecture.md -DROOT=${_source_root}
          -P ${CMAKE_CURRENT_LIST_DIR}/check_includes.cmake
  RESULT_VARIABLE _result OUTPUT_VARIABLE _output ERROR_VARIABLE _output)
message(STATUS "the check said:\n${_output}")
if(_result EQUAL 0)
  message(FATAL_ERROR "check_includes passed a header that tests CHUNKWISE_HAS_URING outside the ABI namespace")
endif()
string(FIND "${_output}" "${_expected_abi}" _at)
if(_at LESS 0)
  message(FATAL_ERROR "check_includes failed, but without the line\n  ${_expected_abi}")
endif()
message(STATUS "check_includes refuses a component-dependent header outside the ABI namespace")
