# chunkwise_gpt2_model: the example's GPT-2 maths, reference trainer and data loader (headers beside this file),
# with OpenMP where the compiler has it. Included by this folder's CMakeLists.txt and by tests/gpt2_model_test.cmake,
# so the model test builds even when the examples are off.
include_guard(GLOBAL)

add_library(chunkwise_gpt2_model INTERFACE)
target_include_directories(chunkwise_gpt2_model INTERFACE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(chunkwise_gpt2_model INTERFACE chunkwise::chunkwise)
target_compile_definitions(chunkwise_gpt2_model INTERFACE
  CHUNKWISE_GPT2_DATA_FILE="${CMAKE_CURRENT_LIST_DIR}/data/kjv_genesis_exodus.txt")
# Floating-point operations may be speculated (they never trap here: no FP exceptions are enabled), so the compiler
# vectorises loops with comparisons (GELU's exp clamps its argument: without this, that loop stays scalar). Results
# do not change: unlike -ffast-math, this allows no reassociation or other rewriting of the arithmetic.
target_compile_options(chunkwise_gpt2_model INTERFACE $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>:-fno-trapping-math>)
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
# Debian's OpenMP build first (libopenblas-openmp-dev, its own pkg-config directory): its threads wait as OpenMP's do
# (OMP_WAIT_POLICY=passive), where the pthread build's spin on sched_yield against the model's OpenMP loops and the
# runtime's threads (measured: a step of the 12x768 model 1.23-1.34 s against 1.56-1.76 s on 2 cores). CMake links
# it by path and gives the build tree an RPATH to its directory, so the system's default libopenblas.so.0 is not used.
# Not under ThreadSanitizer either (its threads, OpenMP's or its own, are uninstrumented): the loops run there.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize=thread")
  set(_openblas_openmp_pc "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/pkgconfig")
  if(CMAKE_LIBRARY_ARCHITECTURE AND EXISTS "${_openblas_openmp_pc}/openblas.pc")
    set(_pkg_config_path "$ENV{PKG_CONFIG_PATH}")
    set(ENV{PKG_CONFIG_PATH} "${_openblas_openmp_pc}")
    pkg_check_modules(CHUNKWISE_OPENBLAS QUIET IMPORTED_TARGET openblas)
    set(ENV{PKG_CONFIG_PATH} "${_pkg_config_path}")
  endif()
  if(NOT CHUNKWISE_OPENBLAS_FOUND)
    pkg_check_modules(CHUNKWISE_OPENBLAS QUIET IMPORTED_TARGET openblas)
  endif()
endif()
if(CHUNKWISE_OPENBLAS_FOUND)
  target_link_libraries(chunkwise_gpt2_model INTERFACE PkgConfig::CHUNKWISE_OPENBLAS)
  target_compile_definitions(chunkwise_gpt2_model INTERFACE CHUNKWISE_GPT2_BLAS=1)
endif()
# The matrix products through oneDNN (dnnl_matmul.hpp: fp32, or bf16 operands under --dtype bf16, which AVX-512 BF16
# runs at twice the fp32 rate) where its headers and library are found (Debian: libdnnl-dev). Found by path: its
# CMake package asks for OpenCL's development files, which its products on the CPU do not need. Not under
# ThreadSanitizer (its OpenMP threads are uninstrumented).
find_path(CHUNKWISE_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(CHUNKWISE_DNNL_LIBRARY dnnl)
if(CHUNKWISE_DNNL_INCLUDE_DIR AND CHUNKWISE_DNNL_LIBRARY AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize=thread")
  target_include_directories(chunkwise_gpt2_model SYSTEM INTERFACE ${CHUNKWISE_DNNL_INCLUDE_DIR})
  target_link_libraries(chunkwise_gpt2_model INTERFACE ${CHUNKWISE_DNNL_LIBRARY})
  target_compile_definitions(chunkwise_gpt2_model INTERFACE CHUNKWISE_GPT2_DNNL=1)
endif()
