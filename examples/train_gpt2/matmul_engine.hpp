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

/// Sums of columns over rows, by segments of column_segment rows, each from 0, then the segments in order: the order
/// of the device passes (device_kernels.hpp), whose threads each sum one segment of one column, so that both give the
/// same bits. Rows are added in order: the current row's terms go into part(), then end_row.
template <class Real>
class segmented_column_sums {
 public:
  segmented_column_sums(std::size_t rows, std::size_t columns)
      : rows_(rows), total_(columns, Real(0)), part_(columns, Real(0)) {}
  [[nodiscard]] Real* part() noexcept { return part_.data(); }
  void end_row(std::size_t row) {
    if ((row + 1) % column_segment != 0 && row + 1 != rows_) return;
    for (std::size_t o = 0; o < total_.size(); ++o) total_[o] += part_[o];
    std::fill(part_.begin(), part_.end(), Real(0));
  }
  void add_to(Real* sums) const {
    for (std::size_t o = 0; o < total_.size(); ++o) sums[o] += total_[o];
  }

 private:
  std::size_t rows_;
  std::vector<Real> total_, part_;
};

/// dbias[o] += the sum over rows of dout[row, o]: backward's bias gradient, which the engines leave to the loop.
template <class Real>
void add_column_sums(Real* dbias, const Real* dout, std::size_t rows, std::size_t OC) {
  segmented_column_sums<Real> sums(rows, OC);
  for (std::size_t r = 0; r < rows; ++r) {
    Real* part = sums.part();
    for (std::size_t o = 0; o < OC; ++o) part[o] += dout[r * OC + o];
    sums.end_row(r);
  }
  sums.add_to(dbias);
}

/// The installed engine, or null for the CPU loops. Install before training starts (it is not synchronised).
inline const matmul_engine*& installed_matmul_engine() noexcept {
  static const matmul_engine* engine = nullptr;
  return engine;
}

}  // namespace gpt2
