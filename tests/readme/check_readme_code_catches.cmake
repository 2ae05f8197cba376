# The negative self-test of check_readme_code.cmake (ctest readme_code_compiles_catches): on tests/readme/fixture/
# README.md, whose third ```cpp block calls a function that does not exist, the check must fail naming that block by
# its first line (22), the compiler must name the line of the error in the Markdown file (25, through `#line`), and
# the complete file and the other fragment must compile.
#   cmake -DWORK_DIR=/tmp/catches -DGENERATOR=Ninja [-DCXX=g++] [-DMAKE_PROGRAM=ninja] -P tests/readme/check_readme_code_catches.cmake
cmake_minimum_required(VERSION 3.25)
get_filename_component(_source_root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
set(_fixture "${CMAKE_CURRENT_LIST_DIR}/fixture/README.md")
execute_process(
  COMMAND "${CMAKE_COMMAND}" "-DMARKDOWN=${_fixture}" "-DSOURCE_DIR=${_source_root}" "-DWORK_DIR=${WORK_DIR}"
          "-DGENERATOR=${GENERATOR}" "-DCXX=${CXX}" "-DMAKE_PROGRAM=${MAKE_PROGRAM}"
          -P "${CMAKE_CURRENT_LIST_DIR}/check_readme_code.cmake"
  RESULT_VARIABLE _result OUTPUT_VARIABLE _output ERROR_VARIABLE _output)
message(STATUS "the check said on the fixture:\n${_output}")
if(_result EQUAL 0)
  message(FATAL_ERROR "check_readme_code passed ${_fixture}, whose block at line 22 does not compile")
endif()
foreach(_expected
    "${_fixture}:22: the ```cpp block that starts here does not compile"
    "${_fixture}:25:"
    "1 of 3 ```cpp blocks of ${_fixture} do not compile: the blocks at lines 22"
    "${_fixture}:7: the ```cpp block compiles"
    "${_fixture}:12: the ```cpp block compiles")
  string(FIND "${_output}" "${_expected}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "check_readme_code's output on ${_fixture} lacks\n  ${_expected}")
  endif()
endforeach()
message(STATUS "check_readme_code names the block that does not compile, and its error's line")
