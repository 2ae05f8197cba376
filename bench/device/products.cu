// GPT-2's matrix products on the GPU four ways, side by side on the same arrays at the throughput shape (batch 32,
// context 256, 768 channels, 50304 padded tokens): what the trainer's products cost now, and what bf16 operands would
// save, before any pass is rewritten for them. Per product (forward, and backward's input and weight gradients, as
// device_model_impl.hpp's matmul_context calls cuBLAS):
//   fp32         cublasSgemm, fp32 throughout (--dtype fp32)
//   fast-bf16    fp32 operands, CUBLAS_COMPUTE_32F_FAST_16BF (--dtype bf16 today: cuBLAS rounds the operands)
//   bf16         bf16 operands already in memory, fp32 sums and output (activations kept in bf16, as llm.c does)
//   bf16+round   the same with both operands rounded from fp32 first (a drop-in for fast-bf16, conversions counted)
// then the step's total of each (12 layers' products, the head's once). Each is the median of 20 runs between CUDA
// events after 3 unmeasured. Usage: gpt2_products_bench [--batch B] [--context T]   (exit 77 without a GPU)
#include "device_bench.cuh"
#include "device_kernels.hpp"

#include <cublas_v2.h>
#include <thrust/device_vector.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using namespace gpt2::device_kernels;
using index = gpt2::device_kernels::index;
using device_bench::fill;
using device_bench::median_ms;

struct round_to_bf16 {
  std::uint16_t* out;
  const float* in;
  __host__ __device__ void operator()(index i) const { out[i] = float_to_bf16(in[i]); }
};

// One product, column-major as cuBLAS sees it: C (m, n) = op(A) (m, k) . op(B) (k, n); lda, ldb, ldc as stored.
struct product {
  const char* name;
  cublasOperation_t op_a, op_b;
  int m, n, k, lda, ldb, ldc;
  float beta;  // 1: the weight gradient adds up
  int per_step;
  [[nodiscard]] std::size_t a_elements() const { return std::size_t(lda) * (op_a == CUBLAS_OP_N ? k : m); }
  [[nodiscard]] std::size_t b_elements() const { return std::size_t(ldb) * (op_b == CUBLAS_OP_N ? n : k); }
  [[nodiscard]] std::size_t c_elements() const { return std::size_t(ldc) * n; }
  [[nodiscard]] double flops() const { return 2.0 * m * n * k; }
};

// The three products of a linear layer of C inputs and OC outputs over `rows` rows (matmul_context's calls).
std::array<product, 3> linear(int rows, int C, int OC, int per_step) {
  return {product{"forward", CUBLAS_OP_T, CUBLAS_OP_N, OC, rows, C, C, C, OC, 0.0f, per_step},
          product{"backward input", CUBLAS_OP_N, CUBLAS_OP_N, C, rows, OC, C, OC, C, 0.0f, per_step},
          product{"backward weight", CUBLAS_OP_N, CUBLAS_OP_T, C, OC, rows, C, OC, C, 1.0f, per_step}};
}

}  // namespace

int main(int argc, char** argv) {
  if (device_bench::no_usable_gpu("gpt2_products_bench")) return 77;
  int B = 32, T = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--batch") B = std::atoi(argv[i + 1]);
    else if (flag == "--context") T = std::atoi(argv[i + 1]);
  }
  const int C = 768, Vp = 50304, L = 12, rows = B * T;
  std::printf("products: batch %d, context %d, %d channels, %d padded tokens; ms (TFLOP/s)\n", B, T, C, Vp);
  cublasHandle_t handle = nullptr;
  try {
    CHUNKWISE_CUBLAS_TRY(cublasCreate(&handle), "products bench");
    thrust::device_vector<char> workspace(std::size_t{32} << 20);
    CHUNKWISE_CUBLAS_TRY(cublasSetWorkspace(handle, thrust::raw_pointer_cast(workspace.data()), workspace.size()),
                         "products bench");
    struct layer_product {
      const char* layer;
      int C, OC, per_step;
    };
    const layer_product layers[] = {{"qkv", C, 3 * C, L}, {"attention projection", C, C, L},
                                    {"MLP up", C, 4 * C, L}, {"MLP down", 4 * C, C, L}, {"head", C, Vp, 1}};
    double step_ms[4] = {0, 0, 0, 0};
    for (const auto& layer : layers) {
      for (const product& p : linear(rows, layer.C, layer.OC, layer.per_step)) {
        thrust::device_vector<float> a(p.a_elements()), b(p.b_elements()), c(p.c_elements());
        thrust::device_vector<std::uint16_t> a16(a.size()), b16(b.size());
        fill(a, 0.37f);
        fill(b, 0.11f);
        const float* pa = thrust::raw_pointer_cast(a.data());
        const float* pb = thrust::raw_pointer_cast(b.data());
        float* pc = thrust::raw_pointer_cast(c.data());
        std::uint16_t* pa16 = thrust::raw_pointer_cast(a16.data());
        std::uint16_t* pb16 = thrust::raw_pointer_cast(b16.data());
        const float one = 1.0f;
        const auto gemm = [&](const void* x, const void* y, cudaDataType_t type, cublasComputeType_t compute) {
          CHUNKWISE_CUBLAS_TRY(cublasGemmEx(handle, p.op_a, p.op_b, p.m, p.n, p.k, &one, x, type, p.lda, y, type,
                                            p.ldb, &p.beta, pc, CUDA_R_32F, p.ldc, compute, CUBLAS_GEMM_DEFAULT),
                               "products bench");
        };
        const auto round_operands = [&] {
          for_each_index(a.size(), round_to_bf16{pa16, pa});
          for_each_index(b.size(), round_to_bf16{pb16, pb});
        };
        round_operands();
        const double ms[4] = {
            median_ms([&] { gemm(pa, pb, CUDA_R_32F, CUBLAS_COMPUTE_32F); }),
            median_ms([&] { gemm(pa, pb, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF); }),
            median_ms([&] { gemm(pa16, pb16, CUDA_R_16BF, CUBLAS_COMPUTE_32F); }),
            median_ms([&] {
              round_operands();
              gemm(pa16, pb16, CUDA_R_16BF, CUBLAS_COMPUTE_32F);
            })};
        std::printf("products: %-20s %-15s (%5d x %5d x %5d)", layer.layer, p.name, p.m, p.n, p.k);
        const char* names[4] = {"fp32", "fast-bf16", "bf16", "bf16+round"};
        for (int v = 0; v < 4; ++v) {
          std::printf("  %s %7.3f (%5.0f)", names[v], ms[v], p.flops() / (ms[v] * 1e-3) / 1e12);
          step_ms[v] += ms[v] * p.per_step;
        }
        std::printf("\n");
      }
    }
    std::printf("products: a step's products (%d layers and the head, attention's batched ones not included): fp32 "
                "%.2f ms, fast-bf16 %.2f ms, bf16 %.2f ms, bf16+round %.2f ms; fast-bf16 / bf16 %.2fx, "
                "fast-bf16 / bf16+round %.2fx\n",
                L, step_ms[0], step_ms[1], step_ms[2], step_ms[3], step_ms[1] / step_ms[2], step_ms[1] / step_ms[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt2_products_bench: %s\n", e.what());
    if (handle != nullptr) (void)cublasDestroy(handle);
    return 2;
  }
  (void)cublasDestroy(handle);
  return 0;
}
