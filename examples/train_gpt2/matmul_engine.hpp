#pragma once
// Where the model's matrix products run. By default the loops in gpt2_model.hpp (OpenMP on the CPU); a trainer may
// install another engine for fp32, as train_gpt2 installs OpenBLAS (blas_matmul.hpp). The products keep
// llm.c's shapes: out (B*T, OC) = inp (B*T, C) . weight (OC, C)^T + bias; backward accumulates into dinp, dweight
// and dbias (bias pointers may be null).
#include <cstddef>

namespace gpt2 {

struct matmul_engine {
  const char* name;
  void (*forward)(float* out, const float* inp, const float* weight, const float* bias, std::size_t rows,
                  std::size_t C, std::size_t OC);
  void (*backward)(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                   const float* weight, std::size_t rows, std::size_t C, std::size_t OC);
};

/// dbias[o] += the sum over rows of dout[row, o]: backward's bias gradient, which the engines leave to the loop.
inline void add_column_sums(float* dbias, const float* dout, std::size_t rows, std::size_t OC) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t o = 0; o < OC; ++o) dbias[o] += dout[r * OC + o];
}

/// The installed engine, or null for the CPU loops. Install before training starts (it is not synchronised).
inline const matmul_engine*& installed_matmul_engine() noexcept {
  static const matmul_engine* engine = nullptr;
  return engine;
}

}  // namespace gpt2
