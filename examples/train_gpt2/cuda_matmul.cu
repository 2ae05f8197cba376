// The cuBLAS matmul engine of train_gpt2 --backend cuda: the model's matrix products (the FLOPs of a GPT-2 step)
// run on the GPU with llm.c's cuBLAS calls; the rest of the maths stays on the CPU. Operands live in host memory
// (chunkwise's tiers on the host backend), so each product copies its inputs to device buffers, runs, and copies its
// outputs back: the PCIe traffic is what this path measures besides the GEMMs.
#include <chunkwise/core/cuda/checked_call.cuh>
#include <chunkwise/core/error.hpp>

#include "matmul_engine.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace gpt2 {
namespace {

__global__ void add_bias(float* out, const float* bias, std::size_t rows, std::size_t columns) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < rows * columns) out[i] += bias[i % columns];
}

/// One GPU, one stream, device buffers that grow to the largest product seen. Thread ranks share it under a lock
/// (their products serialise on the GPU anyway).
class cublas_matmul {
 public:
  cublas_matmul() {
    int devices = 0;
    CHUNKWISE_CUDA_TRY(cudaGetDeviceCount(&devices), "train_gpt2 --backend cuda");
    if (devices == 0)
      chunkwise::throw_error(chunkwise::error_code::unsupported, "train_gpt2 --backend cuda: no GPU is visible");
    CHUNKWISE_CUDA_TRY(cudaStreamCreate(&stream_), "cuBLAS matmul stream");
    CHUNKWISE_CUBLAS_TRY(cublasCreate(&handle_), "cuBLAS matmul");
    CHUNKWISE_CUBLAS_TRY(cublasSetStream(handle_, stream_), "cuBLAS matmul");
    // fp32 products as in the CPU loops (no TF32), so the two engines agree to fp32 rounding.
    CHUNKWISE_CUBLAS_TRY(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cuBLAS matmul");
  }
  ~cublas_matmul() {
    for (auto& b : buffers_) cudaFree(b.data);
    cublasDestroy(handle_);
    cudaStreamDestroy(stream_);
  }

  void forward(float* out, const float* inp, const float* weight, const float* bias, std::size_t rows, std::size_t C,
               std::size_t OC) {
    std::lock_guard lock(mutex_);
    float* d_inp = upload(0, inp, rows * C);
    float* d_weight = upload(1, weight, OC * C);
    float* d_out = buffer(2, rows * OC);
    const float one = 1.0f, zero = 0.0f;
    // Column-major view: out^T (OC x rows) = weight (C x OC)^T . inp^T (C x rows).
    CHUNKWISE_CUBLAS_TRY(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(OC), static_cast<int>(rows),
                             static_cast<int>(C), &one, d_weight, static_cast<int>(C), d_inp, static_cast<int>(C),
                             &zero, d_out, static_cast<int>(OC)), "cuBLAS matmul");
    if (bias != nullptr) {
      float* d_bias = upload(3, bias, OC);
      const std::size_t n = rows * OC;
      add_bias<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream_>>>(d_out, d_bias, rows, OC);
      CHUNKWISE_CUDA_TRY(cudaGetLastError(), "cuBLAS matmul: bias kernel");
    }
    download(out, d_out, rows * OC);
  }

  void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                std::size_t rows, std::size_t C, std::size_t OC) {
    std::lock_guard lock(mutex_);
    float* d_dout = upload(0, dout, rows * OC);
    float* d_inp = upload(1, inp, rows * C);
    float* d_weight = upload(2, weight, OC * C);
    float* d_dinp = upload(3, dinp, rows * C);        // accumulated into
    float* d_dweight = upload(4, dweight, OC * C);   // accumulated into
    const float one = 1.0f;
    // dinp (rows x C) += dout (rows x OC) . weight (OC x C)
    CHUNKWISE_CUBLAS_TRY(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(C), static_cast<int>(rows),
                             static_cast<int>(OC), &one, d_weight, static_cast<int>(C), d_dout, static_cast<int>(OC),
                             &one, d_dinp, static_cast<int>(C)), "cuBLAS matmul");
    // dweight (OC x C) += dout^T (OC x rows) . inp (rows x C)
    CHUNKWISE_CUBLAS_TRY(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(C), static_cast<int>(OC),
                             static_cast<int>(rows), &one, d_inp, static_cast<int>(C), d_dout, static_cast<int>(OC),
                             &one, d_dweight, static_cast<int>(C)), "cuBLAS matmul");
    if (dbias != nullptr) {
      float* d_dbias = upload(5, dbias, OC);
      float* d_ones = ones(rows);
      // dbias (OC) += dout^T . ones
      CHUNKWISE_CUBLAS_TRY(cublasSgemv(handle_, CUBLAS_OP_N, static_cast<int>(OC), static_cast<int>(rows), &one, d_dout,
                               static_cast<int>(OC), d_ones, 1, &one, d_dbias, 1), "cuBLAS matmul");
      download(dbias, d_dbias, OC, /*wait=*/false);
    }
    download(dweight, d_dweight, OC * C, /*wait=*/false);
    download(dinp, d_dinp, rows * C);
  }

 private:
  struct device_buffer {
    float* data = nullptr;
    std::size_t capacity = 0;
  };

  float* buffer(std::size_t slot, std::size_t elements) {
    auto& b = buffers_[slot];
    if (b.capacity < elements) {
      CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(stream_), "cuBLAS matmul: growing a buffer");
      cudaFree(b.data);
      b.data = nullptr;
      b.capacity = 0;
      CHUNKWISE_CUDA_TRY(cudaMalloc(&b.data, elements * sizeof(float)),
                         "cuBLAS matmul: " + std::to_string(elements * sizeof(float)) + " bytes of device memory");
      b.capacity = elements;
    }
    return b.data;
  }
  float* upload(std::size_t slot, const float* host, std::size_t elements) {
    float* device = buffer(slot, elements);
    CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(device, host, elements * sizeof(float), cudaMemcpyHostToDevice, stream_),
                       "cuBLAS matmul: upload");
    return device;
  }
  void download(float* host, const float* device, std::size_t elements, bool wait = true) {
    CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(host, device, elements * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                       "cuBLAS matmul: download");
    if (wait) CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(stream_), "cuBLAS matmul: synchronise");
  }
  float* ones(std::size_t elements) {
    if (ones_.size() < elements) {
      ones_.assign(elements, 1.0f);
      upload(6, ones_.data(), elements);
      CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(stream_), "cuBLAS matmul: ones");
    }
    return buffers_[6].data;
  }

  std::mutex mutex_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  std::array<device_buffer, 7> buffers_{};
  std::vector<float> ones_;
};

cublas_matmul& instance() {
  static cublas_matmul engine;
  return engine;
}

}  // namespace

const matmul_engine& cuda_matmul_engine() {
  (void)instance();  // fails here, before training, when no GPU is usable
  static const matmul_engine engine{
      "cuBLAS",
      [](float* out, const float* inp, const float* weight, const float* bias, std::size_t rows, std::size_t C,
         std::size_t OC) { instance().forward(out, inp, weight, bias, rows, C, OC); },
      [](float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
         std::size_t rows, std::size_t C, std::size_t OC) {
        instance().backward(dinp, dweight, dbias, dout, inp, weight, rows, C, OC);
      }};
  return engine;
}

}  // namespace gpt2
