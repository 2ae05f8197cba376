// The GPU's row kernels (one warp per row: device_kernels' *_lanes through for_each_row) against the staged functors
// they replaced there (one thread per row, or per segment of a row), side by side on the same arrays at GPT-2's
// throughput shape: batch 32, context 256, 768 channels, 12 heads, 50257 tokens padded to 50304. Each form runs 3
// times unmeasured, then 20 times between CUDA events on the default stream; the median is printed with the bytes
// each operation must move at least (every array read and written once) over that time. The head: its loss and
// dlogits, fused (crossentropy_lanes) against the staged functors.
// Usage: gpt2_row_kernels_bench [--batch B] [--context T]   (bench/device/run.sh runs it; exit 77 without a GPU)
#include "device_bench.cuh"
#include "device_kernels.hpp"

#include <thrust/device_vector.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using namespace gpt2::device_kernels;
using index = gpt2::device_kernels::index;
using device_bench::fill;
using device_bench::median_ms;

// targets[r] = r mod V
struct row_targets {
  int* targets;
  index V;
  __host__ __device__ void operator()(index r) const { targets[r] = static_cast<int>(r % V); }
};

float* raw(thrust::device_vector<float>& v) { return thrust::raw_pointer_cast(v.data()); }

void report(const char* what, double staged_ms, double warp_ms, double bytes) {
  std::printf("row kernels: %-34s staged %8.3f ms, warp %8.3f ms: %5.2fx; at least %7.1f MB, warp %6.0f GB/s\n", what,
              staged_ms, warp_ms, staged_ms / warp_ms, bytes / 1e6, bytes / (warp_ms * 1e-3) / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  if (device_bench::no_usable_gpu("gpt2_row_kernels_bench")) return 77;
  std::size_t B = 32, T = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--batch") B = std::strtoul(argv[i + 1], nullptr, 10);
    else if (flag == "--context") T = std::strtoul(argv[i + 1], nullptr, 10);
  }
  const std::size_t C = 768, NH = 12, V = 50257, Vp = 50304, BT = B * T, rows = B * NH * T;
  std::printf("row kernels: batch %zu, context %zu, %zu channels, %zu heads, %zu tokens (%zu padded)\n", B, T, C, NH,
              V, Vp);
  try {
    // Attention's weights and their gradients, (B, NH, T, T).
    thrust::device_vector<float> att(rows * T), datt(rows * T);
    fill(att, 0.37f, 4.0f);
    fill(datt, 0.11f, 1.0f);
    report("attention softmax", median_ms([&] { for_each_index(rows, attention_softmax{raw(att), T}); }),
           median_ms([&] { for_each_row(rows, attention_softmax_lanes{raw(att), T}); }), 2.0 * rows * T * 4);
    report("attention softmax backward",
           median_ms([&] { for_each_index(rows, attention_backward_softmax{raw(datt), raw(att), T}); }),
           median_ms([&] { for_each_row(rows, attention_backward_softmax_lanes{raw(datt), raw(att), T}); }),
           3.0 * rows * T * 4);

    // Layer norm over (B*T, C).
    thrust::device_vector<float> x(BT * C), out(BT * C), dout(BT * C), dinp(BT * C), weight(C), bias(C), mean(BT),
        rstd(BT), means(2 * BT);
    fill(x, 0.29f, 2.0f);
    fill(dout, 0.13f, 1.0f);
    fill(weight, 0.7f, 0.5f);
    fill(bias, 0.3f, 0.1f);
    const row_segments norm{C, gpt2::kernels::layernorm_segment};
    thrust::device_vector<float> parts(2 * BT * norm.per_row());
    const auto staged_layernorm = [&] {
      for_each_index(BT * norm.per_row(), layernorm_partial_sums{raw(parts), raw(x), nullptr, norm});
      for_each_index(BT, layernorm_mean{raw(mean), raw(parts), norm});
      for_each_index(BT * norm.per_row(), layernorm_partial_sums{raw(parts), raw(x), raw(mean), norm});
      for_each_index(BT, layernorm_rstd{raw(rstd), raw(parts), norm});
      for_each_index(BT * C, layernorm_normalize{raw(out), raw(x), raw(mean), raw(rstd), raw(weight), raw(bias), C});
    };
    report("layer norm forward", median_ms(staged_layernorm), median_ms([&] {
             for_each_row(BT, layernorm_forward_lanes{raw(out), raw(mean), raw(rstd), raw(x), raw(weight), raw(bias),
                                                      C});
           }),
           2.0 * BT * C * 4);
    const auto staged_backward = [&] {
      for_each_index(BT * norm.per_row(), layernorm_backward_partials{raw(parts), raw(dout), raw(x), raw(weight),
                                                                      raw(mean), raw(rstd), norm, BT});
      for_each_index(BT, layernorm_backward_means{raw(means), raw(parts), norm, BT});
      for_each_index(BT * C, layernorm_backward_input{raw(dinp), raw(dinp), raw(dout), raw(x), raw(weight),
                                                      raw(mean), raw(rstd), raw(means), BT, C});
    };
    report("layer norm backward (input)", median_ms(staged_backward), median_ms([&] {
             for_each_row(BT, layernorm_backward_input_lanes{raw(dinp), raw(dinp), raw(dout), raw(x),
                                                             raw(weight), raw(mean), raw(rstd), C});
           }),
           4.0 * BT * C * 4);
    x = thrust::device_vector<float>();  // the logits need the room more
    out = dout = dinp = x;

    // The head over (B*T, Vp) logits: the loss of each row and dlogits in place (the staged functors: the softmax's
    // four stages, the cross-entropy, then the backward's pass).
    thrust::device_vector<float> logits(BT * Vp), row_max(BT), row_sum(BT), losses(BT);
    fill(logits, 0.011f, 9.0f);
    thrust::device_vector<int> targets(BT);
    for_each_index(BT, row_targets{thrust::raw_pointer_cast(targets.data()), V});
    const int* target = thrust::raw_pointer_cast(targets.data());
    const float dloss = 1.0f / static_cast<float>(BT);
    const row_segments vocab{V, gpt2::kernels::softmax_segment};
    thrust::device_vector<float> maxima(BT * vocab.per_row()), sums(BT * vocab.per_row());
    const auto staged_head = [&] {
      for_each_index(maxima.size(), softmax_segment_max{raw(maxima), raw(logits), vocab, Vp});
      for_each_index(BT, softmax_row_max{raw(row_max), raw(maxima), vocab});
      for_each_index(maxima.size(), softmax_segment_exp{raw(logits), raw(sums), raw(row_max), vocab, Vp});
      for_each_index(BT, softmax_row_sum{raw(row_sum), raw(sums), vocab});
      for_each_index(BT, crossentropy_forward{raw(losses), raw(logits), raw(row_sum), target, Vp});
      for_each_index(BT * Vp, crossentropy_softmax_backward{raw(logits), raw(row_sum), target, dloss, V, Vp});
    };
    report("head loss and dlogits", median_ms(staged_head), median_ms([&] {
             for_each_row(BT, crossentropy_lanes{raw(logits), raw(losses), target, dloss, V, Vp});
           }),
           2.0 * BT * Vp * 4);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt2_row_kernels_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
