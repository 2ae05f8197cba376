#pragma once
// main() for tests/cuda/*_test.cu: runs doctest where a GPU exists, exits 77 (ctest: skipped) where none does.
// Include it from exactly one place in each CUDA test translation unit.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("no usable GPU (%s): compiled and linked, not run\n", cudaGetErrorName(status));
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
