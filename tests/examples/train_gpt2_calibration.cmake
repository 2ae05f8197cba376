# ctest train_gpt2_calibration: the passes' compute rate is measured once and then read from the cache beside the
# machine profile; a cached rate that mispredicts the step is named at the end of the run with --recalibrate as the
# way out; --recalibrate measures again and replaces it. The NVMe drive's speed a run observed is kept there too,
# and planned with by the next run. In a cache of its own (a copy of MEASURE_CACHE's machine
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

# Runs the trainer (3 steps of a tiny model, unless FLAGS say otherwise) with FLAGS; fails unless it succeeds and
# prints every regex in EXPECT. Its output is left in _trainer_output.
function(run_trainer)
  cmake_parse_arguments(PARSE_ARGV 0 _run "" "" "EXPECT;FLAGS")
  execute_process(COMMAND "${TRAINER}" --steps 3 --eval-every 3 --layers 1 --channels 48 --batch 2 --matmul loops
                          --measure-cache "${WORK_DIR}/cache" ${_run_FLAGS}
                  RESULT_VARIABLE _result OUTPUT_VARIABLE _output ERROR_VARIABLE _errors)
  message(STATUS "train_gpt2 ${_run_FLAGS}:\n${_errors}${_output}")
  if(NOT _result EQUAL 0)
    message(FATAL_ERROR "train_gpt2 ${_run_FLAGS} failed (exit status ${_result})")
  endif()
  set(_trainer_output "${_output}" PARENT_SCOPE)
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

# The NVMe drive's speed under a run's own traffic (one rank, the drive busy a second or more) is kept beside the
# rates, and the next run on that drive plans with it; --recalibrate plans with the profile's rates. The trainer's
# default shape streams enough through the drive in 30 steps (2 s busy here); on a drive so fast that it does not,
# the run says so and keeps nothing.
file(MAKE_DIRECTORY "${WORK_DIR}/nvme")
set(_nvme --plan "min_waste/cached<nvme>/sharded/follows_home" --nvme-dir "${WORK_DIR}/nvme" --steps 30
          --eval-every 30 --layers 8 --channels 256 --matmul auto)
string(CONCAT _speed "NVMe drive speed: at the profile's rates for [^\n]* blocks \\(read [0-9.]+, write [0-9.]+ "
                     "GB/s\\) these bytes take [0-9.]+ s, the drive was busy [0-9.]+ s: ([0-9.]+)x the profile")
run_trainer(FLAGS ${_nvme} EXPECT "${_speed}")
if(_trainer_output MATCHES "${_speed}; the next run on this drive plans with ([0-9.]+)x \\(kept in [^\n]*/rates-host-")
  if(NOT CMAKE_MATCH_1 STREQUAL CMAKE_MATCH_2)
    message(FATAL_ERROR "the first observation of the drive is kept as it is: ${CMAKE_MATCH_1}, kept ${CMAKE_MATCH_2}")
  endif()
  set(_observed "${CMAKE_MATCH_2}")
  string(CONCAT _planned "\nNVMe drive: planned at ${_observed}x the machine profile's rates, as runs on this drive "
                        "observed it, the last at 20[0-9-]+ [0-9:]+ UTC \\(--recalibrate plans with the profile's\\)\n")
  # A run that planned with the kept speed keeps the geometric mean of it and what it observes.
  run_trainer(FLAGS ${_nvme} EXPECT "${_planned}")
  if(NOT _trainer_output MATCHES "${_speed}; the next run on this drive plans with ([0-9.]+)x, between this and the")
    message(FATAL_ERROR "the second run's drive speed is not kept, or not as the mean of two")
  endif()
  # kept = sqrt(planned x observed), in hundredths (CMake has no floating point; each figure is rounded to one).
  string(REPLACE "." "" _p "${_observed}")
  string(REPLACE "." "" _o "${CMAKE_MATCH_1}")
  string(REPLACE "." "" _k "${CMAKE_MATCH_2}")
  math(EXPR _product "${_p} * ${_o}")
  math(EXPR _low "(${_k} - 2) * (${_k} - 2)")
  math(EXPR _high "(${_k} + 2) * (${_k} + 2)")
  if(_product LESS _low OR _product GREATER _high)
    message(FATAL_ERROR "kept ${CMAKE_MATCH_2}x, not the geometric mean of ${_observed}x and ${CMAKE_MATCH_1}x")
  endif()
  run_trainer(FLAGS ${_nvme} --recalibrate EXPECT "${_speed}")
  if(_trainer_output MATCHES "NVMe drive: planned at")
    message(FATAL_ERROR "--recalibrate planned with the observed drive speed, not the profile's")
  endif()
elseif(NOT _trainer_output MATCHES "${_speed}; too little drive time to keep\n")
  message(FATAL_ERROR "the NVMe run neither kept its drive speed nor said why not")
endif()
