#pragma once
// What the device benches (row_kernels.cu, products.cu) share: their inputs, their timer (the median of 20 runs of
// `work` on the default stream between CUDA events, after 3 unmeasured runs), and their exit where there is no GPU.
#include "device_kernels.hpp"

#include <chunkwise/core/cuda/checked_call.cuh>

#include <thrust/device_vector.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace device_bench {

using index = gpt2::device_kernels::index;

/// values[i] = sin(i * step) * scale: the same inputs for every form a bench compares, in range for exp.
struct fill_values {
  float* values;
  float step, scale;
  __host__ __device__ void operator()(index i) const {
    values[i] = sinf(static_cast<float>(i % 100003) * step) * scale;
  }
};
inline void fill(thrust::device_vector<float>& v, float step, float scale = 1.0f) {
  gpt2::device_kernels::for_each_index(v.size(), fill_values{thrust::raw_pointer_cast(v.data()), step, scale});
}

template <class Work>
double median_ms(Work&& work) {
  const std::string context = "device bench: timing";
  for (int i = 0; i < 3; ++i) work();
  cudaEvent_t start, stop;
  CHUNKWISE_CUDA_TRY(cudaEventCreate(&start), context);
  CHUNKWISE_CUDA_TRY(cudaEventCreate(&stop), context);
  std::vector<double> times;
  for (int i = 0; i < 20; ++i) {
    CHUNKWISE_CUDA_TRY(cudaEventRecord(start, nullptr), context);
    work();
    CHUNKWISE_CUDA_TRY(cudaEventRecord(stop, nullptr), context);
    CHUNKWISE_CUDA_TRY(cudaEventSynchronize(stop), context);
    float ms = 0;
    CHUNKWISE_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop), context);
    times.push_back(ms);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

/// Exit 77 (ctest's and run.sh's "skipped") where no GPU can be used, naming why.
inline bool no_usable_gpu(const char* program) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status == cudaSuccess && devices > 0) return false;
  std::printf("%s: no usable GPU (%s)\n", program,
              status != cudaSuccess ? cudaGetErrorName(status) : "cudaErrorNoDevice");
  return true;
}

}  // namespace device_bench
