#pragma once
// The definitions of device_model.hpp, for exactly one translation unit of a program: device_model.cu (nvcc, the
// GPU) or a host test compiled with THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP. Each pass is gpt2_model.hpp's,
// line for line, with its loops as device_kernels.hpp's functors and its matrix products through `matmul_context`:
// cuBLAS in fp32 (no TF32, so the GPU agrees with the CPU to fp32 rounding) on the GPU, the CPU loops on the host.
// Attention's products are cuBLAS's strided batched ones on the GPU (attention_products.hpp), its stages on the host.
#include "attention_products.hpp"
#include "device_kernels.hpp"
#include "device_model.hpp"

#include <chunkwise/core/error.hpp>

#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/fill.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#if defined(__CUDACC__)
#include <chunkwise/core/cuda/checked_call.cuh>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace gpt2 {
namespace device_detail {

using device_kernels::for_each_index;
using device_kernels::index;

#if defined(__CUDACC__)
/// Constructed first: a machine without a usable GPU gets this message, not an allocation's failure.
struct device_present {
  device_present() {
    int devices = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0)
      chunkwise::throw_error(chunkwise::error_code::unsupported,
                             std::string("train_gpt2 --backend cuda: no usable GPU (") +
                                 (status != cudaSuccess ? cudaGetErrorName(status) : "cudaErrorNoDevice") +
                                 "); use --backend host, or run where a GPU is visible");
  }
};

/// The GPU's matrix products: llm.c's cuBLAS calls on the default stream (the one Thrust's algorithms use).
class matmul_context {
 public:
  /// `bf16_products`: on the tensor cores, operands rounded to bf16 and products summed in fp32 (cuBLAS's
  /// CUBLAS_COMPUTE_32F_FAST_16BF: what --dtype bf16 asks of the CPU's oneDNN too); else fp32 throughout (no TF32).
  explicit matmul_context(bool bf16_products) : bf16_products_(bf16_products) {
    int device = 0;
    CHUNKWISE_CUDA_TRY(cudaGetDevice(&device), "GPT-2 device passes");
    cudaDeviceProp properties{};
    CHUNKWISE_CUDA_TRY(cudaGetDeviceProperties(&properties, device), "GPT-2 device passes");
    name_ = std::string("CUDA (") + properties.name + (bf16_products ? ", bf16 tensor-core products)" : ")");
    CHUNKWISE_CUBLAS_TRY(cublasCreate(&handle_), "GPT-2 device passes");
    CHUNKWISE_CUBLAS_TRY(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "GPT-2 device passes");
  }
  /// cuBLAS's workspace, given rather than allocated by cuBLAS on the handle's first products (outside any budget):
  /// the size cuBLAS's documentation recommends for Hopper, ample for the GPUs before it (4 MiB).
  static constexpr std::size_t workspace_bytes = std::size_t{32} << 20;
  void use_workspace(void* memory) {
    CHUNKWISE_CUBLAS_TRY(cublasSetWorkspace(handle_, memory, workspace_bytes), "GPT-2 device passes: cuBLAS workspace");
  }
  ~matmul_context() { (void)cublasDestroy(handle_); }
  matmul_context(const matmul_context&) = delete;
  matmul_context& operator=(const matmul_context&) = delete;

  [[nodiscard]] const char* name() const noexcept { return name_.c_str(); }

  // out (rows, OC) = inp (rows, C) . weight (OC, C)^T + bias. Column-major: out^T = weight^T-as-stored . inp^T.
  void forward(float* out, const float* inp, const float* weight, const float* bias, index rows, index C, index OC) {
    const float one = 1.0f, zero = 0.0f;
    device_kernels::kernel_times::instance().time("cuBLAS gemm forward", [&] {
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, rows, C, &one, weight, C, inp, C, &zero, out, OC, "GPT-2 matmul forward");
    });
    if (bias != nullptr) for_each_index(rows * OC, device_kernels::add_bias{out, bias, OC});
  }
  // dinp (rows, C) = dout . weight (written whole: no zeroing first); dweight (OC, C) += dout^T . inp; dbias (OC) +=
  // the column sums of dout (the parameters' gradients add up over the passes).
  void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                index rows, index C, index OC) {
    const float one = 1.0f, zero = 0.0f;
    device_kernels::kernel_times::instance().time("cuBLAS gemm backward", [&] {
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, rows, OC, &one, weight, C, dout, OC, &zero, dinp, C,
           "GPT-2 matmul backward (input)");
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, rows, &one, inp, C, dout, OC, &one, dweight, C,
           "GPT-2 matmul backward (weight)");
    });
    if (dbias == nullptr) return;
    const device_kernels::column_segments segments{rows, OC};
    for_each_index(segments.count() * OC, device_kernels::bias_backward_partials{column_parts_, dout, segments});
    for_each_index(OC, device_kernels::bias_backward{dbias, column_parts_, segments});
  }
  /// Where backward's bias sums keep their partial sums (scratch_layout's partial sums).
  void use_column_parts(float* parts) noexcept { column_parts_ = parts; }
  /// Where attention's products write their matrices' addresses (scratch_layout's batch pointers), and how many.
  void use_batch_pointers(void** pointers, std::size_t count) noexcept {
    batch_pointers_ = pointers;
    batch_pointer_count_ = count;
  }
  /// One of attention's batched products (attention_products.hpp), all B * NH matrices in one cuBLAS call: their
  /// addresses are written into the scratch block's arrays in stream order first. One call per sequence (NH
  /// matrices of T x T x hs) left most SMs of a large GPU idle and cost B launches. Under bf16_products on the
  /// tensor cores as the other products (PyTorch's bf16 autocast rounds attention's operands likewise), else fp32.
  void run(const attention_products::strided_gemm& p, const char* what) {
    const index count = p.count();
    if (3 * count > batch_pointer_count_)
      chunkwise::throw_error(chunkwise::error_code::invalid_argument,
                             std::string(what) + ": " + std::to_string(count) + " matrices, but the scratch block " +
                                 "holds " + std::to_string(batch_pointer_count_ / 3) + " (B * NH of its shape)");
    auto** a = static_cast<const float**>(static_cast<void*>(batch_pointers_));
    auto** b = a + count;
    auto** c = static_cast<float**>(static_cast<void*>(batch_pointers_ + 2 * count));
    for_each_index(count, attention_products::batch_pointers{p, a, b, c});
    const auto op = [](bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; };
    device_kernels::kernel_times::instance().time("cuBLAS attention products", [&] {
      CHUNKWISE_CUBLAS_TRY(cublasGemmBatchedEx(handle_, op(p.transpose_a), op(p.transpose_b), to_int(p.m), to_int(p.n),
                                               to_int(p.k), &p.alpha, reinterpret_cast<const void* const*>(a),
                                               CUDA_R_32F, to_int(p.a.ld), reinterpret_cast<const void* const*>(b),
                                               CUDA_R_32F, to_int(p.b.ld), &p.beta, reinterpret_cast<void* const*>(c),
                                               CUDA_R_32F, to_int(p.c.ld), to_int(count), compute_type(),
                                               CUBLAS_GEMM_DEFAULT),
                           what);
    });
  }
  /// Waits for the passes' work (the default stream: kernels, products, the staging's copies), not for the runtime's
  /// own streams, whose prefetches go on beside the next pass.
  void synchronize() { CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(nullptr), "GPT-2 device passes"); }

 private:
  static int to_int(index n) { return static_cast<int>(n); }
  cublasComputeType_t compute_type() const {
    return bf16_products_ ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  }
  // C (m, n) = alpha op(A) op(B) + beta C, column-major fp32 arrays.
  void gemm(cublasOperation_t op_a, cublasOperation_t op_b, index m, index n, index k, const float* alpha,
            const float* a, index lda, const float* b, index ldb, const float* beta, float* c, index ldc,
            const char* what) {
    if (!bf16_products_) {
      CHUNKWISE_CUBLAS_TRY(cublasSgemm(handle_, op_a, op_b, to_int(m), to_int(n), to_int(k), alpha, a, to_int(lda), b,
                                       to_int(ldb), beta, c, to_int(ldc)), what);
      return;
    }
    CHUNKWISE_CUBLAS_TRY(cublasGemmEx(handle_, op_a, op_b, to_int(m), to_int(n), to_int(k), alpha, a, CUDA_R_32F,
                                      to_int(lda), b, CUDA_R_32F, to_int(ldb), beta, c, CUDA_R_32F, to_int(ldc),
                                      compute_type(), CUBLAS_GEMM_DEFAULT),
                         what);
  }
  cublasHandle_t handle_ = nullptr;
  std::string name_;
  bool bf16_products_;
  float* column_parts_ = nullptr;
  void** batch_pointers_ = nullptr;
  std::size_t batch_pointer_count_ = 0;
};
#else
struct device_present {};  // the host system is always there

/// The host's matrix products: gpt2_model.hpp's loops (B = 1, T = rows), so the test compares the other maths.
class matmul_context {
 public:
  explicit matmul_context(bool /*bf16_products: the loops stay fp32*/) {}
  [[nodiscard]] const char* name() const noexcept { return "OpenMP (host)"; }
  static constexpr std::size_t workspace_bytes = 0;  // the loops need none
  void use_workspace(void* /*memory*/) {}
  void use_column_parts(float* /*parts: the loops sum in place*/) noexcept {}
  void use_batch_pointers(void** /*pointers: attention's stages need none*/, std::size_t /*count*/) noexcept {}
  void forward(float* out, const float* inp, const float* weight, const float* bias, index rows, index C, index OC) {
    kernels::matmul_forward(out, inp, weight, bias, 1, rows, C, OC);
  }
  // dinp written (the loops add to it: cuBLAS's beta = 0 is zeroing first), the parameters' gradients added to.
  void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                index rows, index C, index OC) {
    std::fill_n(dinp, rows * C, 0.0f);
    kernels::matmul_backward(dinp, dweight, dbias, dout, inp, weight, 1, rows, C, OC);
  }
  void synchronize() {}
};
#endif

// Whether the GPU's products leave their bias to the pass after them (cuBLAS adds none; added there, it costs no
// pass of its own); the CPU loops' products add it themselves. And whether the row reductions run in stages that keep
// their partial sums and statistics in the scratch block (the host build's, in the CPU loops' order), or in warp
// kernels that keep them in registers (the GPU's).
#if defined(__CUDACC__)
inline constexpr bool bias_after_product = true;
inline constexpr bool staged_row_reductions = false;
#else
inline constexpr bool bias_after_product = false;
inline constexpr bool staged_row_reductions = true;
#endif
// The bias a product adds itself, and the one the pass after it adds (the other is null).
inline const float* in_product(const float* bias) { return bias_after_product ? nullptr : bias; }
inline const float* after_product(const float* bias) { return bias_after_product ? bias : nullptr; }

using buffer = thrust::device_vector<float>;

/// Pageable host memory <-> device, through two page-locked halves: the CPU fills (or drains) one half while the GPU
/// copies the other, so a tensor's trip costs about the slower of the two legs rather than their sum (pageable memory
/// itself would be copied through the driver's own staging first). Parameters go up on a copy stream of their own,
/// beside the kernels of the pass before (the mirror's tensors change between steps only); the default stream, where
/// the kernels run, waits for them. Gradients come down on the default stream, after the kernels that computed them.
/// Each half's event says when the GPU is done with it.
class staging_pipe {
 public:
  static constexpr std::size_t piece = std::size_t{4} << 20;  // elements per half (16 MiB)

#if defined(__CUDACC__)
  staging_pipe() {
    void* memory = nullptr;
    CHUNKWISE_CUDA_TRY(cudaHostAlloc(&memory, 2 * piece * sizeof(float), cudaHostAllocDefault),
                       "GPT-2 device passes: " + std::to_string(2 * piece * sizeof(float)) + " bytes of pinned memory");
    halves_[0] = static_cast<float*>(memory);
    halves_[1] = halves_[0] + piece;
    for (auto* event : {&done_[0], &done_[1], &uploaded_})
      CHUNKWISE_CUDA_TRY(cudaEventCreateWithFlags(event, cudaEventDisableTiming), "GPT-2 device passes");
    CHUNKWISE_CUDA_TRY(cudaStreamCreateWithFlags(&uploads_, cudaStreamNonBlocking), "GPT-2 device passes");
  }
  ~staging_pipe() {
    (void)cudaDeviceSynchronize();
    for (auto* event : {done_[0], done_[1], uploaded_}) (void)cudaEventDestroy(event);
    (void)cudaStreamDestroy(uploads_);
    (void)cudaFreeHost(halves_[0]);
  }
  staging_pipe(const staging_pipe&) = delete;
  staging_pipe& operator=(const staging_pipe&) = delete;

  /// device[0, n) = host[0, n), before the kernels queued after this call run; returns before the copy ends. The copy
  /// runs beside the kernels queued before, so none of them may read device[0, n): the mirror's tensors change at a
  /// step only, after the host waited for the passes (the loss read back, the gradients come down).
  void upload(float* device, const float* host, std::size_t n) {
    for (std::size_t done = 0; done < n; done += piece) {
      const std::size_t m = std::min(piece, n - done), h = next_half();
      CHUNKWISE_CUDA_TRY(cudaEventSynchronize(done_[h]), "GPT-2 device passes: staging");  // its last copy is out
      float* pinned = halves_[h];
      const float* from = host + done;
      device_kernels::kernel_times::instance().time("parameters host -> pinned", [&] {
#pragma omp parallel for
        for (std::size_t i = 0; i < m; ++i) pinned[i] = from[i];
      });
      device_kernels::kernel_times::instance().time("parameters pinned -> device", [&] {
        CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(device + done, pinned, m * sizeof(float), cudaMemcpyHostToDevice,
                                           uploads_),
                           "GPT-2 device passes: parameters to the device");
        CHUNKWISE_CUDA_TRY(cudaEventRecord(done_[h], uploads_), "GPT-2 device passes: staging");
      });
    }
    CHUNKWISE_CUDA_TRY(cudaEventRecord(uploaded_, uploads_), "GPT-2 device passes: staging");
    CHUNKWISE_CUDA_TRY(cudaStreamWaitEvent(0, uploaded_, 0), "GPT-2 device passes: staging");
  }
  /// host[i] += device[i] for i in [0, n), once the kernels queued before this call have run: the next piece's copy
  /// runs while the CPU adds this one.
  void download_add(float* host, const float* device, std::size_t n) {
    const auto copy_out = [&](std::size_t first) {
      const std::size_t h = first / piece % 2;
      device_kernels::kernel_times::instance().time("gradients device -> pinned", [&] {
        CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(halves_[h], device + first, std::min(piece, n - first) * sizeof(float),
                                           cudaMemcpyDeviceToHost, 0),
                           "GPT-2 device passes: gradients to the host");
        CHUNKWISE_CUDA_TRY(cudaEventRecord(done_[h], 0), "GPT-2 device passes: staging");
      });
    };
    if (n != 0) copy_out(0);
    for (std::size_t done = 0; done < n; done += piece) {
      const std::size_t m = std::min(piece, n - done), h = done / piece % 2;
      if (done + piece < n) copy_out(done + piece);
      CHUNKWISE_CUDA_TRY(cudaEventSynchronize(done_[h]), "GPT-2 device passes: staging");
      const float* pinned = halves_[h];
      float* to = host + done;
      device_kernels::kernel_times::instance().time("gradients pinned + host -> host", [&] {
#pragma omp parallel for
        for (std::size_t i = 0; i < m; ++i) to[i] += pinned[i];
      });
    }
    next_ = 0;  // both halves are free: the CPU has read them
  }

 private:
  std::size_t next_half() { return next_++ % 2; }
  float* halves_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
  cudaEvent_t uploaded_ = nullptr;
  cudaStream_t uploads_ = nullptr;
  std::size_t next_ = 0;
#else
  /// The host system: the device is host memory, so plain copies (the test checks the maths, not the overlap).
  void upload(float* device, const float* host, std::size_t n) {
    thrust::copy_n(host, n, thrust::device_pointer_cast(device));
  }
  void download_add(float* host, const float* device, std::size_t n) {
    std::vector<float> copied(n);
    thrust::copy_n(thrust::device_pointer_cast(device), n, copied.begin());
    for (std::size_t i = 0; i < n; ++i) host[i] += copied[i];
  }
#endif
};

inline float* raw(buffer& b) { return thrust::raw_pointer_cast(b.data()); }
inline const float* raw(const buffer& b) { return thrust::raw_pointer_cast(b.data()); }
inline void zero(float* p, index n) {
  device_kernels::kernel_times::instance().time("zero", [&] {
    thrust::fill_n(device_kernels::device_policy(), thrust::device_pointer_cast(p), n, 0.0f);
  });
}
inline void zero(buffer& b) { zero(thrust::raw_pointer_cast(b.data()), b.size()); }
// The activations' buffers: views of one block of device memory.
inline float* raw(std::span<float> b) { return b.data(); }
inline void zero(std::span<float> b) { zero(b.data(), b.size()); }
inline void zero_activations(float* p, std::size_t n) { zero(p, static_cast<index>(n)); }

inline void already_zero(float*, std::size_t) {}

/// Device memory of some floats: lent (the runtime's device tier, where the plan charged it) or this one's own,
/// allocated at the first get(), zeroed (device_vector value-initialises).
struct lent_or_owned {
  [[nodiscard]] float* get(std::size_t elements) {
    if (lent == nullptr && owned.empty()) owned = buffer(elements, 0.0f);
    return data();
  }
  /// The memory; nullptr before the first get() when none was lent.
  [[nodiscard]] float* data() { return lent != nullptr ? lent : owned.empty() ? nullptr : raw(owned); }
  float* lent = nullptr;
  buffer owned;
};

/// The activations' block, taken at once: a base of device_workspace::state, so that it exists before the
/// activations' views of it.
struct activation_block {
  activation_block(const model_config& config, float* lent)
      : block{lent, buffer{}}, memory(block.get(activations<float>::total_elements(config))) {}
  /// How the activations zero the block: a lent one on the device; an owned one came zeroed, and zeroing it again
  /// would write every byte twice.
  [[nodiscard]] auto fill_zero() const { return block.owned.empty() ? zero_activations : already_zero; }
  lent_or_owned block;
  float* memory;
};

/// How the row reductions cut a row of layer norm's C columns, and of the softmax's V columns, into segments.
inline device_kernels::row_segments layernorm_segments(std::size_t channels) {
  return {channels, kernels::layernorm_segment};
}
inline device_kernels::row_segments softmax_segments(std::size_t vocab) { return {vocab, kernels::softmax_segment}; }

/// Where the scratch block's pieces lie (byte offsets): the tokens with their buckets (4 B*T + 1 ints: see
/// scratch_block) and the targets (B*T ints), the reductions'
/// partial sums (the columns': one per segment of rows and column of the widest, the MLP's 4C bias, or two for layer
/// norm's C; on the host, the rows' too: two per row and segment of the widest row, layer norm's C or the softmax's
/// V columns), the rows' statistics (the host's: two per row) and attention's batch pointers (three per head of each
/// sequence: the GPU's batched products), then cuBLAS's workspace, 256-byte aligned as cuBLAS asks. The GPU's row
/// reductions are warp kernels that keep their sums in registers (12.9 MB of row sums less at batch 32, context 256).
struct scratch_layout {
  explicit scratch_layout(const model_config& config) {
    const std::size_t rows = config.batch * config.context;
    const std::size_t segments =
        std::max(layernorm_segments(config.channels).per_row(), softmax_segments(config.vocab).per_row());
    const std::size_t column_parts = device_kernels::column_segments{rows, 4 * config.channels}.count() * 4 *
                                     config.channels;
    targets = (4 * rows + 1) * sizeof(int);
    row_parts = targets + rows * sizeof(int);
    row_parts_elements = std::max(staged_row_reductions ? 2 * rows * segments : 0, column_parts);
    row_stats = row_parts + row_parts_elements * sizeof(float);
    row_stats_elements = staged_row_reductions ? 2 * rows : 0;
    batch_pointers = (row_stats + row_stats_elements * sizeof(float) + 15) / 16 * 16;
    batch_pointer_count = 3 * config.batch * config.heads;
    blas_workspace = (batch_pointers + batch_pointer_count * sizeof(void*) + 255) / 256 * 256;
    bytes = blas_workspace + matmul_context::workspace_bytes;
  }
  std::size_t tokens = 0, targets, row_parts, row_stats, batch_pointers, blas_workspace, bytes;
  std::size_t row_parts_elements, row_stats_elements, batch_pointer_count;
};

/// The scratch block, lent or owned, and its pieces.
struct scratch_block {
  scratch_block(const model_config& config, void* lent) : layout(config) {
    memory.lent = static_cast<float*>(lent);
    auto* base = reinterpret_cast<char*>(memory.get((layout.bytes + sizeof(float) - 1) / sizeof(float)));
    const std::size_t rows = config.batch * config.context;
    tokens = reinterpret_cast<int*>(base + layout.tokens);
    bucket_positions = tokens + rows;
    bucket_starts = bucket_positions + rows;
    bucket_tokens = bucket_starts + rows + 1;
    targets = reinterpret_cast<int*>(base + layout.targets);
    row_parts = reinterpret_cast<float*>(base + layout.row_parts);
    row_stats = reinterpret_cast<float*>(base + layout.row_stats);
    batch_pointers = reinterpret_cast<void**>(base + layout.batch_pointers);
    blas_workspace = base + layout.blas_workspace;
  }
  scratch_layout layout;
  lent_or_owned memory;
  int* tokens;
  // The batch's positions bucketed by token (uploaded with the tokens): bucket k holds token bucket_tokens[k] at the
  // positions bucket_positions[bucket_starts[k] .. bucket_starts[k + 1]), in ascending order.
  int* bucket_positions;
  int* bucket_starts;
  int* bucket_tokens;
  int* targets;
  float* row_parts;  // the reductions' partial sums (layer norm's, the softmax's, the column sums', one at a time)
  float* row_stats;  // two per row
  void** batch_pointers;  // attention's batched products' matrices (matmul_context::run)
  void* blas_workspace;
};

}  // namespace device_detail

// activations<float>'s buffers in one block of device memory (the same sizes and slots: recompute keeps one), and
// the rest.
struct device_workspace::state : device_detail::device_present, device_detail::activation_block,
                                 activations<float> {
  state(const model_config& config, bool bf16_products, lent_memory lent)
      : activation_block(config, lent.activations),
        activations(config, activation_block::memory, activation_block::fill_zero()), scratch(config, lent.scratch),
        matmul(bf16_products), staging(staging_elements(config)) {
    matmul.use_workspace(scratch.blas_workspace);
    matmul.use_column_parts(scratch.row_parts);
    matmul.use_batch_pointers(scratch.batch_pointers, scratch.layout.batch_pointer_count);
    if (lent.staging != nullptr) {
      staged_parameters.lent = lent.staging;
      staged_gradients.lent = lent.staging + staging;
    }
    for (const auto& tensor : parameter_tensors(config)) {
      mirror_offsets.push_back(mirror_elements);
      mirror_elements += tensor.elements;
    }
    mirror_versions.assign(mirror_offsets.size(), never);
  }

  // Whether `uploaded` records host's B*T tokens (or targets).
  bool holds(const std::vector<int>& uploaded, const int* host) const {
    return uploaded.size() == B * T && std::equal(uploaded.begin(), uploaded.end(), host);
  }
  // Whether host's B*T tokens (or targets) differ from the batch `uploaded` holds, checking and recording them if so:
  // backward reads the batch forward uploaded, and a copy from pageable memory would wait for every kernel queued
  // before it.
  bool new_batch(std::vector<int>& uploaded, const int* host, const char* what) const {
    if (holds(uploaded, host)) return false;
    kernels::check_tokens(host, B * T, V, what);
    uploaded.assign(host, host + B * T);
    return true;
  }
  // targets into their device array, unless it holds them already.
  const int* upload(int* to, std::vector<int>& uploaded, const int* host, const char* what) {
    if (new_batch(uploaded, host, what)) thrust::copy_n(host, B * T, thrust::device_pointer_cast(to));
    return to;
  }
  // The tokens, and their positions bucketed by token for the embedding's backward (a thread per bucket and channel
  // adds its positions in order: the CPU's serial order for each row of wte), in one copy.
  const int* upload_tokens(const int* host) {
    const std::size_t rows = B * T;
    if (!new_batch(uploaded_tokens, host, "tokens")) return scratch.tokens;
    std::vector<int> packed(4 * rows + 1), order(rows);
    std::copy_n(host, rows, packed.begin());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return host[a] < host[b]; });
    int* positions = packed.data() + rows;
    int* starts = positions + rows;
    int* bucket_tokens = starts + rows + 1;
    token_buckets = 0;
    for (std::size_t p = 0; p < rows; ++p) {
      positions[p] = order[p];
      if (p == 0 || host[order[p]] != host[order[p - 1]]) {
        starts[token_buckets] = static_cast<int>(p);
        bucket_tokens[token_buckets++] = host[order[p]];
      }
    }
    starts[token_buckets] = static_cast<int>(rows);
    thrust::copy_n(packed.data(), packed.size(), thrust::device_pointer_cast(scratch.tokens));
    return scratch.tokens;
  }

  /// Elements of one staging area: the largest pass's parameters (the head: ln_f and the tied wte; the embedding:
  /// wte and wpe; or a block).
  static std::size_t staging_elements(const model_config& config) {
    std::size_t layer = 0;
    for (const auto n : layer_tensor_sizes(config)) layer += n;
    const std::size_t wte = config.vocab_rows() * config.channels;
    return std::max({wte + 2 * config.channels, wte + config.context * config.channels, layer});
  }

  device_detail::scratch_block scratch;
  device_detail::matmul_context matmul;
  // Staging areas of the largest pass (`staging` elements each), lent or allocated at their first use: passes on
  // fp32 device chunks compute in place and need neither.
  std::size_t staging;
  device_detail::lent_or_owned staged_gradients;   // a pass's fp32 gradients, for host or bf16 chunks
  device_detail::lent_or_owned staged_parameters;  // bf16 chunks' parameters widened
  device_detail::buffer mirror;             // every parameter tensor, at mirror_offsets (allocated at the first use)
  std::size_t mirror_elements = 0;
  device_kernels::row_segments layernorm_segments() const { return device_detail::layernorm_segments(C); }
  device_kernels::row_segments softmax_segments() const { return device_detail::softmax_segments(V); }
  /// The host build's head softmax sums, one per row: head_forward leaves them for head_backward (the passes between
  /// use no row statistics; layer norm's backward takes row_stats only after the head's backward has read them). The
  /// GPU's head keeps none (crossentropy_lanes).
  float* head_row_sums() { return scratch.row_stats + B * T; }
  std::vector<std::size_t> mirror_offsets;
  static constexpr std::uint64_t never = ~std::uint64_t{0};
  std::vector<std::uint64_t> mirror_versions;  // the version each tensor's copy was taken at (never: not yet)
  device_detail::staging_pipe pipe;  // parameters in, gradients out
  std::vector<float> host_losses;
  std::vector<int> uploaded_tokens, uploaded_targets;  // what the device arrays hold
  std::size_t token_buckets = 0;                       // distinct tokens of the uploaded batch
};

device_workspace::device_workspace(const model_config& config, bool bf16_products, lent_memory lent)
    : state_(std::make_unique<state>(config, bf16_products, lent)) {}
std::size_t device_workspace::staging_bytes(const model_config& config) {
  return 2 * state::staging_elements(config) * sizeof(float);
}
std::size_t device_workspace::scratch_bytes(const model_config& config) {
  return device_detail::scratch_layout(config).bytes;
}
device_workspace::~device_workspace() = default;

const char* device_workspace::device_name() const noexcept { return state_->matmul.name(); }

namespace device_detail {
inline void check_staging(std::size_t offset, std::size_t elements, std::size_t staging) {
  if (offset + elements > staging)
    chunkwise::throw_error(chunkwise::error_code::invalid_argument,
                           "GPT-2 device passes: staging [" + std::to_string(offset) + ", " +
                               std::to_string(offset + elements) + ") is past the " + std::to_string(staging) +
                               " elements of the largest pass");
}
// The gradient staging slot at `offset`, which zeroed_gradient allocates and a pass then adds out.
inline float* staged_gradient(device_workspace::state& s, std::size_t offset, std::size_t elements) {
  check_staging(offset, elements, s.staging);
  float* staged = s.staged_gradients.data();
  if (staged == nullptr)
    chunkwise::throw_error(chunkwise::error_code::invalid_argument,
                           "GPT-2 device passes: gradients added out before zeroed_gradient staged them");
  return staged + offset;
}

// Layer norm on the device: gpt2_model.hpp's kernels::layernorm_forward and layernorm_backward, in stages.
inline void layernorm_forward(device_workspace::state& s, float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, index rows) {
  using namespace device_kernels;
#if defined(__CUDACC__)
  for_each_row(rows, layernorm_forward_lanes{out, mean, rstd, inp, weight, bias, s.C});
#else
  const row_segments segments = s.layernorm_segments();
  float* parts = s.scratch.row_parts;
  const index partials = rows * segments.per_row();
  for_each_index(partials, layernorm_partial_sums{parts, inp, nullptr, segments});
  for_each_index(rows, layernorm_mean{mean, parts, segments});
  for_each_index(partials, layernorm_partial_sums{parts, inp, mean, segments});
  for_each_index(rows, layernorm_rstd{rstd, parts, segments});
  for_each_index(rows * s.C, layernorm_normalize{out, inp, mean, rstd, weight, bias, s.C});
#endif
}

// dinp = base + the input's gradient (base: the residual stream's gradient so far, dinp itself in place; null, 0);
// the parameters' gradients added to.
inline void layernorm_backward(device_workspace::state& s, float* dinp, const float* base, float* dweight,
                               float* dbias, const float* dout, const float* inp, const float* weight,
                               const float* mean, const float* rstd, index rows) {
  using namespace device_kernels;
  float* parts = s.scratch.row_parts;
#if defined(__CUDACC__)
  for_each_row(rows, layernorm_backward_input_lanes{dinp, base, dout, inp, weight, mean, rstd, s.C});
#else
  const row_segments segments = s.layernorm_segments();
  float* means = s.scratch.row_stats;
  for_each_index(rows * segments.per_row(),
                 layernorm_backward_partials{parts, dout, inp, weight, mean, rstd, segments, rows});
  for_each_index(rows, layernorm_backward_means{means, parts, segments, rows});
  for_each_index(rows * s.C, layernorm_backward_input{dinp, base, dout, inp, weight, mean, rstd, means, rows, s.C});
#endif
  const column_segments columns{rows, s.C};
  for_each_index(columns.count() * s.C, layernorm_backward_parameter_partials{parts, dout, inp, mean, rstd, columns});
  for_each_index(s.C, layernorm_backward_parameters{dweight, dbias, parts, columns});
}

// Causal self-attention (device_kernels.hpp's stages). On the GPU its products are cuBLAS's, one batch of the B * NH
// heads each (attention_products.hpp), and its softmaxes one warp per row; on the host the per-element and per-row
// stages, in the CPU loops' order.
inline void attention_forward(device_workspace::state& s, const device_kernels::attention_geometry& g, float* out,
                              float* att, const float* qkv) {
  using namespace device_kernels;
  const index B = s.B;
#if defined(__CUDACC__)
  s.matmul.run(attention_products::scores(g, qkv, att, B), "GPT-2 attention scores");
  for_each_row(B * g.NH * g.T, attention_softmax_lanes{att, g.T});  // in place
  s.matmul.run(attention_products::values(g, att, qkv, out, B), "GPT-2 attention values");
#else
  for_each_index(B * g.NH * g.T * g.T, attention_scores{att, qkv, g});
  for_each_index(B * g.NH * g.T, attention_softmax{att, g.T});  // in place
  for_each_index(B * g.T * g.C, attention_values{out, att, qkv, g});
#endif
}

// dqkv = the attention's gradient from dout, written whole. datt holds the weights' gradients, then in place the
// scores' (the softmax's backward).
inline void attention_backward(device_workspace::state& s, const device_kernels::attention_geometry& g, float* dqkv,
                               float* datt, const float* dout, const float* qkv, const float* att) {
  using namespace device_kernels;
  namespace products = attention_products;
  const index B = s.B;
#if defined(__CUDACC__)
  s.matmul.run(products::attention_weights_backward(g, dout, qkv, datt, B), "GPT-2 attention backward (weights)");
  for_each_row(B * g.NH * g.T, attention_backward_softmax_lanes{datt, att, g.T});
  s.matmul.run(products::queries_backward(g, datt, qkv, dqkv, B), "GPT-2 attention backward (queries)");
  s.matmul.run(products::keys_backward(g, datt, qkv, dqkv, B), "GPT-2 attention backward (keys)");
  s.matmul.run(products::values_backward(g, att, dout, dqkv, B), "GPT-2 attention backward (values)");
#else
  for_each_index(B * g.NH * g.T * g.T, attention_backward_weights{datt, dout, qkv, g});
  for_each_index(B * g.NH * g.T, attention_backward_softmax{datt, att, g.T});
  for_each_index(B * g.T * g.C, attention_backward_queries{dqkv, datt, qkv, g});
  for_each_index(B * g.T * g.C, attention_backward_keys_values{dqkv, datt, att, dout, qkv, g});
#endif
}

}  // namespace device_detail

float* device_workspace::parameter(std::size_t tensor, const float* host, std::uint64_t version) {
  auto& s = *state_;
  if (tensor >= s.mirror_offsets.size())
    chunkwise::throw_error(chunkwise::error_code::invalid_argument,
                           "GPT-2 device passes: no parameter tensor " + std::to_string(tensor) + " among " +
                               std::to_string(s.mirror_offsets.size()));
  if (s.mirror.empty()) s.mirror = device_detail::buffer(s.mirror_elements, 0.0f);
  float* copy = device_detail::raw(s.mirror) + s.mirror_offsets[tensor];
  if (s.mirror_versions[tensor] == version) return copy;
  const std::size_t end = tensor + 1 < s.mirror_offsets.size() ? s.mirror_offsets[tensor + 1] : s.mirror_elements;
  const std::size_t elements = end - s.mirror_offsets[tensor];
  s.pipe.upload(copy, host, elements);
  s.mirror_versions[tensor] = version;
  return copy;
}

float* device_workspace::zeroed_gradient(std::size_t offset, std::size_t elements) {
  auto& s = *state_;
  device_detail::check_staging(offset, elements, s.staging);
  float* gradient = s.staged_gradients.get(s.staging) + offset;
  device_detail::zero(gradient, elements);
  return gradient;
}

void device_workspace::add_gradient_to(float* host, std::size_t offset, std::size_t elements) {
  state_->pipe.download_add(host, device_detail::staged_gradient(*state_, offset, elements), elements);
}

namespace device_detail {
// f(format) with the device_kernels format of a 16-bit chunk type.
template <class F>
void visit_16bit(chunkwise::dtype type, F&& f) {
  if (type == chunkwise::dtype::bf16) return f(device_kernels::bf16_format{});
  if (type == chunkwise::dtype::fp16) return f(device_kernels::fp16_format{});
  chunkwise::throw_error(chunkwise::error_code::invalid_argument,
                         std::string("GPT-2 device passes: 16-bit chunks are bf16 or fp16, not ") +
                             std::string(chunkwise::to_string(type)));
}
}  // namespace device_detail

float* device_workspace::widened_parameter(std::size_t offset, const std::uint16_t* device, std::size_t elements,
                                           chunkwise::dtype type) {
  auto& s = *state_;
  device_detail::check_staging(offset, elements, s.staging);
  float* widened = s.staged_parameters.get(s.staging) + offset;
  device_detail::visit_16bit(type, [&]<class Format>(Format) {
    device_kernels::for_each_index(elements, device_kernels::widen_16<Format>{widened, device});
  });
  return widened;
}

void device_workspace::add_gradient_to_16bit(std::uint16_t* device, std::size_t offset, std::size_t elements,
                                             float scale, chunkwise::dtype type) {
  const float* gradient = device_detail::staged_gradient(*state_, offset, elements);
  device_detail::visit_16bit(type, [&]<class Format>(Format) {
    device_kernels::for_each_index(elements, device_kernels::accumulate_16<Format>{device, gradient, scale});
  });
}

void device_workspace::synchronize() { state_->matmul.synchronize(); }

std::size_t device_workspace::own_device_bytes() const noexcept {
  const auto& s = *state_;
  const std::size_t floats = s.block.owned.size() + s.scratch.memory.owned.size() + s.staged_gradients.owned.size() +
                             s.staged_parameters.owned.size() + s.mirror.size();
  return floats * sizeof(float);
}

void reset_kernel_times() { device_kernels::kernel_times::instance().reset(); }
bool kernel_times_enabled() { return device_kernels::kernel_times::instance().enabled(); }
void add_host_time(const char* name, double seconds) { device_kernels::kernel_times::instance().add(name, seconds); }
void print_kernel_times() {
  if (device_kernels::kernel_times::instance().enabled()) device_kernels::kernel_times::instance().print(stdout);
}

// ----------------------------------------------------------------------------------------------------------------
// The passes (gpt2_model.hpp's, on device memory)

void embed_forward(const float* wte, const float* wpe, const int* tokens, device_workspace& acts) {
  auto& s = acts.buffers();
  const int* d_tokens = s.upload_tokens(tokens);
  device_detail::for_each_index(s.B * s.T * s.C, device_kernels::encoder_forward{device_detail::raw(s.encoded),
                                                                                 d_tokens, wte, wpe, s.T, s.C});
}

void layer_forward(std::size_t layer, const layer_params<float>& p, device_workspace& acts) {
  using namespace device_kernels;
  using device_detail::raw;
  auto& s = acts.buffers();
  const std::size_t B = s.B, T = s.T, C = s.C, NH = s.NH, BT = B * T, BTC = BT * C, l = layer, k = s.slot(layer);
  const float* residual = l == 0 ? raw(s.encoded) : raw(s.residual3) + (l - 1) * BTC;
  float* ln1 = raw(s.ln1) + k * BTC;
  float* ln1_mean = raw(s.ln1_mean) + k * BT;
  float* ln1_rstd = raw(s.ln1_rstd) + k * BT;
  float* qkv = raw(s.qkv) + k * BTC * 3;
  float* atty = raw(s.atty) + k * BTC;
  float* att = raw(s.att) + k * B * NH * T * T;
  float* attproj = raw(s.attproj) + k * BTC;
  float* residual2 = raw(s.residual2) + k * BTC;
  float* ln2 = raw(s.ln2) + k * BTC;
  float* ln2_mean = raw(s.ln2_mean) + k * BT;
  float* ln2_rstd = raw(s.ln2_rstd) + k * BT;
  float* fch = raw(s.fch) + k * BTC * 4;
  float* fch_gelu = raw(s.fch_gelu) + k * BTC * 4;
  float* fcproj = raw(s.fcproj) + k * BTC;
  float* residual3 = raw(s.residual3) + l * BTC;

  device_detail::layernorm_forward(s, ln1, ln1_mean, ln1_rstd, residual, p[ln_1_weight], p[ln_1_bias], BT);
  s.matmul.forward(qkv, ln1, p[attn_c_attn_weight], p[attn_c_attn_bias], BT, C, 3 * C);
  device_detail::attention_forward(s, attention_geometry{T, C, NH}, atty, att, qkv);
  // On the GPU the products leave their bias to the pass that reads their output next (bias_gelu_forward); the CPU
  // loops' products add it in their loops, and those passes then add none.
  using device_detail::in_product, device_detail::after_product;
  s.matmul.forward(attproj, atty, p[attn_c_proj_weight], in_product(p[attn_c_proj_bias]), BT, C, C);
  for_each_index(BTC, residual_bias_forward{residual2, residual, attproj, after_product(p[attn_c_proj_bias]), C});
  device_detail::layernorm_forward(s, ln2, ln2_mean, ln2_rstd, residual2, p[ln_2_weight], p[ln_2_bias], BT);
  s.matmul.forward(fch, ln2, p[mlp_c_fc_weight], in_product(p[mlp_c_fc_bias]), BT, C, 4 * C);
  for_each_index(BTC * 4, bias_gelu_forward{fch_gelu, fch, after_product(p[mlp_c_fc_bias]), 4 * C});
  s.matmul.forward(fcproj, fch_gelu, p[mlp_c_proj_weight], in_product(p[mlp_c_proj_bias]), BT, 4 * C, C);
  for_each_index(BTC, residual_bias_forward{residual3, residual2, fcproj, after_product(p[mlp_c_proj_bias]), C});
}

float head_forward(const float* ln_f_weight, const float* ln_f_bias, const float* wte, const int* targets,
                   device_workspace& acts) {
  using device_detail::raw;
  auto& s = acts.buffers();
  const std::size_t BT = s.B * s.T, C = s.C;
  const int* d_targets = s.upload(s.scratch.targets, s.uploaded_targets, targets, "targets");
  const float* residual = raw(s.residual3) + (s.L - 1) * BT * C;
  device_detail::layernorm_forward(s, raw(s.lnf), raw(s.lnf_mean), raw(s.lnf_rstd), residual, ln_f_weight, ln_f_bias,
                                   BT);
  s.matmul.forward(raw(s.logits), raw(s.lnf), wte, nullptr, BT, C, s.Vp);
  using namespace device_kernels;
#if defined(__CUDACC__)
  // The loss's backward too: dlogits over the logits, which head_backward's products read (crossentropy_lanes).
  const float dloss = 1.0f / static_cast<float>(BT);
  for_each_row(BT, crossentropy_lanes{raw(s.logits), raw(s.losses), d_targets, dloss, s.V, s.Vp});
#else
  float* row_sum = s.head_row_sums();
  const row_segments segments = s.softmax_segments();
  const std::size_t parts = BT * segments.per_row();
  float* maxima = s.scratch.row_parts;
  float* sums = s.scratch.row_parts + parts;
  float* row_max = s.scratch.row_stats;
  device_detail::for_each_index(parts, softmax_segment_max{maxima, raw(s.logits), segments, s.Vp});
  device_detail::for_each_index(BT, softmax_row_max{row_max, maxima, segments});
  device_detail::for_each_index(parts, softmax_segment_exp{raw(s.logits), sums, row_max, segments, s.Vp});
  device_detail::for_each_index(BT, softmax_row_sum{row_sum, sums, segments});
  device_detail::for_each_index(BT, crossentropy_forward{raw(s.losses), raw(s.logits), row_sum, d_targets, s.Vp});
#endif
  s.host_losses.resize(BT);
  thrust::copy_n(thrust::device_pointer_cast(raw(s.losses)), BT, s.host_losses.begin());
  double sum = 0;  // in double, in row order, as the CPU's head_forward
  for (const float loss : s.host_losses) sum += static_cast<double>(loss);
  return static_cast<float>(sum / static_cast<double>(BT));
}

void head_backward(const float* ln_f_weight, const float* wte, float* d_ln_f_weight, float* d_ln_f_bias, float* d_wte,
                   const int* targets, device_workspace& acts) {
  using device_detail::raw;
  auto& s = acts.buffers();
  const std::size_t BT = s.B * s.T, C = s.C, BTC = BT * C;
  float* dresidual = raw(s.dresidual) + s.dresidual_offset(s.L);
  const float* residual = raw(s.residual3) + (s.L - 1) * BTC;
  float* dlogits = raw(s.logits);
#if defined(__CUDACC__)
  // head_forward wrote them (crossentropy_lanes), against the targets it was given: backward must be of that batch.
  if (!s.holds(s.uploaded_targets, targets))
    chunkwise::throw_error(chunkwise::error_code::illegal_state,
                           "GPT-2 device passes: head_backward's targets are not those of the head_forward before it "
                           "(backward follows forward on the same batch)");
#else
  const int* d_targets = s.upload(s.scratch.targets, s.uploaded_targets, targets, "targets");
  const float dloss = 1.0f / static_cast<float>(BT);
  // dlogits replace the exponentials forward left there
  device_detail::for_each_index(BT * s.Vp, device_kernels::crossentropy_softmax_backward{dlogits, s.head_row_sums(),
                                                                                         d_targets, dloss, s.V, s.Vp});
#endif
  // Every activation gradient written whole, none zeroed first (as in layer_backward): dlnf by the product, the
  // residual stream's gradient by layer norm's backward (base 0).
  s.matmul.backward(raw(s.dlnf), d_wte, nullptr, dlogits, raw(s.lnf), wte, BT, C, s.Vp);
  device_detail::layernorm_backward(s, dresidual, nullptr, d_ln_f_weight, d_ln_f_bias, raw(s.dlnf), residual,
                                    ln_f_weight, raw(s.lnf_mean), raw(s.lnf_rstd), BT);
}

// The CPU loops' layer backward (gpt2_model.hpp) zeroes ten gradient buffers and copies the residual stream's
// gradient twice (residual_backward) to add into the copies. Here each activation gradient is written once, whole,
// by the pass that makes it (the products' inputs' gradients with cuBLAS's beta = 0, GELU's and attention's by
// assignment), and the residual stream's gradient is read where it is: the MLP's projection reads d(output) as its
// dout, layer norm 2's backward adds into it in place (making d(residual2), the attention projection's dout), and
// layer norm 1's writes d(input) = d(residual2) + its own. Each sum is the loops' (x, not 0 + x), so the bits are the
// same. Left out, in (B, T, C) arrays a layer: 18 zeroed, 10 read or written by the copies, 14 read back by the
// products' beta = 1 and GELU's +=: 42, 1.06 GB a layer at batch 32, context 256 (C = 768).
void layer_backward(std::size_t layer, const layer_params<float>& p, const layer_grads<float>& g,
                    device_workspace& acts) {
  using namespace device_kernels;
  using device_detail::raw;
  auto& s = acts.buffers();
  const std::size_t B = s.B, T = s.T, C = s.C, NH = s.NH, BT = B * T, BTC = BT * C, l = layer, k = s.slot(layer);
  const float* residual = l == 0 ? raw(s.encoded) : raw(s.residual3) + (l - 1) * BTC;
  const float* ln1 = raw(s.ln1) + k * BTC;
  const float* ln1_mean = raw(s.ln1_mean) + k * BT;
  const float* ln1_rstd = raw(s.ln1_rstd) + k * BT;
  const float* qkv = raw(s.qkv) + k * BTC * 3;
  const float* atty = raw(s.atty) + k * BTC;
  const float* att = raw(s.att) + k * B * NH * T * T;
  const float* residual2 = raw(s.residual2) + k * BTC;
  const float* ln2 = raw(s.ln2) + k * BTC;
  const float* ln2_mean = raw(s.ln2_mean) + k * BT;
  const float* ln2_rstd = raw(s.ln2_rstd) + k * BT;
  const float* fch = raw(s.fch) + k * BTC * 4;
  const float* fch_gelu = raw(s.fch_gelu) + k * BTC * 4;
  float* doutput = raw(s.dresidual) + s.dresidual_offset(l + 1);  // d(output), then in place d(residual2)
  float* dinput = raw(s.dresidual) + s.dresidual_offset(l);       // the other slice

  s.matmul.backward(raw(s.dfch_gelu), g[mlp_c_proj_weight], g[mlp_c_proj_bias], doutput, fch_gelu,
                    p[mlp_c_proj_weight], BT, 4 * C, C);
  const float* fc_bias = device_detail::after_product(p[mlp_c_fc_bias]);  // where fch is the product alone
  for_each_index(BTC * 4, device_kernels::gelu_backward{raw(s.dfch), fch, fc_bias, 4 * C, raw(s.dfch_gelu)});
  s.matmul.backward(raw(s.dln2), g[mlp_c_fc_weight], g[mlp_c_fc_bias], raw(s.dfch), ln2, p[mlp_c_fc_weight], BT, C,
                    4 * C);
  device_detail::layernorm_backward(s, doutput, doutput, g[ln_2_weight], g[ln_2_bias], raw(s.dln2), residual2,
                                    p[ln_2_weight], ln2_mean, ln2_rstd, BT);
  const float* dresidual2 = doutput;
  s.matmul.backward(raw(s.datty), g[attn_c_proj_weight], g[attn_c_proj_bias], dresidual2, atty,
                    p[attn_c_proj_weight], BT, C, C);
  device_detail::attention_backward(s, device_kernels::attention_geometry{T, C, NH}, raw(s.dqkv), raw(s.datt),
                                    raw(s.datty), qkv, att);
  s.matmul.backward(raw(s.dln1), g[attn_c_attn_weight], g[attn_c_attn_bias], raw(s.dqkv), ln1, p[attn_c_attn_weight],
                    BT, C, 3 * C);
  device_detail::layernorm_backward(s, dinput, dresidual2, g[ln_1_weight], g[ln_1_bias], raw(s.dln1), residual,
                                    p[ln_1_weight], ln1_mean, ln1_rstd, BT);
}

void embed_backward(float* d_wte, float* d_wpe, const int* tokens, device_workspace& acts) {
  auto& s = acts.buffers();
  s.upload_tokens(tokens);  // and their buckets (forward uploaded them already)
  const float* dresidual = device_detail::raw(s.dresidual) + s.dresidual_offset(0);
  const std::size_t BT = s.B * s.T;
  const auto& buckets = s.scratch;
  device_detail::for_each_index(s.token_buckets * s.C,
                                device_kernels::encoder_backward{d_wte, dresidual, buckets.bucket_positions,
                                                                 buckets.bucket_starts, buckets.bucket_tokens, s.C});
  device_detail::for_each_index(s.T * s.C, device_kernels::encoder_backward_positions{d_wpe, dresidual, BT, s.T, s.C});
}

}  // namespace gpt2
