# The model test needs the example's headers and OpenMP: the target from examples/train_gpt2 (defined here when the
# examples are off).
include(${PROJECT_SOURCE_DIR}/examples/train_gpt2/gpt2_model.cmake)
target_link_libraries(chunkwise_${_name} PRIVATE chunkwise_gpt2_model)
