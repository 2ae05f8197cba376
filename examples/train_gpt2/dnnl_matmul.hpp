#pragma once
// The matrix products through oneDNN's matmul (Debian's libdnnl-dev), where the build found it (CHUNKWISE_GPT2_DNNL):
// llm.c's shapes as the loops in gpt2_model.hpp, out (rows, OC) = inp (rows, C) . weight (OC, C)^T + bias, and
// backward's accumulations as two products that add into dinp and dweight (oneDNN's sum post-op) and a column sum.
//
// Two precisions. fp32: oneDNN's fp32 kernels, the loops' results to rounding (another summation order). bf16: the
// operands rounded to bf16 (to nearest, ties to even), products accumulated in fp32 and written as fp32, as PyTorch's
// autocast does: on a CPU with AVX-512 BF16 (vdpbf16ps) twice the fp32 rate (measured here, 2 cores: 380-440 GFLOP/s
// against 195-220 at the 12x768 model's shapes). Under --dtype bf16 the weights already are bf16 values (the chunks
// hold bf16; fp32_compute widens them), so only the activations and their gradients lose bits.
//
// Each thread (each rank's) keeps its own oneDNN engine, stream, primitives (by shape) and bf16 scratch.
#include "matmul_engine.hpp"

#include <chunkwise/core/dtype.hpp>

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpt2 {

namespace dnnl_detail {

enum class precision { fp32, bf16 };

/// What one product is: dst (M, N) [+]= src (M, K) . weights (K, N); src and weights read transposed where asked
/// (row-major storage of the transpose), dst accumulated into where `accumulate`.
struct product_shape {
  std::int64_t M, K, N;
  bool src_transposed, weights_transposed, accumulate, bias;
  auto key() const { return std::tuple(M, K, N, src_transposed, weights_transposed, accumulate, bias); }
  bool operator<(const product_shape& other) const { return key() < other.key(); }
};

class thread_state {
 public:
  thread_state() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  /// dst [+]= src . weights (+ bias): pointers to fp32, or to bf16 bits under precision::bf16.
  void run(precision p, const product_shape& s, const void* src, const void* weights, const float* bias, float* dst) {
    auto& primitive = primitive_for(p, s);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(primitive.src, engine_, const_cast<void*>(src))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(primitive.weights, engine_, const_cast<void*>(weights))},
        {DNNL_ARG_DST, dnnl::memory(primitive.dst, engine_, dst)}};
    if (s.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(primitive.bias, engine_, const_cast<float*>(bias)));
    primitive.matmul.execute(stream_, args);
    stream_.wait();
  }

  /// Scratch for bf16 operands: slot 0..2, at least `elements` long.
  chunkwise::bf16* scratch(int slot, std::size_t elements) {
    auto& buffer = scratch_[static_cast<std::size_t>(slot)];
    if (buffer.size() < elements) buffer.resize(elements);
    return buffer.data();
  }

 private:
  struct cached_primitive {
    dnnl::memory::desc src, weights, dst, bias;
    dnnl::matmul matmul;
  };

  cached_primitive& primitive_for(precision p, const product_shape& s) {
    auto& cache = p == precision::bf16 ? bf16_ : fp32_;
    const auto found = cache.find(s);
    if (found != cache.end()) return found->second;
    using tag = dnnl::memory::format_tag;
    const auto operand = p == precision::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
    const auto f32 = dnnl::memory::data_type::f32;
    cached_primitive made;
    made.src = dnnl::memory::desc({s.M, s.K}, operand, s.src_transposed ? tag::ba : tag::ab);
    made.weights = dnnl::memory::desc({s.K, s.N}, operand, s.weights_transposed ? tag::ba : tag::ab);
    made.dst = dnnl::memory::desc({s.M, s.N}, f32, tag::ab);
    made.bias = dnnl::memory::desc({1, s.N}, f32, tag::ab);
    dnnl::primitive_attr attributes;
    if (s.accumulate) {
      dnnl::post_ops sum;
      sum.append_sum(1.0f);
      attributes.set_post_ops(sum);
    }
    const auto descriptor = s.bias ? dnnl::matmul::desc(made.src, made.weights, made.bias, made.dst)
                                   : dnnl::matmul::desc(made.src, made.weights, made.dst);
    made.matmul = dnnl::matmul(dnnl::matmul::primitive_desc(descriptor, attributes, engine_));
    return cache.emplace(s, std::move(made)).first->second;
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<product_shape, cached_primitive> fp32_, bf16_;
  std::vector<chunkwise::bf16> scratch_[3];
};

inline thread_state& this_thread() {
  thread_local thread_state state;
  return state;
}

/// out[i] = bf16(in[i]), to nearest even (chunkwise::to_bf16: integer arithmetic, which the compiler vectorises).
inline chunkwise::bf16* rounded(const float* in, std::size_t n, int slot) {
  chunkwise::bf16* out = this_thread().scratch(slot, n);
#pragma omp parallel for
  for (std::size_t i = 0; i < n; ++i) out[i] = chunkwise::to_bf16(in[i]);
  return out;
}

template <precision P>
const void* operand(const float* values, std::size_t n, int slot) {
  if constexpr (P == precision::bf16)
    return rounded(values, n, slot);
  else
    return values;
}

template <precision P>
void forward(float* out, const float* inp, const float* weight, const float* bias, std::size_t rows, std::size_t C,
             std::size_t OC) {
  const auto M = static_cast<std::int64_t>(rows), K = static_cast<std::int64_t>(C), N = static_cast<std::int64_t>(OC);
  // weights (K, N) = weight^T: weight (OC, C) row-major is that matrix stored transposed
  this_thread().run(P, {M, K, N, false, true, false, bias != nullptr}, operand<P>(inp, rows * C, 0),
                    operand<P>(weight, OC * C, 1), bias, out);
}

template <precision P>
void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
              std::size_t rows, std::size_t C, std::size_t OC) {
  const auto M = static_cast<std::int64_t>(rows), K = static_cast<std::int64_t>(C), N = static_cast<std::int64_t>(OC);
  const void* dout_operand = operand<P>(dout, rows * OC, 0);
  // dinp (rows, C) += dout (rows, OC) . weight (OC, C)
  this_thread().run(P, {M, N, K, false, false, true, false}, dout_operand, operand<P>(weight, OC * C, 1), nullptr,
                    dinp);
  // dweight (OC, C) += dout^T (OC, rows) . inp (rows, C)
  this_thread().run(P, {N, M, K, true, false, true, false}, dout_operand, operand<P>(inp, rows * C, 2), nullptr,
                    dweight);
  if (dbias != nullptr) add_column_sums(dbias, dout, rows, OC);
}

}  // namespace dnnl_detail

/// The oneDNN engine: fp32 products, or bf16 operands with fp32 accumulation (`bf16_operands`). Its threads are the
/// calling thread's OpenMP team (oneDNN in Debian runs on OpenMP): a rank's share of the cores.
inline const matmul_engine& dnnl_matmul_engine(bool bf16_operands) {
  using dnnl_detail::precision;
  static const matmul_engine fp32{"oneDNN matmul, fp32", dnnl_detail::forward<precision::fp32>,
                                  dnnl_detail::backward<precision::fp32>};
  static const matmul_engine bf16{"oneDNN matmul, bf16 operands and fp32 accumulation",
                                  dnnl_detail::forward<precision::bf16>, dnnl_detail::backward<precision::bf16>};
  return bf16_operands ? bf16 : fp32;
}

}  // namespace gpt2
