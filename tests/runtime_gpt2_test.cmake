# The runtime's GPT-2 test uses the example trainer's model maths, reference trainer and data.
include(${PROJECT_SOURCE_DIR}/examples/train_gpt2/gpt2_model.cmake)
target_link_libraries(chunkwise_${_name} PRIVATE chunkwise_gpt2_model)
set_tests_properties(${_name} PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive;OMP_NUM_THREADS=1")
