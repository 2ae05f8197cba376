# chunkwise_gpt2_model: the example's GPT-2 maths, reference trainer and data loader (headers beside this file),
# with OpenMP where the compiler has it. Included by this folder's CMakeLists.txt and by tests/gpt2_model_test.cmake,
# so the model test builds even when the examples are off.
include_guard(GLOBAL)

add_library(chunkwise_gpt2_model INTERFACE)
target_include_directories(chunkwise_gpt2_model INTERFACE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(chunkwise_gpt2_model INTERFACE chunkwise::chunkwise)
target_compile_definitions(chunkwise_gpt2_model INTERFACE
  CHUNKWISE_GPT2_DATA_FILE="${CMAKE_CURRENT_LIST_DIR}/data/kjv_genesis_exodus.txt")
# Not under ThreadSanitizer: libgomp is not instrumented, so its own barriers would be reported as races.
if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize=thread")
  find_package(OpenMP COMPONENTS CXX)
endif()
if(OpenMP_CXX_FOUND)
  target_link_libraries(chunkwise_gpt2_model INTERFACE OpenMP::OpenMP_CXX)
else()
  # The loops run serially (`omp simd` still vectorises); the pragmas stay for readers, as llm.c keeps them.
  target_compile_options(chunkwise_gpt2_model INTERFACE $<$<CXX_COMPILER_ID:GNU,Clang>:-fopenmp-simd -Wno-unknown-pragmas>)
endif()
# The matrix products through OpenBLAS (blas_matmul.hpp) where pkg-config finds it: train_gpt2 installs that engine.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(CHUNKWISE_OPENBLAS QUIET IMPORTED_TARGET openblas)
endif()
if(CHUNKWISE_OPENBLAS_FOUND)
  target_link_libraries(chunkwise_gpt2_model INTERFACE PkgConfig::CHUNKWISE_OPENBLAS)
  target_compile_definitions(chunkwise_gpt2_model INTERFACE CHUNKWISE_GPT2_BLAS=1)
endif()
