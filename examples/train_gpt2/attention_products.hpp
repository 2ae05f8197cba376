#pragma once
// Causal self-attention's matrix products as batched products (column-major, op(A) m x k times op(B) k x n into
// C m x n), one matrix per head of each of the B sequences: the heads of qkv are hs channels apart, their (T, T)
// score blocks T * T apart, and the sequences further (head_matrices). The GPU runs each as one cuBLAS call over
// B * NH matrices (cublasGemmBatchedEx on batch_pointers' arrays). A row-major (rows, cols) array with row stride
// ld is, column-major, its transpose (cols, rows) with leading dimension ld.
// device_model_impl.hpp runs them through cuBLAS on the GPU, where device_kernels.hpp's per-element stages would
// re-read each head's keys and values once per query; the host build keeps those stages (the CPU loops' order, bit
// for bit), and its test runs these descriptors through reference_gemm against them.
//
// Every product covers whole (T, T) blocks, the causal mask's upper triangle too (half the arithmetic, which the
// products' speed repays): scores and datt there are never read (the softmax and its backward read t2 <= t), and
// att and dpreatt there are zeros (attention_softmax and attention_backward_softmax write them, in place over the
// scores and datt), so the products that read them add nothing for masked positions. Every product writes its
// output whole (the scores, datt, and each third of dqkv): nothing needs zeroing first.
#include "device_kernels.hpp"

#include <vector>

namespace gpt2::attention_products {

using device_kernels::attention_geometry;
using device_kernels::index;

/// One operand's matrices, one per head of each sequence: head h of sequence b at data + b * sequence_stride +
/// h * stride, column-major with leading dimension ld. The heads of a sequence are one stride apart, the sequences
/// another (qkv's rows hold all heads), so a whole batch is one product only in cuBLAS's pointer-array form
/// (batch_pointers): per sequence, NH products of (T, T, hs) would leave most of a large GPU idle and cost B launches.
template <class Element>
struct head_matrices {
  Element* data = nullptr;
  index ld = 0, stride = 0, sequence_stride = 0;
  /// Matrix i of a batch of `heads` per sequence.
  [[nodiscard]] GPT2_HOST_DEVICE Element* of(index i, index heads) const {
    return data + (i / heads) * sequence_stride + (i % heads) * stride;
  }
};

/// C_i = alpha op(A_i) op(B_i) + beta C_i for the matrices i < sequences * heads; column-major, fp32.
struct strided_gemm {
  bool transpose_a = false, transpose_b = false;
  index m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  head_matrices<const float> a, b;
  float beta = 0.0f;
  head_matrices<float> c;
  index heads = 0, sequences = 1;
  [[nodiscard]] GPT2_HOST_DEVICE index count() const { return sequences * heads; }
};

/// The product's matrices as the pointer arrays cuBLAS's batched form reads (device memory, written in stream order
/// before the product): a[i], b[i], c[i] for each matrix i < p.count(), one per index.
struct batch_pointers {
  strided_gemm p;
  const float** a;
  const float** b;
  float** c;
  GPT2_HOST_DEVICE void operator()(index i) const {
    a[i] = p.a.of(i, p.heads);
    b[i] = p.b.of(i, p.heads);
    c[i] = p.c.of(i, p.heads);
  }
};

namespace detail {
// The hs channels of `part` (0 query, 1 key, 2 value) of each head in qkv (B, T, 3C): column-major (hs, T), ld 3C.
template <class Element>
head_matrices<Element> qkv_heads(const attention_geometry& g, Element* qkv, index part) {
  return {qkv + g.at(0, 0, 0, part), 3 * g.C, g.hs(), 3 * g.T * g.C};
}
// Each head's hs channels in a (B, T, C) array (the attention's output and its gradient): (hs, T), ld C.
template <class Element>
head_matrices<Element> channel_heads(const attention_geometry& g, Element* x) {
  return {x, g.C, g.hs(), g.T * g.C};
}
// Each head's (T, T) block in a (B, NH, T, T) array: block[t][t2] is column-major [t2][t], ld T.
template <class Element>
head_matrices<Element> score_blocks(const attention_geometry& g, Element* blocks) {
  return {blocks, g.T, g.T * g.T, g.NH * g.T * g.T};
}
// A product of m x k by k x n per head of each of the B sequences.
inline strided_gemm heads(const attention_geometry& g, index B, index m, index n, index k) {
  strided_gemm p;
  p.m = m, p.n = n, p.k = k;
  p.heads = g.NH, p.sequences = B;
  return p;
}
}  // namespace detail

/// Forward: scores[b, h, t, t2] = scale * q(t) . k(t2), every t2, for the B sequences. Column-major: scores^T =
/// scale K^T . Q.
inline strided_gemm scores(const attention_geometry& g, const float* qkv, float* out, index B) {
  auto p = detail::heads(g, B, g.T, g.T, g.hs());
  p.transpose_a = true, p.alpha = g.scale();
  p.a = detail::qkv_heads(g, qkv, 1), p.b = detail::qkv_heads(g, qkv, 0), p.c = detail::score_blocks(g, out);
  return p;
}

/// Forward: out[b, t, h, :] = sum over t2 of att[b, h, t, t2] * v(t2) (att is 0 past t). Column-major: out = V . att^T.
inline strided_gemm values(const attention_geometry& g, const float* att, const float* qkv, float* out, index B) {
  auto p = detail::heads(g, B, g.hs(), g.T, g.T);
  p.a = detail::qkv_heads(g, qkv, 2), p.b = detail::score_blocks(g, att), p.c = detail::channel_heads(g, out);
  return p;
}

/// Backward: datt[b, h, t, t2] = dout(t) . v(t2), every t2 (as scores, with dout for the queries); overwrites.
inline strided_gemm attention_weights_backward(const attention_geometry& g, const float* dout, const float* qkv,
                                               float* datt, index B) {
  auto p = detail::heads(g, B, g.T, g.T, g.hs());
  p.transpose_a = true;
  p.a = detail::qkv_heads(g, qkv, 2), p.b = detail::channel_heads(g, dout), p.c = detail::score_blocks(g, datt);
  return p;
}

namespace detail {
// The scores' backward into part 0 (the queries: dQ = scale K . dpreatt^T) or part 1 (the keys: dK = scale
// Q . dpreatt), from the other part's values; overwrites (dpreatt is 0 past t, so every product is whole).
inline strided_gemm scores_backward(const attention_geometry& g, const float* dpreatt, const float* qkv, float* dqkv,
                                    index B, index part) {
  auto p = heads(g, B, g.hs(), g.T, g.T);
  p.transpose_b = part == 1, p.alpha = g.scale();
  p.a = qkv_heads(g, qkv, 1 - part), p.b = score_blocks(g, dpreatt), p.c = qkv_heads(g, dqkv, part);
  return p;
}
}  // namespace detail

/// Backward: dq(t) = scale * sum over t2 of dpreatt[b, h, t, t2] * k(t2).
inline strided_gemm queries_backward(const attention_geometry& g, const float* dpreatt, const float* qkv, float* dqkv,
                                     index B) {
  return detail::scores_backward(g, dpreatt, qkv, dqkv, B, 0);
}

/// Backward: dk(t2) = scale * sum over t of dpreatt[b, h, t, t2] * q(t).
inline strided_gemm keys_backward(const attention_geometry& g, const float* dpreatt, const float* qkv, float* dqkv,
                                  index B) {
  return detail::scores_backward(g, dpreatt, qkv, dqkv, B, 1);
}

/// Backward: dv(t2) = sum over t of att[b, h, t, t2] * dout(t). Column-major: dV = dout . att.
inline strided_gemm values_backward(const attention_geometry& g, const float* att, const float* dout, float* dqkv,
                                    index B) {
  auto p = detail::heads(g, B, g.hs(), g.T, g.T);
  p.transpose_b = true;
  p.a = detail::channel_heads(g, dout), p.b = detail::score_blocks(g, att), p.c = detail::qkv_heads(g, dqkv, 2);
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
          sum += (p.transpose_a ? a[k + row * p.a.ld] : a[row + k * p.a.ld]) *
                 (p.transpose_b ? b[col + k * p.b.ld] : b[k + col * p.b.ld]);
        float& out = c[row + col * p.c.ld];
        out = p.alpha * sum + (p.beta == 0.0f ? 0.0f : p.beta * out);
      }
  }
}

}  // namespace gpt2::attention_products
