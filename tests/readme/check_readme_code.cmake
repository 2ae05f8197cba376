# Compiles every ```cpp block of a Markdown file (ctest readme_code_compiles: README.md), so the code a reader copies
# cannot drift from the library. Each block becomes a translation unit of its own in a generated CMake project that
# takes chunkwise by add_subdirectory with the JSON component and no other (as a host-only user builds it: the
# README loads profiles from JSON), is built and linked against chunkwise::chunkwise and chunkwise::json (never run),
# and a block that fails is named by its line in the Markdown file.
#
# The convention for blocks:
#   - a block that defines `main` is a complete file and is compiled as written;
#   - any other block is a fragment: its leading lines that are preprocessor directives, `using` declarations,
#     comments or blank stay at file scope, and the rest becomes the body of a function, so it may hold statements
#     (`std::cout << ...;`) as well as declarations (`constexpr auto x = ...; static_assert(...);`);
#   - only fences opened with exactly ```cpp are compiled; write ``` or ```text for a block that is not C++.
# `#line` directives map every line back to the Markdown file, so the compiler's own messages name its lines.
#
#   cmake -DMARKDOWN=README.md -DSOURCE_DIR=. -DWORK_DIR=/tmp/readme -DGENERATOR=Ninja [-DCXX=g++]
#         [-DMAKE_PROGRAM=ninja] -P tests/readme/check_readme_code.cmake
cmake_minimum_required(VERSION 3.25)
foreach(_required MARKDOWN SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${_required})
    message(FATAL_ERROR "check_readme_code.cmake: give -D${_required}=...")
  endif()
endforeach()
get_filename_component(MARKDOWN "${MARKDOWN}" ABSOLUTE)
get_filename_component(SOURCE_DIR "${SOURCE_DIR}" ABSOLUTE)

# The number of newlines in TEXT. (The Markdown is never split into a CMake list: C++ is full of `;` and `[`.)
function(count_newlines out text)
  string(REGEX REPLACE "[^\n]" "" _newlines "${text}")
  string(LENGTH "${_newlines}" _count)
  set(${out} ${_count} PARENT_SCOPE)
endfunction()

# The translation unit of a block whose first line is line FIRST of the Markdown file.
function(translation_unit out code first)
  if(code MATCHES "(^|\n)[ \t]*int[ \t]+main[ \t]*\\(")
    set(${out} "#line ${first} \"${MARKDOWN}\"\n${code}\n" PARENT_SCOPE)
    return()
  endif()
  set(_preamble "")
  set(_body "${code}")
  set(_body_line ${first})
  while(NOT _body STREQUAL "")
    string(FIND "${_body}" "\n" _newline)
    if(_newline EQUAL -1)
      set(_line "${_body}")
    else()
      string(SUBSTRING "${_body}" 0 ${_newline} _line)
    endif()
    if(NOT _line MATCHES "^[ \t]*(#|using[ \t]|//|$)")
      break()
    endif()
    string(APPEND _preamble "${_line}\n")
    math(EXPR _body_line "${_body_line} + 1")
    if(_newline EQUAL -1)
      set(_body "")
    else()
      math(EXPR _newline "${_newline} + 1")
      string(SUBSTRING "${_body}" ${_newline} -1 _body)
    endif()
  endwhile()
  set(${out} "#line ${first} \"${MARKDOWN}\"\n${_preamble}void markdown_block() {\n#line ${_body_line} \"${MARKDOWN}\"\n${_body}\n}\nint main() { markdown_block(); }\n" PARENT_SCOPE)
endfunction()

# Find the blocks: FIRSTS holds each block's first line; the code goes straight to its file.
file(REMOVE_RECURSE "${WORK_DIR}")
file(READ "${MARKDOWN}" _text)
set(_rest "\n${_text}")  # a leading newline, so that a fence always follows one; _rest starts on line _line
set(_line 0)
set(_firsts)
while(TRUE)
  string(FIND "${_rest}" "\n```cpp\n" _at)
  if(_at EQUAL -1)
    break()
  endif()
  string(SUBSTRING "${_rest}" 0 ${_at} _before)
  count_newlines(_skipped "${_before}")
  math(EXPR _first "${_line} + ${_skipped} + 2")  # the fence is on the line after _before's last; code follows
  math(EXPR _start "${_at} + 8")
  string(SUBSTRING "${_rest}" ${_start} -1 _rest)
  string(FIND "\n${_rest}" "\n```" _end)  # the closing fence, at the start of a line
  if(_end EQUAL -1)
    message(FATAL_ERROR "${MARKDOWN}:${_first}: this ```cpp block is never closed")
  endif()
  if(_end EQUAL 0)
    set(_code "")
  else()
    math(EXPR _length "${_end} - 1")
    string(SUBSTRING "${_rest}" 0 ${_length} _code)
  endif()
  translation_unit(_unit "${_code}" ${_first})
  file(WRITE "${WORK_DIR}/project/block_${_first}.cpp" "${_unit}")
  list(APPEND _firsts ${_first})
  string(SUBSTRING "${_rest}" 0 ${_end} _inside)
  count_newlines(_inside_lines "${_inside}")
  math(EXPR _line "${_first} + ${_inside_lines}")  # the closing fence's line
  string(SUBSTRING "${_rest}" ${_end} -1 _rest)
endwhile()
list(LENGTH _firsts _count)
if(_count EQUAL 0)
  message(FATAL_ERROR "${MARKDOWN} has no ```cpp block: nothing to compile (is the fence written ```cpp?)")
endif()

set(_project "cmake_minimum_required(VERSION 3.25)\nproject(markdown_code LANGUAGES CXX)\n")
string(APPEND _project "add_subdirectory(\"${SOURCE_DIR}\" chunkwise)\n")
foreach(_first IN LISTS _firsts)
  string(APPEND _project "add_executable(block_${_first} block_${_first}.cpp)\n")
  string(APPEND _project "target_link_libraries(block_${_first} PRIVATE chunkwise::chunkwise)\n")
  string(APPEND _project "if(TARGET chunkwise::json)\n  target_link_libraries(block_${_first} PRIVATE chunkwise::json)\nendif()\n")
endforeach()
file(WRITE "${WORK_DIR}/project/CMakeLists.txt" "${_project}")

set(_configure "${CMAKE_COMMAND}" -S "${WORK_DIR}/project" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCHUNKWISE_CUDA=OFF -DCHUNKWISE_NCCL=OFF -DCHUNKWISE_URING=OFF -DCHUNKWISE_MPI=OFF -DCHUNKWISE_JSON=ON)
if(CXX)
  list(APPEND _configure "-DCMAKE_CXX_COMPILER=${CXX}")
endif()
if(MAKE_PROGRAM)
  list(APPEND _configure "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
execute_process(COMMAND ${_configure} RESULT_VARIABLE _result OUTPUT_VARIABLE _output ERROR_VARIABLE _output)
if(NOT _result EQUAL 0)
  message(FATAL_ERROR "configuring the project of ${MARKDOWN}'s blocks failed:\n${_output}")
endif()

set(_failed)
foreach(_first IN LISTS _firsts)
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" --target block_${_first}
                  RESULT_VARIABLE _result OUTPUT_VARIABLE _output ERROR_VARIABLE _output)
  if(_result EQUAL 0)
    message(STATUS "${MARKDOWN}:${_first}: the ```cpp block compiles")
  else()
    message("${MARKDOWN}:${_first}: the ```cpp block that starts here does not compile:\n${_output}")
    list(APPEND _failed ${_first})
  endif()
endforeach()
list(LENGTH _failed _failures)
if(_failures GREATER 0)
  list(JOIN _failed ", " _lines)
  # Once unwrapped (a FATAL_ERROR message is wrapped at spaces), for readers and for the self-test.
  message("${_failures} of ${_count} ```cpp blocks of ${MARKDOWN} do not compile: the blocks at lines ${_lines}")
  message(FATAL_ERROR "${_failures} of ${_count} ```cpp blocks do not compile (above: their lines, and the compiler's)")
endif()
message(STATUS "all ${_count} ```cpp blocks of ${MARKDOWN} compile")
