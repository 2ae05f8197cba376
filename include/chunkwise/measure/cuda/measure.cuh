#pragma once
// measure<cuda_backend>(): the machine profile of this machine's GPUs. Device memory from cudaMemGetInfo (90% of what
// is free), host<->device bandwidth of pinned copies timed with events, a bf16 GEMM through cuBLAS (tensor cores,
// fp32 accumulation: what mixed-precision training runs), the fused CUDA Adam over 64 M parameters, NCCL all-gather,
// reduce-scatter and all-reduce bus bandwidth over every visible GPU (ncclCommInitAll; peer copies without NCCL), and
// the host's NVMe and CPU Adam as measure<host_backend> takes them.
#if CHUNKWISE_HAS_CUDA
#include <chunkwise/core/abi.hpp>
#include <chunkwise/backend/cuda/backend.cuh>
#include <chunkwise/core/cuda/checked_call.cuh>
#include <chunkwise/core/cuda/current_device.cuh>
#include <chunkwise/optim/cuda/adam.cuh>
#include <chunkwise/measure/host.hpp>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#if CHUNKWISE_HAS_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace chunkwise::detail::inline CHUNKWISE_ABI {

/// Milliseconds of `body` enqueued on `stream`, timed with events, best of three after a warm-up.
template <class F>
double cuda_seconds(cudaStream_t stream, F&& body) {
  cudaEvent_t begin{}, end{};
  CHUNKWISE_CUDA_TRY(cudaEventCreate(&begin), std::string("measure: event"));
  CHUNKWISE_CUDA_TRY(cudaEventCreate(&end), std::string("measure: event"));
  body();
  double best = 1e300;
  for (int i = 0; i < 3; ++i) {
    CHUNKWISE_CUDA_TRY(cudaEventRecord(begin, stream), std::string("measure: record"));
    body();
    CHUNKWISE_CUDA_TRY(cudaEventRecord(end, stream), std::string("measure: record"));
    CHUNKWISE_CUDA_TRY(cudaEventSynchronize(end), std::string("measure: synchronize"));
    float ms = 0;
    CHUNKWISE_CUDA_TRY(cudaEventElapsedTime(&ms, begin, end), std::string("measure: elapsed"));
    best = std::min(best, ms * 1e-3);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return best;
}

}  // namespace chunkwise::detail

namespace chunkwise::inline CHUNKWISE_ABI {

template <>
inline machine_profile measure<cuda_backend>(const measure_options& options) {
  const auto total_start = std::chrono::steady_clock::now();
  int count = 0;
  CHUNKWISE_CUDA_TRY(cudaGetDeviceCount(&count), std::string("measure: no usable GPU"));
  const int devices = std::min<int>(count, static_cast<int>(options.ranks));
  // The calling thread's device (a process that picked its GPU keeps it), current again on return.
  const detail::current_device_guard restore("measure");
  const int own_device = restore.device();
  cudaDeviceProp properties{};
  CHUNKWISE_CUDA_TRY(cudaGetDeviceProperties(&properties, own_device),
                     "measure: device " + std::to_string(own_device));
  machine_profile m;
  m.kind = device_kind::cuda;
  m.devices = static_cast<std::uint32_t>(devices);
  m.name = std::to_string(devices) + "x " + properties.name;
  m.fingerprint = detail::machine_fingerprint() + "-" + std::to_string(count) + "gpu";

  std::size_t free = 0, total = 0;
  CHUNKWISE_CUDA_TRY(cudaMemGetInfo(&free, &total), std::string("measure: cudaMemGetInfo"));
  m.device_memory = options.device_memory != 0 ? options.device_memory : static_cast<byte_count>(0.9 * static_cast<double>(free));
  m.host_memory = detail::meminfo_bytes("MemAvailable") / 2;
  options.progress(std::string(properties.name) + ": " + format_bytes(free) + " of " + format_bytes(total) +
                   " free; device budget " + format_bytes(m.device_memory) + ", host budget " + format_bytes(m.host_memory));

  cudaStream_t stream{};
  CHUNKWISE_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), std::string("measure: stream"));
  // Host <-> device, pinned, 256 MiB.
  {
    const std::size_t bytes = 256 * MiB;
    void* host = nullptr;
    void* device = nullptr;
    CHUNKWISE_CUDA_TRY(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), std::string("measure: pinned buffer"));
    CHUNKWISE_CUDA_TRY(cudaMalloc(&device, bytes), std::string("measure: device buffer"));
    const double up = detail::cuda_seconds(stream, [&] {
      CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), std::string("measure: h2d"));
    });
    const double down = detail::cuda_seconds(stream, [&] {
      CHUNKWISE_CUDA_TRY(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream), std::string("measure: d2h"));
    });
    m.host_to_device_bytes_per_second = static_cast<double>(bytes) / up;
    m.device_to_host_bytes_per_second = static_cast<double>(bytes) / down;
    cudaFree(device);
    cudaFreeHost(host);
    options.progress("pinned copies: host->device " + detail::format_rate(m.host_to_device_bytes_per_second) +
                     ", device->host " + detail::format_rate(m.device_to_host_bytes_per_second));
  }
  // bf16 GEMM with fp32 accumulation, 8192^3.
  {
    const int n = 8192;
    __nv_bfloat16* matrices = nullptr;
    const std::size_t elements = static_cast<std::size_t>(n) * n;
    CHUNKWISE_CUDA_TRY(cudaMalloc(&matrices, 3 * elements * sizeof(__nv_bfloat16)), std::string("measure: GEMM buffers"));
    CHUNKWISE_CUDA_TRY(cudaMemsetAsync(matrices, 0, 3 * elements * sizeof(__nv_bfloat16), stream), std::string("measure: GEMM buffers"));
    cublasHandle_t handle{};
    CHUNKWISE_CUBLAS_TRY(cublasCreate(&handle), "measure<cuda_backend>");
    CHUNKWISE_CUBLAS_TRY(cublasSetStream(handle, stream), "measure<cuda_backend>");
    const float alpha = 1.0f, beta = 0.0f;
    const double s = detail::cuda_seconds(stream, [&] {
      CHUNKWISE_CUBLAS_TRY(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, matrices, CUDA_R_16BF, n,
                                        matrices + elements, CUDA_R_16BF, n, &beta, matrices + 2 * elements,
                                        CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), "measure<cuda_backend>");
    });
    m.device_flops_per_second = 2.0 * n * static_cast<double>(n) * n / s;
    cublasDestroy(handle);
    cudaFree(matrices);
    options.progress("cuBLAS bf16 GEMM 8192^3: " + detail::format_rate(m.device_flops_per_second, "FLOP/s"));
  }
  // Fused Adam over 64 M fp32 parameters.
  {
    const std::size_t n = 64u << 20;
    float* arrays = nullptr;
    CHUNKWISE_CUDA_TRY(cudaMalloc(&arrays, 4 * n * sizeof(float)), std::string("measure: Adam buffers"));
    CHUNKWISE_CUDA_TRY(cudaMemsetAsync(arrays, 0, 4 * n * sizeof(float), stream), std::string("measure: Adam buffers"));
    optim::cuda_adam adam(optim::adamw_config(), stream);
    const optim::chunk_arrays chunk{arrays, arrays + n, dtype::fp32, arrays + 2 * n, arrays + 3 * n, nullptr, dtype::fp32, n};
    std::uint64_t step = 0;
    const double s = detail::cuda_seconds(stream, [&] { adam.step(chunk, {.lr = 1e-4f, .step = ++step}); });
    m.device_optimizer_params_per_second = static_cast<double>(n) / s;
    cudaFree(arrays);
    options.progress("fused CUDA AdamW: " + detail::format_rate(m.device_optimizer_params_per_second, " params/s"));
  }
  // Collectives over every GPU of this process: bus bandwidth by message size, and the fixed cost of a call.
  m.collective_latency_seconds = 10e-6;  // one GPU: no collective runs; a typical NCCL call's, to keep it complete
  if (devices <= 1) {
    const double bus = m.host_to_device_bytes_per_second;  // unused on one rank; keep the profile complete
    m.all_gather = m.reduce_scatter = m.all_reduce = bandwidth_curve::flat(bus);
  } else {
#if CHUNKWISE_HAS_NCCL
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(devices));
    std::vector<int> ids(static_cast<std::size_t>(devices));
    for (int d = 0; d < devices; ++d) ids[static_cast<std::size_t>(d)] = d;
    if (ncclCommInitAll(comms.data(), devices, ids.data()) != ncclSuccess)
      detail::raise(error_code::comm_error, "measure: ncclCommInitAll over " + std::to_string(devices) + " GPUs failed");
    std::vector<cudaStream_t> streams(static_cast<std::size_t>(devices));
    std::vector<float*> buffers(static_cast<std::size_t>(devices));
    const byte_count largest = 256 * MiB;
    for (int d = 0; d < devices; ++d) {
      CHUNKWISE_CUDA_TRY(cudaSetDevice(d), std::string("measure: device"));
      CHUNKWISE_CUDA_TRY(cudaStreamCreate(&streams[static_cast<std::size_t>(d)]), std::string("measure: stream"));
      CHUNKWISE_CUDA_TRY(cudaMalloc(&buffers[static_cast<std::size_t>(d)], largest * 2), std::string("measure: NCCL buffers"));
    }
    const auto run = [&](int kind, std::size_t count, int repeats = 5) {  // count: elements per rank
      const auto start = std::chrono::steady_clock::now();
      for (int repeat = 0; repeat < repeats; ++repeat) {
        const std::string context = "measure: NCCL over " + std::to_string(devices) + " GPUs";
        CHUNKWISE_NCCL_TRY(ncclGroupStart(), context);
        for (int d = 0; d < devices; ++d) {
          float* buffer = buffers[static_cast<std::size_t>(d)];
          const auto s = streams[static_cast<std::size_t>(d)];
          const auto c = comms[static_cast<std::size_t>(d)];
          const std::size_t all = count * static_cast<std::size_t>(devices);
          if (kind == 0) CHUNKWISE_NCCL_TRY(ncclAllGather(buffer, buffer + all / 2, count, ncclFloat, c, s), context);
          else if (kind == 1)
            CHUNKWISE_NCCL_TRY(ncclReduceScatter(buffer, buffer + all, count, ncclFloat, ncclSum, c, s), context);
          else CHUNKWISE_NCCL_TRY(ncclAllReduce(buffer, buffer, count, ncclFloat, ncclSum, c, s), context);
        }
        CHUNKWISE_NCCL_TRY(ncclGroupEnd(), context);
      }
      for (int d = 0; d < devices; ++d)
        CHUNKWISE_CUDA_TRY(cudaStreamSynchronize(streams[static_cast<std::size_t>(d)]), std::string("measure: NCCL"));
      return detail::seconds_since(start) / repeats;
    };
    // The fixed cost of one call: all-reduces of one float, back to back after a warm-up (launch and protocol
    // latency; the cost model charges it per chunk collective besides the bytes).
    run(2, 1, 10);
    m.collective_latency_seconds = run(2, 1, 200);
    const double factor = static_cast<double>(devices - 1) / devices;
    for (const byte_count bytes : {1 * MiB, 16 * MiB, 64 * MiB}) {
      const std::size_t count = bytes / sizeof(float) / static_cast<std::size_t>(devices);
      const double total = static_cast<double>(count * devices * sizeof(float));
      m.all_gather.add(bytes, total / run(0, count) * factor);
      m.reduce_scatter.add(bytes, total / run(1, count) * factor);
      m.all_reduce.add(bytes, total / run(2, count * static_cast<std::size_t>(devices)) * 2 * factor);
    }
    for (int d = 0; d < devices; ++d) {
      cudaSetDevice(d);
      cudaFree(buffers[static_cast<std::size_t>(d)]);
      cudaStreamDestroy(streams[static_cast<std::size_t>(d)]);
      ncclCommDestroy(comms[static_cast<std::size_t>(d)]);
    }
    cudaSetDevice(own_device);
    options.progress("NCCL over " + std::to_string(devices) + " GPUs at 64 MiB: all-gather " +
                     detail::format_rate(m.all_gather.at(64 * MiB)) + ", all-reduce " +
                     detail::format_rate(m.all_reduce.at(64 * MiB)) + " bus bandwidth, " +
                     std::to_string(static_cast<int>(m.collective_latency_seconds * 1e6 + 0.5)) + " us per call");
#else
    detail::raise(error_code::unsupported, "measure: several GPUs need NCCL to measure collectives; build with CHUNKWISE_NCCL=ON");
#endif
  }
  cudaStreamDestroy(stream);
  detail::measure_nvme(options, m);
  m.host_optimizer_params_per_second =
      detail::measure_cpu_adam(options, options.threads != 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency()));
  return detail::finish_measurement(options, std::move(m), total_start);
}

}  // namespace chunkwise
#endif  // CHUNKWISE_HAS_CUDA
