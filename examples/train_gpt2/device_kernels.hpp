#pragma once
// The element-wise and reduction maths of GPT-2's passes as Thrust functors: one function object per operation,
// launched over an index range by for_each_index. The same source runs on the GPU (compiled by nvcc: Thrust's CUDA
// device system) and on the CPU (g++ with THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP), where CI checks it
// against gpt2_model.hpp's loops. Each functor writes outputs that no other index writes, so no atomics are needed
// and every sum runs in the CPU loops' order: the two differ only by the device's rounding of exp, tanh and fused
// multiply-adds. The matrix products are not here: cuBLAS on the GPU, the CPU loops on the host
// (device_model_impl.hpp).
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cmath>
#include <cstddef>

#if defined(__CUDACC__)
#define GPT2_HOST_DEVICE __host__ __device__
#else
#define GPT2_HOST_DEVICE
#endif

namespace gpt2::device_kernels {

using index = std::size_t;

/// f(i) for every i in [0, n) on the device system; returns when all have run.
template <class Functor>
void for_each_index(index n, const Functor& f) {
  if (n == 0) return;
  thrust::for_each_n(thrust::device, thrust::counting_iterator<index>(0), n, f);
}

inline constexpr float layernorm_eps = 1e-5f;

// out[bt, c] = wte[tokens[bt], c] + wpe[bt % T, c]; i over B*T*C.
struct encoder_forward {
  float* out;
  const int* tokens;
  const float* wte;
  const float* wpe;
  index T, C;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index bt = i / C, c = i % C;
    out[i] = wte[static_cast<index>(tokens[bt]) * C + c] + wpe[(bt % T) * C + c];
  }
};

// One channel c per index: the (b, t) rows in order, as the CPU's serial loop adds them (rows of wte repeat, so
// those sums go to memory; wpe's rows repeat every T).
struct encoder_backward {
  float* dwte;
  float* dwpe;
  const float* dout;
  const int* tokens;
  index BT, T, C;
  GPT2_HOST_DEVICE void operator()(index c) const {
    for (index bt = 0; bt < BT; ++bt) dwte[static_cast<index>(tokens[bt]) * C + c] += dout[bt * C + c];
    for (index t = 0; t < T; ++t) {
      float sum = dwpe[t * C + c];
      for (index bt = t; bt < BT; bt += T) sum += dout[bt * C + c];
      dwpe[t * C + c] = sum;
    }
  }
};

// One row (b, t) per index.
struct layernorm_forward {
  float* out;
  float* mean;
  float* rstd;
  const float* inp;
  const float* weight;
  const float* bias;
  index C;
  GPT2_HOST_DEVICE void operator()(index row) const {
    const float* x = inp + row * C;
    float m = 0;
    for (index i = 0; i < C; ++i) m += x[i];
    m = m / static_cast<float>(C);
    float v = 0;
    for (index i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    v = v / static_cast<float>(C);
    const float s = 1.0f / sqrtf(v + layernorm_eps);
    float* o = out + row * C;
    for (index i = 0; i < C; ++i) o[i] = s * (x[i] - m) * weight[i] + bias[i];
    mean[row] = m;
    rstd[row] = s;
  }
};

// The input's gradient, one row per index: dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd.
struct layernorm_backward_input {
  float* dinp;
  const float* dout;
  const float* inp;
  const float* weight;
  const float* mean;
  const float* rstd;
  index C;
  GPT2_HOST_DEVICE void operator()(index row) const {
    const float* d = dout + row * C;
    const float* x = inp + row * C;
    float* dx = dinp + row * C;
    const float m = mean[row], s = rstd[row];
    float dnorm_mean = 0, dnorm_norm_mean = 0;
    for (index i = 0; i < C; ++i) {
      const float norm = (x[i] - m) * s;
      const float dnorm = weight[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean = dnorm_mean / static_cast<float>(C);
    dnorm_norm_mean = dnorm_norm_mean / static_cast<float>(C);
    for (index i = 0; i < C; ++i) {
      const float norm = (x[i] - m) * s;
      dx[i] += (weight[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
};

// The weight's and bias's gradients, one channel per index, summed over the rows in order (in registers: a sum
// kept in memory would make every row a dependent global read-modify-write).
struct layernorm_backward_parameters {
  float* dweight;
  float* dbias;
  const float* dout;
  const float* inp;
  const float* mean;
  const float* rstd;
  index rows, C;
  GPT2_HOST_DEVICE void operator()(index i) const {
    float db = dbias[i], dw = dweight[i];
    for (index row = 0; row < rows; ++row) {
      const float d = dout[row * C + i];
      db += d;
      dw += (inp[row * C + i] - mean[row]) * rstd[row] * d;
    }
    dbias[i] = db;
    dweight[i] = dw;
  }
};

// out[row, o] += bias[o]; i over rows*OC.
struct add_bias {
  float* out;
  const float* bias;
  index OC;
  GPT2_HOST_DEVICE void operator()(index i) const { out[i] += bias[i % OC]; }
};

// dbias[o] += sum over rows of dout[row, o]; one output channel per index.
struct bias_backward {
  float* dbias;
  const float* dout;
  index rows, OC;
  GPT2_HOST_DEVICE void operator()(index o) const {
    float sum = dbias[o];
    for (index row = 0; row < rows; ++row) sum += dout[row * OC + o];
    dbias[o] = sum;
  }
};

// Causal self-attention forward, one (b, t, h) per index (the CPU's loop order: h fastest). qkv is (B, T, 3C);
// preatt and att are (B, NH, T, T), only t2 <= t written.
struct attention_forward {
  float* out;
  float* preatt;
  float* att;
  const float* qkv;
  index T, C, NH;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index h = i % NH, t = (i / NH) % T, b = i / (NH * T);
    const index C3 = 3 * C, hs = C / NH;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const float* query = qkv + (b * T + t) * C3 + h * hs;
    float* preatt_row = preatt + ((b * NH + h) * T + t) * T;
    float* att_row = att + ((b * NH + h) * T + t) * T;
    float maxval = -INFINITY;
    for (index t2 = 0; t2 <= t; ++t2) {
      const float* key = qkv + (b * T + t2) * C3 + h * hs + C;
      float score = 0;
      for (index k = 0; k < hs; ++k) score += query[k] * key[k];
      score *= scale;
      maxval = fmaxf(maxval, score);
      preatt_row[t2] = score;
    }
    float expsum = 0;
    for (index t2 = 0; t2 <= t; ++t2) {
      const float e = expf(preatt_row[t2] - maxval);
      expsum += e;
      att_row[t2] = e;
    }
    for (index t2 = 0; t2 <= t; ++t2) att_row[t2] /= expsum;
    // each output channel summed over t2 in a register, in the CPU loop's order
    float* o = out + (b * T + t) * C + h * hs;
    const float* values = qkv + b * T * C3 + h * hs + 2 * C;
    for (index k = 0; k < hs; ++k) {
      float sum = 0;
      for (index t2 = 0; t2 <= t; ++t2) sum += att_row[t2] * values[t2 * C3 + k];
      o[k] = sum;
    }
  }
};

// Attention backward, part 1: one query row (b, h, t) per index. datt and dpreatt of the row, then the query's
// gradient; each is written by its row alone.
struct attention_backward_queries {
  float* dqkv;
  float* dpreatt;
  float* datt;
  const float* dout;
  const float* qkv;
  const float* att;
  index T, C, NH;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index t = i % T, h = (i / T) % NH, b = i / (T * NH);
    const index C3 = 3 * C, hs = C / NH;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const index row = (b * NH + h) * T + t;
    const float* att_row = att + row * T;
    float* datt_row = datt + row * T;
    float* dpreatt_row = dpreatt + row * T;
    const float* d = dout + (b * T + t) * C + h * hs;
    float* dquery = dqkv + (b * T + t) * C3 + h * hs;
    for (index t2 = 0; t2 <= t; ++t2) {
      const float* value = qkv + (b * T + t2) * C3 + h * hs + 2 * C;
      float sum = datt_row[t2];
      for (index k = 0; k < hs; ++k) sum += value[k] * d[k];
      datt_row[t2] = sum;
    }
    float weighted = 0;
    for (index t2 = 0; t2 <= t; ++t2) weighted += att_row[t2] * datt_row[t2];
    for (index t2 = 0; t2 <= t; ++t2) dpreatt_row[t2] += att_row[t2] * (datt_row[t2] - weighted);
    const float* keys = qkv + b * T * C3 + h * hs + C;
    for (index k = 0; k < hs; ++k) {
      float sum = dquery[k];
      for (index t2 = 0; t2 <= t; ++t2) sum += keys[t2 * C3 + k] * (dpreatt_row[t2] * scale);
      dquery[k] = sum;
    }
  }
};

// Attention backward, part 2 (after part 1): one key/value position (b, h, t2) per index, summing over the queries
// t >= t2 that attended to it, in ascending t as the CPU loop adds them.
struct attention_backward_keys_values {
  float* dqkv;
  const float* dpreatt;
  const float* dout;
  const float* qkv;
  const float* att;
  index T, C, NH;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index t2 = i % T, h = (i / T) % NH, b = i / (T * NH);
    const index C3 = 3 * C, hs = C / NH;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    float* dkey = dqkv + (b * T + t2) * C3 + h * hs + C;
    float* dvalue = dqkv + (b * T + t2) * C3 + h * hs + 2 * C;
    const float* att_column = att + (b * NH + h) * T * T + t2;  // att[b, h, t, t2] at t * T
    const float* dpreatt_column = dpreatt + (b * NH + h) * T * T + t2;
    const float* douts = dout + b * T * C + h * hs;
    const float* queries = qkv + b * T * C3 + h * hs;
    for (index k = 0; k < hs; ++k) {
      float dv = dvalue[k], dk = dkey[k];
      for (index t = t2; t < T; ++t) {
        dv += att_column[t * T] * douts[t * C + k];
        dk += queries[t * C3 + k] * (dpreatt_column[t * T] * scale);
      }
      dvalue[k] = dv;
      dkey[k] = dk;
    }
  }
};

// GELU, tanh approximation; i over the elements.
struct gelu_forward {
  float* out;
  const float* inp;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    const float gelu_scaling = sqrtf(2.0f / 3.14159265358979323846f);  // as the CPU loop rounds it
    out[i] = 0.5f * x * (1.0f + tanhf(gelu_scaling * (x + cube)));
  }
};

struct gelu_backward {
  float* dinp;
  const float* inp;
  const float* dout;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    const float gelu_scaling = sqrtf(2.0f / 3.14159265358979323846f);
    const float tanh_out = tanhf(gelu_scaling * (x + cube));
    const float sech2 = 1.0f - tanh_out * tanh_out;
    const float local_grad =
        0.5f * (1.0f + tanh_out) + x * 0.5f * sech2 * gelu_scaling * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local_grad * dout[i];
  }
};

struct residual_forward {
  float* out;
  const float* inp1;
  const float* inp2;
  GPT2_HOST_DEVICE void operator()(index i) const { out[i] = inp1[i] + inp2[i]; }
};

struct residual_backward {
  float* dinp1;
  float* dinp2;
  const float* dout;
  GPT2_HOST_DEVICE void operator()(index i) const {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
};

// One row (b, t) per index: probs over the V tokens, the padded columns past V set to 0; then the row's
// cross-entropy against its target.
struct softmax_crossentropy_forward {
  float* probs;
  float* losses;
  const float* logits;
  const int* targets;
  index V, Vp;
  GPT2_HOST_DEVICE void operator()(index row) const {
    const float* l = logits + row * Vp;
    float* p = probs + row * Vp;
    for (index i = V; i < Vp; ++i) p[i] = 0;
    float maxval = -INFINITY;
    for (index i = 0; i < V; ++i) maxval = fmaxf(maxval, l[i]);
    float sum = 0;
    for (index i = 0; i < V; ++i) {
      p[i] = expf(l[i] - maxval);
      sum += p[i];
    }
    for (index i = 0; i < V; ++i) p[i] /= sum;
    losses[row] = -logf(p[static_cast<index>(targets[row])]);
  }
};

// dlogits += (probs - onehot(target)) * dloss; i over rows*Vp, the padded columns untouched.
struct crossentropy_softmax_backward {
  float* dlogits;
  const float* probs;
  const int* targets;
  float dloss;
  index V, Vp;
  GPT2_HOST_DEVICE void operator()(index i) const {
    const index row = i / Vp, column = i % Vp;
    if (column >= V) return;
    const float indicator = column == static_cast<index>(targets[row]) ? 1.0f : 0.0f;
    dlogits[i] += (probs[i] - indicator) * dloss;
  }
};

}  // namespace gpt2::device_kernels
