# ctest train_gpt2_calibration: the passes' compute rate is measured once and then read from the cache beside the
# machine profile; a cached rate that mispredicts the step is named at the end of the run with --recalibrate as the
# way out; --recalibrate measures again and replaces it. In a cache of its own (a copy of MEASURE_CACHE's machine
# profile where there is one), so that no other test's run reads or writes the rates it changes.
#   cmake -DTRAINER=build/examples/train_gpt2/train_gpt2 -DWORK_DIR=/tmp/calibration -DMEASURE_CACHE=/tmp/cache
#         -P tests/examples/train_gpt2_calibration.cmake
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/cache")
file(GLOB _profiles "${MEASURE_CACHE}/machine-*.json")
if(_profiles)
  file(COPY ${_profiles} DESTINATION "${WORK_DIR}/cache")
endif()

# Runs the trainer (3 steps of a tiny model) with ARGN; fails unless it succeeds and prints every regex in EXPECT.
function(run_trainer)
  cmake_parse_arguments(PARSE_ARGV 0 _run "" "" "EXPECT;FLAGS")
  execute_process(COMMAND "${TRAINER}" --steps 3 --eval-every 3 --layers 1 --channels 48 --batch 2 --matmul loops
                          --measure-cache "${WORK_DIR}/cache" ${_run_FLAGS}
                  RESULT_VARIABLE _result OUTPUT_VARIABLE _output ERROR_VARIABLE _errors)
  message(STATUS "train_gpt2 ${_run_FLAGS}:\n${_errors}${_output}")
  if(NOT _result EQUAL 0)
    message(FATAL_ERROR "train_gpt2 ${_run_FLAGS} failed (exit status ${_result})")
  endif()
  foreach(_expected IN LISTS _run_EXPECT)
    if(NOT _output MATCHES "${_expected}")
      message(FATAL_ERROR "train_gpt2 ${_run_FLAGS}: its output lacks '${_expected}'")
    endif()
  endforeach()
endfunction()

set(_rate "compute: [^\n]* GFLOP/s per rank [^\n]*")
run_trainer(EXPECT "${_rate}measured now, cached in [^\n]*/rates-host-[0-9a-f]+\\.json\n")
run_trainer(EXPECT "${_rate}measured 20[0-9-]+ [0-9:]+ UTC \\(cached. --recalibrate measures again\\)\n")

# A rate far above the machine's (as if cached in a fast phase): the step takes many times the prediction.
file(GLOB _rates "${WORK_DIR}/cache/rates-*.json")
list(LENGTH _rates _files)
if(NOT _files EQUAL 1)
  message(FATAL_ERROR "expected one rates file in ${WORK_DIR}/cache, found ${_files}")
endif()
file(READ "${_rates}" _document)
string(JSON _count LENGTH "${_document}" rates)
if(NOT _count EQUAL 1)
  message(FATAL_ERROR "expected one cached rate in ${_rates}, found ${_count}")
endif()
string(JSON _document SET "${_document}" rates 0 value "1e14")
file(WRITE "${_rates}" "${_document}")
run_trainer(EXPECT "${_rate}measured [^\n]*\\(cached"
                   "\nthe median step is [0-9.]+x the prediction, whose compute rate is the one cached at 20[0-9-]+ "
                   "--recalibrate measures it again\n")
run_trainer(FLAGS --recalibrate EXPECT "${_rate}measured now, cached in ")
file(READ "${_rates}" _document)
string(JSON _value GET "${_document}" rates 0 value)
if(_value STREQUAL "1e14" OR _value MATCHES "^1(\\.0*)?e\\+?14$" OR _value STREQUAL "100000000000000")
  message(FATAL_ERROR "--recalibrate left the inflated rate in ${_rates}: ${_value}")
endif()
