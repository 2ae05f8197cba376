#pragma once
// Causal self-attention's matrix products as batched products (column-major, op(A) m x k times op(B) k x n into
// C m x n), one matrix per head of each of the B sequences: the heads of qkv are hs channels apart, their (T, T)
// score blocks T * T apart, and the sequences further (strided_gemm). The GPU runs each as one cuBLAS call over
// B * NH matrices (cublasGemmBatchedEx on batch_pointers' arrays). A row-major (rows, cols) array with row stride
// ld is, column-major, its transpose (cols, rows) with leading dimension ld.
// device_model_impl.hpp runs them through cuBLAS on the GPU, where device_kernels.hpp's per-element stages would
// re-read each head's keys and values once per query; the host build keeps those stages (the CPU loops' order, bit
// for bit), and its test runs these descriptors through reference_gemm against them.
//
// Every product covers whole (T, T) blocks, the causal mask's upper triangle too (half the arithmetic, which the
// products' speed repays): scores and datt there are never read (the softmax and its backward read t2 <= t), and
// att and dpreatt there are zeros (attention_softmax and attention_backward_softmax write them, in place over the
// scores and datt), so the products that read them add nothing for masked positions. The scores and datt are
// written whole: none of the (T, T) blocks needs zeroing first.
#include "device_kernels.hpp"

#include <vector>

namespace gpt2::attention_products {

using device_kernels::attention_geometry;
using device_kernels::index;

/// C_i = alpha op(A_i) op(B_i) + beta C_i for the matrices i < sequences * batch: one per head (batch, NH) of each
/// sequence, X_i = x + (i / batch) * sequence_stride_x + (i % batch) * stride_x; column-major, fp32. The heads of a
/// sequence are one stride apart, the sequences another (qkv's rows hold all heads), so the whole batch is one
/// product only as cuBLAS's pointer-array form (batch_pointers): per sequence, NH products of (T, T, hs) would
/// leave most of a large GPU idle and cost B launches.
struct strided_gemm {
  bool transpose_a = false, transpose_b = false;
  index m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  index lda = 0, stride_a = 0, sequence_stride_a = 0;
  const float* b = nullptr;
  index ldb = 0, stride_b = 0, sequence_stride_b = 0;
  float beta = 0.0f;
  float* c = nullptr;
  index ldc = 0, stride_c = 0, sequence_stride_c = 0;
  index batch = 0, sequences = 1;
  [[nodiscard]] GPT2_HOST_DEVICE index count() const { return sequences * batch; }
  [[nodiscard]] GPT2_HOST_DEVICE index offset(index i, index stride, index sequence_stride) const {
    return (i / batch) * sequence_stride + (i % batch) * stride;
  }
  [[nodiscard]] GPT2_HOST_DEVICE const float* a_of(index i) const { return a + offset(i, stride_a, sequence_stride_a); }
  [[nodiscard]] GPT2_HOST_DEVICE const float* b_of(index i) const { return b + offset(i, stride_b, sequence_stride_b); }
  [[nodiscard]] GPT2_HOST_DEVICE float* c_of(index i) const { return c + offset(i, stride_c, sequence_stride_c); }
};

/// The product's matrices as the pointer arrays cuBLAS's batched form reads (device memory, written in stream order
/// before the product): a[i], b[i], c[i] for each matrix i < p.count(), one per index.
struct batch_pointers {
  strided_gemm p;
  const float** a;
  const float** b;
  float** c;
  GPT2_HOST_DEVICE void operator()(index i) const {
    a[i] = p.a_of(i);
    b[i] = p.b_of(i);
    c[i] = p.c_of(i);
  }
};

namespace detail {
// Head 0 of `part` (0 query, 1 key, 2 value) of sequence 0 in qkv (B, T, 3C): column-major (hs, T), ld 3C; the next
// sequence's 3 T C further.
inline const float* head_part(const attention_geometry& g, const float* qkv, index part) {
  return qkv + g.at(0, 0, 0, part);
}
inline float* head_part(const attention_geometry& g, float* qkv, index part) { return qkv + g.at(0, 0, 0, part); }
// The (T, T) blocks of the heads in a (B, NH, T, T) array: block[t][t2] is column-major [t2][t], ld T; a sequence's
// NH blocks after the one before.
inline index blocks_per_sequence(const attention_geometry& g) { return g.NH * g.T * g.T; }
// The batch of B sequences of NH heads: per head, hs channels of qkv or of a (B, T, C) array (the attention's output
// and its gradient: column-major (hs, T), ld C, a sequence T C after the one before); one (T, T) block of scores.
inline strided_gemm heads(const attention_geometry& g, index sequences) {
  strided_gemm p;
  p.batch = g.NH, p.sequences = sequences;
  return p;
}
}  // namespace detail

/// Forward: scores[b, h, t, t2] = scale * q(t) . k(t2), every t2, for the B sequences. Column-major: scores^T =
/// scale K^T . Q.
inline strided_gemm scores(const attention_geometry& g, const float* qkv, float* out, index B) {
  auto p = detail::heads(g, B);
  p.transpose_a = true;
  p.m = g.T, p.n = g.T, p.k = g.hs(), p.alpha = g.scale();
  p.a = detail::head_part(g, qkv, 1), p.lda = 3 * g.C, p.stride_a = g.hs(), p.sequence_stride_a = 3 * g.T * g.C;
  p.b = detail::head_part(g, qkv, 0), p.ldb = 3 * g.C, p.stride_b = g.hs(), p.sequence_stride_b = 3 * g.T * g.C;
  p.c = out, p.ldc = g.T, p.stride_c = g.T * g.T, p.sequence_stride_c = detail::blocks_per_sequence(g);
  return p;
}

/// Forward: out[b, t, h, :] = sum over t2 of att[b, h, t, t2] * v(t2) (att is 0 past t). Column-major: out = V . att^T.
inline strided_gemm values(const attention_geometry& g, const float* att, const float* qkv, float* out, index B) {
  auto p = detail::heads(g, B);
  p.m = g.hs(), p.n = g.T, p.k = g.T;
  p.a = detail::head_part(g, qkv, 2), p.lda = 3 * g.C, p.stride_a = g.hs(), p.sequence_stride_a = 3 * g.T * g.C;
  p.b = att, p.ldb = g.T, p.stride_b = g.T * g.T, p.sequence_stride_b = detail::blocks_per_sequence(g);
  p.c = out, p.ldc = g.C, p.stride_c = g.hs(), p.sequence_stride_c = g.T * g.C;
  return p;
}

/// Backward: datt[b, h, t, t2] = dout(t) . v(t2), every t2 (as scores, with dout for the queries); overwrites.
inline strided_gemm attention_weights_backward(const attention_geometry& g, const float* dout, const float* qkv,
                                               float* datt, index B) {
  auto p = detail::heads(g, B);
  p.transpose_a = true;
  p.m = g.T, p.n = g.T, p.k = g.hs();
  p.a = detail::head_part(g, qkv, 2), p.lda = 3 * g.C, p.stride_a = g.hs(), p.sequence_stride_a = 3 * g.T * g.C;
  p.b = dout, p.ldb = g.C, p.stride_b = g.hs(), p.sequence_stride_b = g.T * g.C;
  p.c = datt, p.ldc = g.T, p.stride_c = g.T * g.T, p.sequence_stride_c = detail::blocks_per_sequence(g);
  return p;
}

namespace detail {
// The scores' backward into part 0 (the queries: dQ += scale K . dpreatt^T) or part 1 (the keys: dK += scale
// Q . dpreatt), from the other part's values.
inline strided_gemm scores_backward(const attention_geometry& g, const float* dpreatt, const float* qkv, float* dqkv,
                                    index B, index part) {
  auto p = heads(g, B);
  p.transpose_b = part == 1;
  p.m = g.hs(), p.n = g.T, p.k = g.T, p.alpha = g.scale(), p.beta = 1.0f;
  p.a = head_part(g, qkv, 1 - part), p.lda = 3 * g.C, p.stride_a = g.hs(), p.sequence_stride_a = 3 * g.T * g.C;
  p.b = dpreatt, p.ldb = g.T, p.stride_b = g.T * g.T, p.sequence_stride_b = blocks_per_sequence(g);
  p.c = head_part(g, dqkv, part), p.ldc = 3 * g.C, p.stride_c = g.hs(), p.sequence_stride_c = 3 * g.T * g.C;
  return p;
}
}  // namespace detail

/// Backward: dq(t) += scale * sum over t2 of dpreatt[b, h, t, t2] * k(t2).
inline strided_gemm queries_backward(const attention_geometry& g, const float* dpreatt, const float* qkv, float* dqkv,
                                     index B) {
  return detail::scores_backward(g, dpreatt, qkv, dqkv, B, 0);
}

/// Backward: dk(t2) += scale * sum over t of dpreatt[b, h, t, t2] * q(t).
inline strided_gemm keys_backward(const attention_geometry& g, const float* dpreatt, const float* qkv, float* dqkv,
                                  index B) {
  return detail::scores_backward(g, dpreatt, qkv, dqkv, B, 1);
}

/// Backward: dv(t2) += sum over t of att[b, h, t, t2] * dout(t). Column-major: dV += dout . att.
inline strided_gemm values_backward(const attention_geometry& g, const float* att, const float* dout, float* dqkv,
                                    index B) {
  auto p = detail::heads(g, B);
  p.transpose_b = true;
  p.m = g.hs(), p.n = g.T, p.k = g.T, p.beta = 1.0f;
  p.a = dout, p.lda = g.C, p.stride_a = g.hs(), p.sequence_stride_a = g.T * g.C;
  p.b = att, p.ldb = g.T, p.stride_b = g.T * g.T, p.sequence_stride_b = detail::blocks_per_sequence(g);
  p.c = detail::head_part(g, dqkv, 2), p.ldc = 3 * g.C, p.stride_c = g.hs(), p.sequence_stride_c = 3 * g.T * g.C;
  return p;
}

/// The product as cuBLAS defines it, in loops on the host over the matrices batch_pointers gives: what the test
/// checks the descriptors and the pointers with.
inline void reference_gemm(const strided_gemm& p) {
  std::vector<const float*> as(p.count()), bs(p.count());
  std::vector<float*> cs(p.count());
  for (index i = 0; i < p.count(); ++i) batch_pointers{p, as.data(), bs.data(), cs.data()}(i);
  for (index i = 0; i < p.count(); ++i) {
    const float* a = as[i];
    const float* b = bs[i];
    float* c = cs[i];
    for (index col = 0; col < p.n; ++col)
      for (index row = 0; row < p.m; ++row) {
        float sum = 0;
        for (index k = 0; k < p.k; ++k)
          sum += (p.transpose_a ? a[k + row * p.lda] : a[row + k * p.lda]) *
                 (p.transpose_b ? b[col + k * p.ldb] : b[k + col * p.ldb]);
        float& out = c[row + col * p.ldc];
        out = p.alpha * sum + (p.beta == 0.0f ? 0.0f : p.beta * out);
      }
  }
}

}  // namespace gpt2::attention_products
