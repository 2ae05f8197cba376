#pragma once
// Causal self-attention's matrix products as strided batched products (cuBLAS's cublasSgemmStridedBatched: column-
// major, op(A) m x k times op(B) k x n into C m x n, `batch` of them `stride` elements apart), one batch of the NH
// heads of one sequence b: the heads of qkv are hs channels apart, their (T, T) score blocks T * T apart. A row-major
// (rows, cols) array with row stride ld is, column-major, its transpose (cols, rows) with leading dimension ld.
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

namespace gpt2::attention_products {

using device_kernels::attention_geometry;
using device_kernels::index;

/// C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, X_i = x + i * stride_x; column-major, fp32.
struct strided_gemm {
  bool transpose_a = false, transpose_b = false;
  index m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  index lda = 0, stride_a = 0;
  const float* b = nullptr;
  index ldb = 0, stride_b = 0;
  float beta = 0.0f;
  float* c = nullptr;
  index ldc = 0, stride_c = 0;
  index batch = 0;
};

namespace detail {
// Head 0 of `part` (0 query, 1 key, 2 value) of sequence b in qkv (B, T, 3C): column-major (hs, T), ld 3C.
inline const float* head_part(const attention_geometry& g, const float* qkv, index b, index part) {
  return qkv + g.at(b, 0, 0, part);
}
inline float* head_part(const attention_geometry& g, float* qkv, index b, index part) {
  return qkv + g.at(b, 0, 0, part);
}
// The (T, T) blocks of sequence b's heads in a (B, NH, T, T) array: block[t][t2] is column-major [t2][t], ld T.
inline index blocks_of(const attention_geometry& g, index b) { return b * g.NH * g.T * g.T; }
// Head 0 of sequence b in a (B, T, C) array (the attention's output and its gradient): column-major (hs, T), ld C.
inline index channels_of(const attention_geometry& g, index b) { return b * g.T * g.C; }
// The batch of NH heads: per head, hs channels of qkv or of a (B, T, C) array; one (T, T) block of scores.
inline strided_gemm heads(const attention_geometry& g) {
  strided_gemm p;
  p.batch = g.NH;
  return p;
}
}  // namespace detail

/// Forward: scores[b, h, t, t2] = scale * q(t) . k(t2), every t2. Column-major: scores^T = scale K^T . Q.
inline strided_gemm scores(const attention_geometry& g, const float* qkv, float* out, index b) {
  auto p = detail::heads(g);
  p.transpose_a = true;
  p.m = g.T, p.n = g.T, p.k = g.hs(), p.alpha = g.scale();
  p.a = detail::head_part(g, qkv, b, 1), p.lda = 3 * g.C, p.stride_a = g.hs();
  p.b = detail::head_part(g, qkv, b, 0), p.ldb = 3 * g.C, p.stride_b = g.hs();
  p.c = out + detail::blocks_of(g, b), p.ldc = g.T, p.stride_c = g.T * g.T;
  return p;
}

/// Forward: out[b, t, h, :] = sum over t2 of att[b, h, t, t2] * v(t2) (att is 0 past t). Column-major: out = V . att^T.
inline strided_gemm values(const attention_geometry& g, const float* att, const float* qkv, float* out, index b) {
  auto p = detail::heads(g);
  p.m = g.hs(), p.n = g.T, p.k = g.T;
  p.a = detail::head_part(g, qkv, b, 2), p.lda = 3 * g.C, p.stride_a = g.hs();
  p.b = att + detail::blocks_of(g, b), p.ldb = g.T, p.stride_b = g.T * g.T;
  p.c = out + detail::channels_of(g, b), p.ldc = g.C, p.stride_c = g.hs();
  return p;
}

/// Backward: datt[b, h, t, t2] = dout(t) . v(t2), every t2 (as scores, with dout for the queries); overwrites.
inline strided_gemm attention_weights_backward(const attention_geometry& g, const float* dout, const float* qkv,
                                               float* datt, index b) {
  auto p = detail::heads(g);
  p.transpose_a = true;
  p.m = g.T, p.n = g.T, p.k = g.hs();
  p.a = detail::head_part(g, qkv, b, 2), p.lda = 3 * g.C, p.stride_a = g.hs();
  p.b = dout + detail::channels_of(g, b), p.ldb = g.C, p.stride_b = g.hs();
  p.c = datt + detail::blocks_of(g, b), p.ldc = g.T, p.stride_c = g.T * g.T;
  return p;
}

namespace detail {
// The scores' backward into part 0 (the queries: dQ += scale K . dpreatt^T) or part 1 (the keys: dK += scale
// Q . dpreatt), from the other part's values.
inline strided_gemm scores_backward(const attention_geometry& g, const float* dpreatt, const float* qkv, float* dqkv,
                                    index b, index part) {
  auto p = heads(g);
  p.transpose_b = part == 1;
  p.m = g.hs(), p.n = g.T, p.k = g.T, p.alpha = g.scale(), p.beta = 1.0f;
  p.a = head_part(g, qkv, b, 1 - part), p.lda = 3 * g.C, p.stride_a = g.hs();
  p.b = dpreatt + blocks_of(g, b), p.ldb = g.T, p.stride_b = g.T * g.T;
  p.c = head_part(g, dqkv, b, part), p.ldc = 3 * g.C, p.stride_c = g.hs();
  return p;
}
}  // namespace detail

/// Backward: dq(t) += scale * sum over t2 of dpreatt[b, h, t, t2] * k(t2).
inline strided_gemm queries_backward(const attention_geometry& g, const float* dpreatt, const float* qkv, float* dqkv,
                                     index b) {
  return detail::scores_backward(g, dpreatt, qkv, dqkv, b, 0);
}

/// Backward: dk(t2) += scale * sum over t of dpreatt[b, h, t, t2] * q(t).
inline strided_gemm keys_backward(const attention_geometry& g, const float* dpreatt, const float* qkv, float* dqkv,
                                  index b) {
  return detail::scores_backward(g, dpreatt, qkv, dqkv, b, 1);
}

/// Backward: dv(t2) += sum over t of att[b, h, t, t2] * dout(t). Column-major: dV += dout . att.
inline strided_gemm values_backward(const attention_geometry& g, const float* att, const float* dout, float* dqkv,
                                    index b) {
  auto p = detail::heads(g);
  p.transpose_b = true;
  p.m = g.hs(), p.n = g.T, p.k = g.T, p.beta = 1.0f;
  p.a = dout + detail::channels_of(g, b), p.lda = g.C, p.stride_a = g.hs();
  p.b = att + detail::blocks_of(g, b), p.ldb = g.T, p.stride_b = g.T * g.T;
  p.c = detail::head_part(g, dqkv, b, 2), p.ldc = 3 * g.C, p.stride_c = g.hs();
  return p;
}

/// The product as cuBLAS defines it, in loops on the host: what the test checks the descriptors with.
inline void reference_gemm(const strided_gemm& p) {
  for (index i = 0; i < p.batch; ++i) {
    const float* a = p.a + i * p.stride_a;
    const float* b = p.b + i * p.stride_b;
    float* c = p.c + i * p.stride_c;
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
