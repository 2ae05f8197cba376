# The device passes' host test: the example's model target, and Thrust's headers with its OpenMP device system (the
# CUDA toolkit's CCCL where the toolkit is, else Debian's libthrust-dev in /usr/include).
include(${PROJECT_SOURCE_DIR}/examples/train_gpt2/gpt2_model.cmake)
target_link_libraries(chunkwise_${_name} PRIVATE chunkwise_gpt2_model)
set(_thrust_hints)
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND _thrust_hints ${_dir}/cccl ${_dir})
  endforeach()
endif()
find_path(CHUNKWISE_THRUST_INCLUDE_DIR thrust/for_each.h HINTS ${_thrust_hints})
find_package(OpenMP COMPONENTS CXX)  # gpt2_model.cmake's result is its own directory's
if(CHUNKWISE_THRUST_INCLUDE_DIR AND OpenMP_CXX_FOUND)
  target_include_directories(chunkwise_${_name} SYSTEM PRIVATE ${CHUNKWISE_THRUST_INCLUDE_DIR})
  target_compile_definitions(chunkwise_${_name} PRIVATE CHUNKWISE_GPT2_DEVICE_TEST=1
                             THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP)
else()
  message(STATUS "chunkwise: gpt2_device_test needs Thrust's headers and OpenMP; it builds as a skip")
endif()
set_tests_properties(${_name} PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive;OMP_NUM_THREADS=2")
