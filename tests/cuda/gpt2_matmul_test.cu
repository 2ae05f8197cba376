// The example trainer's cuBLAS matmul engine (train_gpt2 --backend cuda) against plain loops in double precision:
// forward with and without bias, and backward accumulating into non-zero dinp, dweight and dbias.
#include "gpu_test_main.hpp"

#include "matmul_engine.hpp"

#include <cmath>
#include <random>
#include <vector>

namespace {

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = value(generator);
  return v;
}

void check_close(const std::vector<float>& got, const std::vector<double>& expected) {
  REQUIRE(got.size() == expected.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - expected[i]) / std::max(1.0, std::abs(expected[i])));
  CAPTURE(worst);
  CHECK(worst < 1e-4);
}

}  // namespace

TEST_CASE("cuBLAS matmuls equal the loops: forward and accumulating backward") {
  const auto& engine = gpt2::cuda_matmul_engine();
  for (const bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    const std::size_t rows = 48, C = 40, OC = 72;  // not multiples of anything
    const auto inp = random_values(rows * C, 1), weight = random_values(OC * C, 2), bias = random_values(OC, 3);
    std::vector<float> out(rows * OC);
    engine.forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, rows, C, OC);
    std::vector<double> expected(rows * OC);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t o = 0; o < OC; ++o) {
        double dot = with_bias ? bias[o] : 0.0;
        for (std::size_t i = 0; i < C; ++i) dot += static_cast<double>(inp[r * C + i]) * weight[o * C + i];
        expected[r * OC + o] = dot;
      }
    check_close(out, expected);

    const auto dout = random_values(rows * OC, 4);
    auto dinp = random_values(rows * C, 5), dweight = random_values(OC * C, 6), dbias = random_values(OC, 7);
    std::vector<double> e_dinp(dinp.begin(), dinp.end()), e_dweight(dweight.begin(), dweight.end()),
        e_dbias(dbias.begin(), dbias.end());
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t o = 0; o < OC; ++o) {
        const double d = dout[r * OC + o];
        e_dbias[o] += d;
        for (std::size_t i = 0; i < C; ++i) {
          e_dinp[r * C + i] += d * weight[o * C + i];
          e_dweight[o * C + i] += d * inp[r * C + i];
        }
      }
    engine.backward(dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, dout.data(), inp.data(),
                    weight.data(), rows, C, OC);
    check_close(dinp, e_dinp);
    check_close(dweight, e_dweight);
    if (with_bias) check_close(dbias, e_dbias);
  }
}
