# The model test needs the example's headers and OpenMP: the target from examples/train_gpt2 (defined here when the
# examples are off).
include(${PROJECT_SOURCE_DIR}/examples/train_gpt2/gpt2_model.cmake)
target_link_libraries(chunkwise_${_name} PRIVATE chunkwise_gpt2_model)
# Idle OpenMP threads sleep instead of spinning: on a loaded CI machine spinning threads starve the working ones.
set_tests_properties(${_name} PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive")
