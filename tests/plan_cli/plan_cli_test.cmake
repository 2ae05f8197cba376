# ctest plan_cli_<SUITE>: chunkwise-plan (examples/plan/main.cpp) driven from CMake, no Python.
#   cmake -DPLAN=<chunkwise-plan> -DWORK_DIR=<scratch dir> -DSUITE=<suite> -P plan_cli_test.cmake
# Suites:
#   flags       every flag --help documents: a good value and its effect (seen in the JSON), a bad value (exit 2, the
#               message names the flag), a missing value; --help itself; an unknown option; a documented flag this
#               script does not test fails it
#   json        the --json report against docs/plan-json.md: every field present with its type, and consistent
#               (sums, bounds, the chosen plan feasible and faster than the plans before it)
#   exit_codes  0 with a chosen plan, 2 on bad input (no JSON on stdout), 3 when no plan fits: the message names the
#               closest plan and the memory it needs, in text and in JSON (no_fit, and on stderr)
#   measure     --measure with --measure-cache and --nvme-dir: measured once (seconds), then read from the cache
# Every failed check is reported; the script fails at the end if any did.
cmake_minimum_required(VERSION 3.25)
foreach(_var PLAN WORK_DIR SUITE)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "plan_cli_test: set -D${_var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set_property(GLOBAL PROPERTY plan_cli_failures "")
set_property(GLOBAL PROPERTY plan_cli_checks 0)

function(fail text)
  message(NOTICE "FAIL: ${text}")
  set_property(GLOBAL APPEND PROPERTY plan_cli_failures "${text}")
endfunction()
function(count_check)
  get_property(_n GLOBAL PROPERTY plan_cli_checks)
  math(EXPR _n "${_n} + 1")
  set_property(GLOBAL PROPERTY plan_cli_checks ${_n})
endfunction()

# run_plan(<case> EXPECT <rc> [STDOUT_VAR v] [STDERR_VAR v] [OUT_MATCH regex] [ERR_MATCH regex] ARGS ...):
# runs chunkwise-plan with ARGS and checks its exit status and what it printed.
function(run_plan case)
  cmake_parse_arguments(PARSE_ARGV 1 _r "" "EXPECT;STDOUT_VAR;STDERR_VAR;OUT_MATCH;ERR_MATCH" "ARGS")
  execute_process(COMMAND "${PLAN}" ${_r_ARGS} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  count_check()
  string(REPLACE ";" " " _shown "${_r_ARGS}")
  string(SUBSTRING "${_err}" 0 400 _err_head)
  if(NOT _rc STREQUAL "${_r_EXPECT}")
    fail("${case}: chunkwise-plan ${_shown}: exit ${_rc}, expected ${_r_EXPECT}; stderr: ${_err_head}")
  endif()
  if(DEFINED _r_OUT_MATCH AND NOT _out MATCHES "${_r_OUT_MATCH}")
    string(SUBSTRING "${_out}" 0 400 _out_head)
    fail("${case}: chunkwise-plan ${_shown}: stdout does not match '${_r_OUT_MATCH}': ${_out_head}")
  endif()
  if(DEFINED _r_ERR_MATCH AND NOT _err MATCHES "${_r_ERR_MATCH}")
    fail("${case}: chunkwise-plan ${_shown}: stderr does not match '${_r_ERR_MATCH}': ${_err_head}")
  endif()
  if(_r_STDOUT_VAR)
    set(${_r_STDOUT_VAR} "${_out}" PARENT_SCOPE)
  endif()
  if(_r_STDERR_VAR)
    set(${_r_STDERR_VAR} "${_err}" PARENT_SCOPE)
  endif()
endfunction()

# json_get(<var> <json> <path>...): the value at path (a member name or array index per step), or fail.
function(json_get var json)
  string(JSON _value ERROR_VARIABLE _error GET "${json}" ${ARGN})
  if(_error)
    string(REPLACE ";" "." _path "${ARGN}")
    fail("JSON ${_path}: ${_error}")
    set(_value "")
  endif()
  set(${var} "${_value}" PARENT_SCOPE)
endfunction()

# require_json(<json> <what>): stops the suite (with the failures so far) unless <json> is a JSON object.
# Each FIELD:TYPE (TYPE as expect_type takes it) is a top-level member of JSON with that type.
function(expect_fields json)
  foreach(_field_type IN LISTS ARGN)
    string(REPLACE ":" ";" _field_type ${_field_type})
    list(GET _field_type 0 _field)
    list(GET _field_type 1 _type)
    expect_type("${json}" ${_type} ${_field})
  endforeach()
endfunction()

function(require_json json what)
  string(JSON _type ERROR_VARIABLE _error TYPE "${json}")
  if(_error OR NOT _type STREQUAL "OBJECT")
    get_property(_failures GLOBAL PROPERTY plan_cli_failures)
    list(LENGTH _failures _failed)
    message(FATAL_ERROR "plan_cli_${SUITE}: ${what}: stdout is not a JSON object (${_error}); "
                        "${_failed} failures before")
  endif()
endfunction()

# expect_type(<json> <type> <path>...): the field exists and is of <type> (NULL NUMBER STRING BOOLEAN ARRAY OBJECT;
# INTEGER: a NUMBER written without fraction or exponent; STRING_OR_NULL, NUMBER_OR_NULL).
function(expect_type json type)
  count_check()
  string(REPLACE ";" "." _path "${ARGN}")
  string(JSON _type ERROR_VARIABLE _error TYPE "${json}" ${ARGN})
  if(_error)
    fail("JSON ${_path}: missing (${_error})")
    return()
  endif()
  if(type STREQUAL "INTEGER")
    string(JSON _value GET "${json}" ${ARGN})
    if(NOT _type STREQUAL "NUMBER" OR NOT _value MATCHES "^-?[0-9]+$")
      fail("JSON ${_path}: expected an integer, found ${_type} ${_value}")
    endif()
  elseif(type MATCHES "^(.*)_OR_NULL$")
    if(NOT _type STREQUAL CMAKE_MATCH_1 AND NOT _type STREQUAL "NULL")
      fail("JSON ${_path}: expected ${CMAKE_MATCH_1} or null, found ${_type}")
    endif()
  elseif(NOT _type STREQUAL type)
    fail("JSON ${_path}: expected ${type}, found ${_type}")
  endif()
endfunction()

# expect(<description> <if-condition>...): counts a check, fails with the description if the condition is false.
macro(expect description)
  count_check()
  if(NOT (${ARGN}))
    fail("${description}")
  endif()
endmacro()

# GPT-2's parameter count, as profile/gpt2.hpp documents it: V*C + T*C + L*(12*C^2 + 13*C) + 2*C.
function(gpt2_params var layers width vocab context)
  math(EXPR _n "${vocab} * ${width} + ${context} * ${width} + ${layers} * (12 * ${width} * ${width} + 13 * ${width}) + 2 * ${width}")
  set(${var} ${_n} PARENT_SCOPE)
endfunction()

# ---------------------------------------------------------------------------------------------------------------------
if(SUITE STREQUAL "flags")
  # What --help documents, and what this suite tests. A flag added to the usage text must be added here (with a good
  # value, its effect and a bad value) or this check fails.
  set(tested_flags --help -h --model --profile --dtype --micro-batch --layers --d-model --heads --vocab --context
      --save-profile --gpus --ranks --machines --inter-machine --gpu-mem --host-mem --pcie --nvme --nvme-capacity
      --collective --gpu-flops --machine --measure --measure-cache --nvme-dir --save-machine --alignment --tensors --json)
  run_plan(help EXPECT 0 STDOUT_VAR help OUT_MATCH "^usage: chunkwise-plan" ARGS --help)
  run_plan(help EXPECT 0 OUT_MATCH "^usage: chunkwise-plan" ARGS -h)
  string(REGEX MATCHALL "(^|[ ,(])--[a-z][a-z-]*" documented "${help}")
  list(TRANSFORM documented REPLACE "^[ ,(]" "")
  list(REMOVE_DUPLICATES documented)
  foreach(_flag IN LISTS documented)
    expect("--help documents ${_flag}, which plan_cli_flags does not test: add it to tests/plan_cli/plan_cli_test.cmake"
           _flag IN_LIST tested_flags)
  endforeach()
  foreach(_flag IN LISTS tested_flags)
    if(NOT _flag STREQUAL "-h")
      expect("plan_cli_flags tests ${_flag}, which --help does not document" _flag IN_LIST documented)
    endif()
  endforeach()

  # Good values and their effects.
  run_plan(default EXPECT 0 STDOUT_VAR j ARGS --json)
  json_get(default_model "${j}" model)
  json_get(default_params "${j}" params)
  json_get(default_peak "${j}" peak_activation_bytes)
  gpt2_params(p124 12 768 50257 1024)
  expect("the default model is gpt2-124m with ${p124} parameters (got ${default_model}, ${default_params})"
         default_model STREQUAL "gpt2-124m" AND default_params EQUAL p124)

  run_plan(--model EXPECT 0 STDOUT_VAR j ARGS --model gpt2-355m --gpu-mem 80GiB --json)
  json_get(v "${j}" params)
  gpt2_params(p355 24 1024 50257 1024)
  expect("--model gpt2-355m: ${p355} parameters, got ${v}" v EQUAL p355)

  run_plan(--dtype EXPECT 0 STDOUT_VAR j ARGS --dtype bf16 --json)
  json_get(v "${j}" tensor_list 0 dtype)
  json_get(bytes "${j}" tensor_bytes)
  math(EXPR want "2 * ${p124}")
  expect("--dtype bf16: tensors are bf16 (${v}) of 2 bytes each (${bytes} bytes)" v STREQUAL "bf16" AND bytes EQUAL want)

  run_plan(--micro-batch EXPECT 0 STDOUT_VAR j ARGS --micro-batch 1 --json)
  json_get(v "${j}" peak_activation_bytes)
  expect("--micro-batch 1 keeps fewer activations than the default 4 (${v} vs ${default_peak})" v LESS default_peak)

  run_plan(dimensions EXPECT 0 STDOUT_VAR j
           ARGS --layers 2 --d-model 64 --heads 4 --vocab 256 --context 32 --json)
  json_get(v "${j}" params)
  json_get(n "${j}" tensors)
  gpt2_params(want 2 64 256 32)
  expect("--layers 2 --d-model 64 --heads 4 --vocab 256 --context 32: ${want} parameters in 28 tensors, got ${v} in ${n}"
         v EQUAL want AND n EQUAL 28)
  run_plan(--heads EXPECT 0 ARGS --heads 16 --json)  # 768 / 16

  run_plan(--save-profile EXPECT 0 ARGS --model gpt2-355m --gpu-mem 80GiB --save-profile ${WORK_DIR}/m.json)
  expect("--save-profile writes the file" EXISTS ${WORK_DIR}/m.json)
  if(EXISTS ${WORK_DIR}/m.json)
    file(READ ${WORK_DIR}/m.json saved)
    json_get(v "${saved}" format)
    expect("--save-profile writes a chunkwise.model_profile (${v})" v STREQUAL "chunkwise.model_profile")
  endif()
  run_plan(--profile EXPECT 0 STDOUT_VAR j ARGS --profile ${WORK_DIR}/m.json --gpu-mem 80GiB --json)
  json_get(v "${j}" params)
  json_get(name "${j}" model)
  expect("--profile reads back the saved gpt2-355m (${name}, ${v})" v EQUAL p355 AND name STREQUAL "gpt2-355m")

  run_plan(--gpus EXPECT 0 STDOUT_VAR j ARGS --gpus 4 --json)
  json_get(v "${j}" ranks)
  json_get(d "${j}" machine devices)
  expect("--gpus 4: 4 ranks on 4 devices (${v}, ${d})" v EQUAL 4 AND d EQUAL 4)
  run_plan(--ranks EXPECT 0 STDOUT_VAR j ARGS --ranks 2 --json)
  json_get(v "${j}" ranks)
  expect("--ranks 2: 2 ranks (${v})" v EQUAL 2)
  # Two machines of 4 GPUs joined by a slow link: the job has 8 ranks, and hybrid<4> (ZeRO-3 inside each machine,
  # replicated across them) is chosen over sharding across the link.
  run_plan(--machines EXPECT 0 STDOUT_VAR j ARGS --model gpt2-1558m --gpus 4 --machines 2 --inter-machine 1GB/s --json)
  json_get(v "${j}" ranks)
  json_get(m "${j}" machine machines)
  json_get(chosen "${j}" chosen)
  json_get(link "${j}" machine inter_machine 0 bytes_per_second)
  expect("--machines 2 --inter-machine 1GB/s: 8 ranks, 2 machines, 1e9 between, hybrid<4> (${v} ${m} ${link} ${chosen})"
         v EQUAL 8 AND m EQUAL 2 AND link EQUAL 1e9 AND chosen STREQUAL "min_waste/resident/hybrid<4>/follows_home")

  run_plan(--gpu-mem EXPECT 0 STDOUT_VAR j ARGS --gpu-mem 40GiB --json)
  json_get(v "${j}" machine device_memory)
  expect("--gpu-mem 40GiB: device_memory 42949672960 (${v})" v EQUAL 42949672960)
  run_plan(--host-mem EXPECT 0 STDOUT_VAR j ARGS --host-mem 32GiB --json)
  json_get(v "${j}" machine host_memory)
  expect("--host-mem 32GiB: host_memory 34359738368 (${v})" v EQUAL 34359738368)
  run_plan(--pcie EXPECT 0 STDOUT_VAR j ARGS --pcie 8GB/s --json)
  json_get(up "${j}" machine host_to_device_bytes_per_second)
  json_get(down "${j}" machine device_to_host_bytes_per_second)
  json_get(bus "${j}" machine all_gather 0 bytes_per_second)
  expect("--pcie 8GB/s: 8e9 both ways, collectives at 80% (${up}, ${down}, ${bus})"
         up EQUAL 8e9 AND down EQUAL 8e9 AND bus EQUAL 6.4e9)
  run_plan(--nvme EXPECT 0 STDOUT_VAR j ARGS --nvme 2GB/s --json)
  json_get(r "${j}" machine nvme_read_bytes_per_second)
  json_get(w "${j}" machine nvme_write_bytes_per_second)
  expect("--nvme 2GB/s: reads 2e9, writes at 80% (${r}, ${w})" r EQUAL 2e9 AND w EQUAL 1.6e9)
  run_plan(--nvme-capacity EXPECT 0 STDOUT_VAR j ARGS --nvme-capacity 0 --json)
  require_json("${j}" --nvme-capacity)
  json_get(v "${j}" machine nvme_capacity)
  string(JSON n LENGTH "${j}" plans)
  math(EXPR last "${n} - 1")
  set(nvme_limited FALSE)
  foreach(i RANGE ${last})
    json_get(name "${j}" plans ${i} name)
    if(name MATCHES "nvme")
      json_get(limit "${j}" plans ${i} limit)
      if(limit STREQUAL "NVMe capacity")
        set(nvme_limited TRUE)
      endif()
    endif()
  endforeach()
  expect("--nvme-capacity 0: no NVMe (${v}), and the NVMe plan is infeasible for its NVMe capacity"
         v EQUAL 0 AND nvme_limited)
  run_plan(--collective EXPECT 0 STDOUT_VAR j ARGS --collective 10GB/s --json)
  json_get(v "${j}" machine reduce_scatter 0 bytes_per_second)
  expect("--collective 10GB/s: collectives at 1e10 (${v})" v EQUAL 1e10)
  run_plan(--gpu-flops EXPECT 0 STDOUT_VAR j ARGS --gpu-flops 50e12 --json)
  json_get(v "${j}" machine device_flops_per_second)
  expect("--gpu-flops 50e12: device_flops_per_second 5e13 (${v})" v EQUAL 5e13)

  run_plan(--save-machine EXPECT 0 ARGS --gpus 2 --gpu-mem 16GiB --save-machine ${WORK_DIR}/machine.json)
  expect("--save-machine writes the file" EXISTS ${WORK_DIR}/machine.json)
  run_plan(--machine EXPECT 0 STDOUT_VAR j ARGS --machine ${WORK_DIR}/machine.json --json)
  json_get(d "${j}" machine devices)
  json_get(m "${j}" machine device_memory)
  expect("--machine reads back 2 x 16 GiB (${d} x ${m})" d EQUAL 2 AND m EQUAL 17179869184)

  run_plan(--alignment EXPECT 0 STDOUT_VAR j ARGS --alignment 4096 --json)
  json_get(v "${j}" alignment)
  expect("--alignment 4096 (${v})" v EQUAL 4096)
  run_plan(--tensors EXPECT 0 ARGS --tensors
           OUT_MATCH "index +tensor +elements +dtype +bytes +tied\n0 +wte +38597376 +fp32 [^\n]*tied\n1 +wpe +786432 ")
  run_plan(--json EXPECT 0 STDOUT_VAR j ARGS --json)
  string(JSON v ERROR_VARIABLE e GET "${j}" format)
  expect("--json prints one JSON object (${e})" NOT e AND v STREQUAL "chunkwise.plan_report")
  # --measure, --measure-cache and --nvme-dir measure this machine: plan_cli_measure. Here only their bad uses.

  # Bad values: exit 2, nothing on stdout, a message naming the flag.
  set(bad_values
    "--model|gpt-3" "--profile|${WORK_DIR}/missing.json" "--dtype|fp8" "--micro-batch|0" "--layers|0"
    "--d-model|wide" "--heads|5" "--vocab|-1" "--context|0" "--save-profile|${WORK_DIR}/no/such/dir/p.json"
    "--gpus|0" "--ranks|70000" "--machines|0" "--inter-machine|slow" "--gpu-mem|12parsecs" "--host-mem|lots" "--pcie|fast" "--nvme|0"
    "--nvme-capacity|1XB" "--collective|-1GB/s" "--gpu-flops|0" "--machine|${WORK_DIR}/missing-machine.json"
    "--save-machine|${WORK_DIR}/no/such/dir/m.json" "--alignment|3"
    "--measure-cache|${WORK_DIR}/m.json" "--nvme-dir|${WORK_DIR}/missing")  # a file, a missing directory
  foreach(_case IN LISTS bad_values)
    string(REPLACE "|" ";" _case "${_case}")
    list(GET _case 0 _flag)
    list(GET _case 1 _value)
    set(_extra)
    if(_flag MATCHES "^--(measure-cache|nvme-dir)$")  # checked before measuring: these fail in no time
      set(_extra --measure)
    endif()
    run_plan("${_flag} ${_value}" EXPECT 2 STDOUT_VAR out ERR_MATCH "^chunkwise: [^\n]*${_flag}[ :]"
             ARGS ${_flag} ${_value} ${_extra})
    string(LENGTH "${out}" out_length)
    expect("${_flag} ${_value}: nothing on stdout" out_length EQUAL 0)
  endforeach()
  # A flag that needs a value, given none.
  foreach(_flag --model --profile --dtype --micro-batch --layers --d-model --heads --vocab --context --save-profile
                --gpus --ranks --machines --inter-machine --gpu-mem --host-mem --pcie --nvme --nvme-capacity --collective --gpu-flops --machine
                --measure-cache --nvme-dir --save-machine --alignment)
    run_plan("${_flag} without a value" EXPECT 2 ERR_MATCH "${_flag} needs a value" ARGS --json ${_flag})
  endforeach()
  run_plan(unknown EXPECT 2 ERR_MATCH "unknown option '--frobnicate'" ARGS --frobnicate)
  run_plan(positional EXPECT 2 ERR_MATCH "unknown option 'gpt2-124m'" ARGS gpt2-124m)
  run_plan(analytic-with-profile EXPECT 2 ERR_MATCH "--layers applies to an analytic model"
           ARGS --profile ${WORK_DIR}/m.json --layers 2)

# ---------------------------------------------------------------------------------------------------------------------
elseif(SUITE STREQUAL "json")
  # Four ranks of 12 GiB: some plans fit, some do not, so both kinds of plans[] entries appear.
  run_plan(report EXPECT 0 STDOUT_VAR j ARGS --model gpt2-124m --gpus 4 --gpu-mem 12GiB --json)
  require_json("${j}" report)
  expect_fields("${j}" format:STRING version:INTEGER model:STRING params:INTEGER tensors:INTEGER tensor_list:ARRAY
                      passes:INTEGER tensor_bytes:INTEGER peak_activation_bytes:INTEGER ranks:INTEGER
                      alignment:INTEGER machine:OBJECT layouts:ARRAY chosen:STRING_OR_NULL no_fit:STRING_OR_NULL
                      plans:ARRAY)
  json_get(format "${j}" format)
  json_get(version "${j}" version)
  expect("format chunkwise.plan_report version 1 (${format} ${version})"
         format STREQUAL "chunkwise.plan_report" AND version EQUAL 1)
  json_get(params "${j}" params)
  json_get(tensors "${j}" tensors)
  json_get(tensor_bytes "${j}" tensor_bytes)
  json_get(ranks "${j}" ranks)
  json_get(alignment "${j}" alignment)
  json_get(passes "${j}" passes)
  expect("gpt2-124m has 12*12+4 = 148 tensors (${tensors}) and 2*(12+2) = 28 passes (${passes})"
         tensors EQUAL 148 AND passes EQUAL 28)

  # tensor_list: one entry per tensor; elements add up to params, bytes to tensor_bytes.
  string(JSON n LENGTH "${j}" tensor_list)
  expect("tensor_list has one entry per tensor (${n} vs ${tensors})" n EQUAL tensors)
  set(sum_elements 0)
  set(sum_bytes 0)
  set(largest 0)
  set(tied 0)
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    json_get(t "${j}" tensor_list ${i})
    expect_type("${t}" STRING name)
    expect_type("${t}" INTEGER elements)
    expect_type("${t}" STRING dtype)
    expect_type("${t}" INTEGER bytes)
    expect_type("${t}" BOOLEAN tied)
    json_get(e "${t}" elements)
    json_get(b "${t}" bytes)
    json_get(type "${t}" dtype)
    json_get(is_tied "${t}" tied)
    math(EXPR want "${e} * 4")
    expect("tensor_list[${i}]: an fp32 tensor of ${e} elements has 4 bytes each (${type}, ${b})"
           type STREQUAL "fp32" AND b EQUAL want)
    math(EXPR sum_elements "${sum_elements} + ${e}")
    math(EXPR sum_bytes "${sum_bytes} + ${b}")
    if(b GREATER largest)
      set(largest ${b})
    endif()
    if(is_tied)
      math(EXPR tied "${tied} + 1")
    endif()
  endforeach()
  expect("tensor_list elements add up to params (${sum_elements} vs ${params})" sum_elements EQUAL params)
  expect("tensor_list bytes add up to tensor_bytes (${sum_bytes} vs ${tensor_bytes})" sum_bytes EQUAL tensor_bytes)
  expect("GPT-2 has one tied tensor, wte (${tied})" tied EQUAL 1)
  json_get(first "${j}" tensor_list 0 name)
  json_get(last_name "${j}" tensor_list ${last} name)
  expect("tensor_list in first-use order: wte ... ln_f.bias (${first} ... ${last_name})"
         first STREQUAL "wte" AND last_name STREQUAL "ln_f.bias")

  # machine: the machine profile's JSON.
  json_get(m "${j}" machine)
  expect_fields("${m}" format:STRING version:INTEGER name:STRING fingerprint:STRING kind:STRING devices:INTEGER
                      device_memory:INTEGER host_memory:INTEGER nvme_capacity:INTEGER
                      host_to_device_bytes_per_second:NUMBER device_to_host_bytes_per_second:NUMBER
                      nvme_read_bytes_per_second:NUMBER nvme_write_bytes_per_second:NUMBER all_gather:ARRAY
                      reduce_scatter:ARRAY all_reduce:ARRAY collective_latency_seconds:NUMBER
                      device_optimizer_params_per_second:NUMBER host_optimizer_params_per_second:NUMBER
                      device_flops_per_second:NUMBER)
  expect_type("${m}" INTEGER all_gather 0 message_bytes)
  expect_type("${m}" NUMBER all_gather 0 bytes_per_second)
  json_get(devices "${m}" devices)
  json_get(device_memory "${m}" device_memory)
  json_get(host_memory "${m}" host_memory)
  json_get(nvme_capacity "${m}" nvme_capacity)
  json_get(mformat "${m}" format)
  expect("machine: a chunkwise.machine_profile of ranks devices (${mformat}, ${devices} vs ${ranks})"
         mformat STREQUAL "chunkwise.machine_profile" AND devices EQUAL ranks AND ranks EQUAL 4)

  # layouts: five policies; a feasible one's numbers agree with each other.
  string(JSON n LENGTH "${j}" layouts)
  expect("five layouts (${n})" n EQUAL 5)
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    json_get(l "${j}" layouts ${i})
    expect_type("${l}" STRING name)
    expect_type("${l}" BOOLEAN feasible)
    json_get(name "${l}" name)
    json_get(feasible "${l}" feasible)
    if(NOT feasible)
      expect_type("${l}" STRING error)
      continue()
    endif()
    foreach(_field chunk_bytes chunks total_bytes waste_bytes shard_bytes_per_rank)
      expect_type("${l}" INTEGER ${_field})
    endforeach()
    expect_type("${l}" NUMBER waste_percent)
    json_get(chunk_bytes "${l}" chunk_bytes)
    json_get(chunks "${l}" chunks)
    json_get(total "${l}" total_bytes)
    json_get(waste "${l}" waste_bytes)
    json_get(percent "${l}" waste_percent)
    json_get(shard "${l}" shard_bytes_per_rank)
    math(EXPR want_waste "${total} - ${tensor_bytes}")
    math(EXPR want_shard "${total} / ${ranks}")
    expect("layout ${name}: waste_bytes = total_bytes - tensor_bytes (${waste} vs ${want_waste})" waste EQUAL want_waste)
    expect("layout ${name}: shard_bytes_per_rank = total_bytes / ranks (${shard} vs ${want_shard})" shard EQUAL want_shard)
    expect("layout ${name}: chunks hold the largest tensor (${chunk_bytes} >= ${largest})" NOT chunk_bytes LESS largest)
    expect("layout ${name}: waste_percent from 0 to 100 (${percent})" NOT percent LESS 0 AND NOT percent GREATER 100)
    if(name STREQUAL "private_chunks<>")  # chunks of different sizes: the largest times the count bounds the total
      math(EXPR most "${chunk_bytes} * ${chunks}")
      expect("layout ${name}: total_bytes <= chunk_bytes * chunks (${total} vs ${most})" NOT total GREATER most)
    elseif(NOT name STREQUAL "per_tensor")
      math(EXPR want_total "${chunk_bytes} * ${chunks}")
      expect("layout ${name}: total_bytes = chunk_bytes * chunks (${total} vs ${want_total})" total EQUAL want_total)
    else()
      expect("per_tensor: one chunk per tensor (${chunks} vs ${tensors})" chunks EQUAL tensors)
    endif()
  endforeach()

  # plans: every plan with its fields; exactly one chosen, feasible, named by `chosen`.
  json_get(chosen "${j}" chosen)
  string(JSON chosen_type TYPE "${j}" chosen)
  string(JSON no_fit_type TYPE "${j}" no_fit)
  expect("a chosen plan and no_fit null (${chosen}, ${no_fit_type})"
         chosen_type STREQUAL "STRING" AND no_fit_type STREQUAL "NULL")
  string(JSON n LENGTH "${j}" plans)
  expect("the default plan set has 12 plans (${n})" n EQUAL 12)
  math(EXPR last "${n} - 1")
  set(chosen_count 0)
  set(chosen_step "")
  set(feasible_count 0)
  set(infeasible_count 0)
  set(earlier_steps)
  foreach(i RANGE ${last})
    json_get(p "${j}" plans ${i})
    foreach(_field_type name:STRING feasible:BOOLEAN chosen:BOOLEAN peak_device_bytes:INTEGER host_bytes:INTEGER
                        nvme_bytes:INTEGER step_seconds:NUMBER_OR_NULL knobs:OBJECT memory:OBJECT time:OBJECT
                        knobs.chunk_bytes:INTEGER knobs.chunks:INTEGER knobs.device_blocks:INTEGER
                        knobs.offload_fraction:NUMBER knobs.resident_chunks:INTEGER knobs.layout_candidate:INTEGER
                        memory.device_parameters:INTEGER memory.device_working:INTEGER
                        memory.device_optimizer:INTEGER memory.device_activations:INTEGER
                        time.compute:NUMBER time.collective:NUMBER time.host_to_device:NUMBER
                        time.device_to_host:NUMBER time.nvme:NUMBER time.optimizer:NUMBER
                        time.collective_exposed:NUMBER time.host_to_device_exposed:NUMBER
                        time.device_to_host_exposed:NUMBER time.nvme_exposed:NUMBER)
      string(REPLACE ":" ";" _field_type ${_field_type})
      list(GET _field_type 0 _field)
      list(GET _field_type 1 _type)
      string(REPLACE "." ";" _field ${_field})
      expect_type("${p}" ${_type} ${_field})
    endforeach()
    json_get(name "${p}" name)
    json_get(feasible "${p}" feasible)
    json_get(is_chosen "${p}" chosen)
    json_get(peak "${p}" peak_device_bytes)
    json_get(host "${p}" host_bytes)
    json_get(nvme "${p}" nvme_bytes)
    set(parts 0)
    foreach(_part device_parameters device_working device_optimizer device_activations)
      json_get(v "${p}" memory ${_part})
      math(EXPR parts "${parts} + ${v}")
    endforeach()
    expect("plan ${name}: peak_device_bytes is the sum of memory's parts (${peak} vs ${parts})" peak EQUAL parts)
    json_get(kchunks "${p}" knobs chunks)
    json_get(kresident "${p}" knobs resident_chunks)
    json_get(koffload "${p}" knobs offload_fraction)
    expect("plan ${name}: resident_chunks <= chunks, offload_fraction in [0, 1] (${kresident}, ${kchunks}, ${koffload})"
           NOT kresident GREATER kchunks AND NOT koffload LESS 0 AND NOT koffload GREATER 1)
    if(feasible)
      math(EXPR feasible_count "${feasible_count} + 1")
      json_get(step "${p}" step_seconds)
      json_get(compute "${p}" time compute)
      expect("plan ${name}: fits the machine (device ${peak} <= ${device_memory}, host ${host} <= ${host_memory}, NVMe ${nvme} <= ${nvme_capacity})"
             NOT peak GREATER device_memory AND NOT host GREATER host_memory AND NOT nvme GREATER nvme_capacity)
      expect("plan ${name}: step_seconds > 0 and at least compute (${step} >= ${compute})"
             step GREATER 0 AND NOT step LESS compute)
      string(JSON _has_limit ERROR_VARIABLE _no_limit GET "${p}" limit)
      expect("plan ${name}: a feasible plan has no limit" _no_limit)
      if(is_chosen)
        math(EXPR chosen_count "${chosen_count} + 1")
        set(chosen_step ${step})
        expect("plans[].chosen is the plan `chosen` names (${name} vs ${chosen})" name STREQUAL chosen)
        foreach(_earlier IN LISTS earlier_steps)  # ties go to the earlier plan: the chosen one beats every earlier one
          expect("plan ${name}, chosen, is faster than an earlier feasible plan (${step} < ${_earlier})" step LESS _earlier)
        endforeach()
      elseif(chosen_step STREQUAL "")
        list(APPEND earlier_steps ${step})
      endif()
    else()
      math(EXPR infeasible_count "${infeasible_count} + 1")
      expect_type("${p}" STRING limit)
      expect_type("${p}" INTEGER needed_bytes)
      expect_type("${p}" INTEGER available_bytes)
      json_get(limit "${p}" limit)
      json_get(needed "${p}" needed_bytes)
      json_get(available "${p}" available_bytes)
      expect("plan ${name}: not chosen, no step time" NOT is_chosen)
      expect("plan ${name}: limit is one of the documented ones (${limit})"
             limit MATCHES "^(device memory|host memory|NVMe capacity|rank count|layout)$")
      if(limit MATCHES "memory|capacity")
        expect("plan ${name}: needs more ${limit} than there is (${needed} > ${available})" needed GREATER available)
      endif()
      if(limit STREQUAL "device memory")
        expect("plan ${name}: available_bytes is the device memory (${available} vs ${device_memory})"
               available EQUAL device_memory)
      endif()
    endif()
  endforeach()
  expect("exactly one plan is chosen (${chosen_count})" chosen_count EQUAL 1)
  expect("this machine makes some plans fit and some not (${feasible_count} fit, ${infeasible_count} do not)"
         feasible_count GREATER 0 AND infeasible_count GREATER 0)

# ---------------------------------------------------------------------------------------------------------------------
elseif(SUITE STREQUAL "exit_codes")
  run_plan(0 EXPECT 0 OUT_MATCH "\nchosen: [^ ]+, .* predicted [0-9.]+ s per step" ARGS --model gpt2-124m)
  run_plan(2 EXPECT 2 STDOUT_VAR out ERR_MATCH "--gpus must be between 1 and 65536" ARGS --gpus 0 --json)
  string(LENGTH "${out}" out_length)
  expect("exit 2 prints no JSON" out_length EQUAL 0)
  file(WRITE ${WORK_DIR}/broken.json "{\"format\": \"chunkwise.model_profile\", \"version\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\"}], \"passes\": []}")
  run_plan(2-profile EXPECT 2 ERR_MATCH "tensors\\[0\\]\\.elements: missing field" ARGS --profile ${WORK_DIR}/broken.json)
  file(WRITE ${WORK_DIR}/not-json.json "this is not JSON")
  run_plan(2-not-json EXPECT 2 ERR_MATCH "is not valid JSON" ARGS --profile ${WORK_DIR}/not-json.json)

  # No plan fits GPT-2 1.5B on a 1 GiB card with 2 GiB of host memory and no NVMe.
  set(small --model gpt2-1558m --gpu-mem 1GiB --host-mem 2GiB --nvme-capacity 0)
  set(closest_regex "The closest is ([^ :]+): it needs ([0-9.]+ [KMGT]?i?B) of (device memory|host memory|NVMe capacity), the machine has ([0-9.]+ [KMGT]?i?B)")
  run_plan(3 EXPECT 3 STDOUT_VAR out OUT_MATCH "no plan fits this machine" ARGS ${small})
  expect("exit 3 (text): the message names the closest plan and what it needs" out MATCHES "${closest_regex}")
  run_plan(3-json EXPECT 3 STDOUT_VAR j STDERR_VAR err ARGS ${small} --json)
  require_json("${j}" 3-json)
  expect("exit 3 (JSON): the reason is on stderr too" err MATCHES "${closest_regex}")
  string(JSON chosen_type ERROR_VARIABLE e TYPE "${j}" chosen)
  expect("exit 3 (JSON): chosen is null (${chosen_type} ${e})" chosen_type STREQUAL "NULL")
  json_get(no_fit "${j}" no_fit)
  expect("exit 3 (JSON): no_fit names the closest plan" no_fit MATCHES "${closest_regex}")
  if(no_fit MATCHES "${closest_regex}")
    set(closest "${CMAKE_MATCH_1}")
    set(limit "${CMAKE_MATCH_3}")
    set(found FALSE)
    string(JSON n LENGTH "${j}" plans)
    math(EXPR last "${n} - 1")
    foreach(i RANGE ${last})
      json_get(name "${j}" plans ${i} name)
      json_get(feasible "${j}" plans ${i} feasible)
      json_get(is_chosen "${j}" plans ${i} chosen)
      expect("exit 3: plan ${name} is neither feasible nor chosen" NOT feasible AND NOT is_chosen)
      if(name STREQUAL closest)
        set(found TRUE)
        json_get(plan_limit "${j}" plans ${i} limit)
        json_get(needed "${j}" plans ${i} needed_bytes)
        json_get(available "${j}" plans ${i} available_bytes)
        expect("exit 3: the closest plan's limit is the one the message names (${plan_limit} vs ${limit})"
               plan_limit STREQUAL limit)
        expect("exit 3: the closest plan needs more than there is (${needed} > ${available})" needed GREATER available)
      endif()
    endforeach()
    expect("exit 3: the closest plan ${closest} is one of plans[]" found)
  endif()

# ---------------------------------------------------------------------------------------------------------------------
elseif(SUITE STREQUAL "measure")
  set(tiny --layers 2 --d-model 64 --heads 4 --vocab 256 --context 64 --micro-batch 1)
  set(cache ${WORK_DIR}/cache)
  run_plan(measure EXPECT 0 STDOUT_VAR j STDERR_VAR err
           ARGS ${tiny} --measure --gpus 1 --measure-cache ${cache} --nvme-dir ${WORK_DIR} --json)
  expect("--measure reports its progress and saves to --measure-cache" err MATCHES "measure: saved ${cache}/machine-")
  file(GLOB cached ${cache}/machine-*.json)
  list(LENGTH cached n)
  expect("--measure-cache holds one machine profile (${n})" n EQUAL 1)
  json_get(kind "${j}" machine kind)
  json_get(fingerprint "${j}" machine fingerprint)
  string(LENGTH "${fingerprint}" fingerprint_length)
  expect("--measure: a host machine with a fingerprint (${kind}, ${fingerprint})"
         kind STREQUAL "host" AND fingerprint_length GREATER 0)
  run_plan(measure-cached EXPECT 0 STDOUT_VAR j2 STDERR_VAR err
           ARGS ${tiny} --measure --gpus 2 --measure-cache ${cache} --nvme-dir ${WORK_DIR} --json)
  expect("--measure again reads the cache" err MATCHES "using the measured profile ${cache}/machine-")
  json_get(devices "${j2}" machine devices)
  expect("--measure --gpus 2 with the cache: 2 ranks (${devices})" devices EQUAL 2)
else()
  message(FATAL_ERROR "plan_cli_test: unknown SUITE '${SUITE}' (flags, json, exit_codes, measure)")
endif()

get_property(failures GLOBAL PROPERTY plan_cli_failures)
get_property(checks GLOBAL PROPERTY plan_cli_checks)
list(LENGTH failures failed)
if(failed GREATER 0)
  message(FATAL_ERROR "plan_cli_${SUITE}: ${failed} of ${checks} checks failed")
endif()
message(STATUS "plan_cli_${SUITE}: ${checks} checks passed")
