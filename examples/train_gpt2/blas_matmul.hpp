#pragma once
// The matrix products through OpenBLAS's sgemm (Debian's libopenblas-dev), where the build found it
// (CHUNKWISE_GPT2_BLAS): the same llm.c shapes as the loops in gpt2_model.hpp, out (rows, OC) = inp (rows, C) .
// weight (OC, C)^T + bias, and backward's three accumulations as two products and a column sum. Results agree with
// the loops to rounding (another summation order), not bit for bit: the reference-equality tests install no engine.
#include "matmul_engine.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstddef>

namespace gpt2 {

namespace blas_detail {

inline int blas_int(std::size_t n) noexcept { return static_cast<int>(n); }

inline void forward(float* out, const float* inp, const float* weight, const float* bias, std::size_t rows,
                    std::size_t C, std::size_t OC) {
  if (bias != nullptr)
    for (std::size_t r = 0; r < rows; ++r) std::copy(bias, bias + OC, out + r * OC);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(rows), blas_int(OC), blas_int(C), 1.0f, inp,
              blas_int(C), weight, blas_int(C), bias != nullptr ? 1.0f : 0.0f, out, blas_int(OC));
}

inline void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, std::size_t rows, std::size_t C, std::size_t OC) {
  // dinp (rows, C) += dout (rows, OC) . weight (OC, C)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(rows), blas_int(C), blas_int(OC), 1.0f, dout,
              blas_int(OC), weight, blas_int(C), 1.0f, dinp, blas_int(C));
  // dweight (OC, C) += dout^T (OC, rows) . inp (rows, C)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(OC), blas_int(C), blas_int(rows), 1.0f, dout,
              blas_int(OC), inp, blas_int(C), 1.0f, dweight, blas_int(C));
  if (dbias != nullptr) add_column_sums(dbias, dout, rows, OC);
}

}  // namespace blas_detail

/// The OpenBLAS engine; `threads`: the BLAS threads each product may use (the cores divided among the ranks).
inline const matmul_engine& blas_matmul_engine(int threads) {
  openblas_set_num_threads(std::max(threads, 1));
  static const matmul_engine engine{"OpenBLAS sgemm", blas_detail::forward, blas_detail::backward};
  return engine;
}

}  // namespace gpt2
