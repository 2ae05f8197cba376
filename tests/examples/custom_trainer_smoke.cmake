# ctest custom_trainer_smoke: examples/custom_trainer trains 20 steps on 2 thread ranks and saves a checkpoint, then
# resumes from it on 1 rank under another plan (the checkpoint reshards) for 20 more steps with --check. Passes when
# the loss fell in each run, the second run resumed after step 20 and went on from step 21, and its parameters match
# the plain loop's (mlp::train_plain, 40 steps from the start).
#   cmake -DTRAINER=build/examples/custom_trainer/custom_trainer -DWORK_DIR=/tmp/smoke -DMEASURE_CACHE=/tmp/cache
#         -P tests/examples/custom_trainer_smoke.cmake
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK_DIR}")

# Runs the trainer with ARGN; fails unless it succeeds and its last printed loss is below its first. OUT: its output.
function(run_trainer out)
  list(JOIN ARGN " " _flags)
  execute_process(COMMAND "${TRAINER}" ${ARGN} --checkpoint "${WORK_DIR}/checkpoint" --measure-cache "${MEASURE_CACHE}"
                  RESULT_VARIABLE _result OUTPUT_VARIABLE _output ERROR_VARIABLE _errors)
  message(STATUS "custom_trainer ${_flags}:\n${_errors}${_output}")
  if(NOT _result EQUAL 0)
    message(FATAL_ERROR "custom_trainer ${_flags} failed (exit status ${_result})")
  endif()
  string(REGEX MATCHALL "loss [0-9.]+" _losses "${_output}")
  list(LENGTH _losses _count)
  if(_count LESS 2)
    message(FATAL_ERROR "custom_trainer ${_flags} printed ${_count} loss(es); expected one per 10 steps")
  endif()
  list(GET _losses 0 _first)
  list(GET _losses -1 _last)
  string(REPLACE "loss " "" _first "${_first}")
  string(REPLACE "loss " "" _last "${_last}")
  if(NOT _last LESS _first)
    message(FATAL_ERROR "custom_trainer ${_flags}: the loss did not fall (${_first} at first, ${_last} at the end)")
  endif()
  set(${out} "${_output}" PARENT_SCOPE)
endfunction()

run_trainer(_first_run --steps 20 --ranks 2)
run_trainer(_second_run --steps 40 --ranks 1 --resume --check --plan "min_waste/cached<pinned_host>/sharded/follows_home")
foreach(_expected "resumed from [^\n]* after step 20\n" "\nstep   21/40  loss " "\ncheck: the parameters match ")
  if(NOT _second_run MATCHES "${_expected}")
    message(FATAL_ERROR "the resumed run's output lacks '${_expected}'")
  endif()
endforeach()
message(STATUS "custom_trainer: the loss fell in both runs; the second resumed after step 20 and matches the plain loop")
