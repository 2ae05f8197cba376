#pragma once
// Where the model's matrix products run. By default the loops in gpt2_model.hpp (OpenMP on the CPU); a trainer may
// install another engine for fp32, as train_gpt2 installs OpenBLAS (blas_matmul.hpp). The products keep
// llm.c's shapes: out (B*T, OC) = inp (B*T, C) . weight (OC, C)^T + bias; backward accumulates into dinp, dweight
// and dbias (bias pointers may be null).
#include <algorithm>
#include <cstddef>
#include <vector>

namespace gpt2 {

struct matmul_engine {
  const char* name;
  void (*forward)(float* out, const float* inp, const float* weight, const float* bias, std::size_t rows,
                  std::size_t C, std::size_t OC);
  void (*backward)(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                   const float* weight, std::size_t rows, std::size_t C, std::size_t OC);
};

/// Rows a column sum adds at a time (see add_column_sums).
inline constexpr std::size_t column_segment = 64;

/// dbias[o] += the sum over rows of dout[row, o]: backward's bias gradient, which the engines leave to the loop. Summed
/// by segments of column_segment rows, each from 0, then the segments in order: the order of the device passes
/// (device_kernels.hpp), whose threads each sum one segment of one column, so that both give the same bits.
template <class Real>
void add_column_sums(Real* dbias, const Real* dout, std::size_t rows, std::size_t OC) {
  std::vector<Real> total(OC, Real(0)), part(OC);
  for (std::size_t begin = 0; begin < rows; begin += column_segment) {
    std::fill(part.begin(), part.end(), Real(0));
    for (std::size_t r = begin; r < std::min(rows, begin + column_segment); ++r)
      for (std::size_t o = 0; o < OC; ++o) part[o] += dout[r * OC + o];
    for (std::size_t o = 0; o < OC; ++o) total[o] += part[o];
  }
  for (std::size_t o = 0; o < OC; ++o) dbias[o] += total[o];
}

/// The installed engine, or null for the CPU loops. Install before training starts (it is not synchronised).
inline const matmul_engine*& installed_matmul_engine() noexcept {
  static const matmul_engine* engine = nullptr;
  return engine;
}

}  // namespace gpt2
