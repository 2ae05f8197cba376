# The GEMM bench times the example trainer's matrix products: its model target brings OpenBLAS where found.
include(${PROJECT_SOURCE_DIR}/examples/train_gpt2/gpt2_model.cmake)
target_link_libraries(chunkwise_${_name} PRIVATE chunkwise_gpt2_model)
