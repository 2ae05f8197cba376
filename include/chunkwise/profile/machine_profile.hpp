#pragma once
// machine_profile: the capacities and rates of one machine that the cost model needs. A literal type, so a machine
// written as a constant can be searched in a constant expression. Units: bytes, bytes per second, seconds,
// parameters per second, FLOP per second.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/tensor_spec.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace chunkwise {

struct bandwidth_point {
  byte_count message_bytes = 0;
  double bytes_per_second = 0;
};

/// Bus bandwidth of one collective by message size (nccl-tests' busbw), interpolated linearly between measured
/// sizes and held constant beyond them.
struct bandwidth_curve {
  static constexpr std::size_t capacity = 12;
  std::array<bandwidth_point, capacity> points{};  // increasing message_bytes
  std::uint32_t count = 0;

  static constexpr bandwidth_curve flat(double bytes_per_second) noexcept {
    bandwidth_curve curve;
    curve.points[0] = {1 * MiB, bytes_per_second};
    curve.count = 1;
    return curve;
  }
  constexpr void add(byte_count message_bytes, double bytes_per_second) {
    if (count == capacity)
      detail::raise(error_code::invalid_argument,
                    "bandwidth curve: at most " + std::to_string(capacity) + " message sizes fit");
    points[count++] = {message_bytes, bytes_per_second};
  }
  [[nodiscard]] constexpr double at(byte_count message_bytes) const noexcept {
    if (count == 0) return 0;
    if (message_bytes <= points[0].message_bytes) return points[0].bytes_per_second;
    for (std::uint32_t i = 1; i < count; ++i)
      if (message_bytes <= points[i].message_bytes) {
        const auto& a = points[i - 1];
        const auto& b = points[i];
        const double t = static_cast<double>(message_bytes - a.message_bytes) /
                         static_cast<double>(b.message_bytes - a.message_bytes);
        // Not a + t * (b - a): that cancels when a dwarfs b (2e57 + (3e9 - 2e57) is 0 at t = 1, a measured size).
        // This form is exact at both ends; the clamp keeps rounding inside the segment, so the result stays positive.
        const double value = (1 - t) * a.bytes_per_second + t * b.bytes_per_second;
        return std::clamp(value, std::min(a.bytes_per_second, b.bytes_per_second),
                          std::max(a.bytes_per_second, b.bytes_per_second));
      }
    return points[count - 1].bytes_per_second;
  }
};

enum class device_kind : std::uint8_t {
  host,  // the host backend: "devices" are thread ranks and device memory is a host-memory budget
  cuda,
};

constexpr std::string_view to_string(device_kind kind) noexcept { return kind == device_kind::cuda ? "cuda" : "host"; }

struct machine_profile {
  tensor_name name;         // what the machine is, in words ("4x 24 GiB GPU, PCIe 16 GB/s")
  tensor_name fingerprint;  // key of a measured profile in the cache; empty for a described machine
  device_kind kind = device_kind::cuda;

  std::uint32_t devices = 1;        // ranks on this machine, one per device
  std::uint32_t machines = 1;       // machines of the job, alike, each with `devices` ranks
  byte_count device_memory = 0;     // per device, what chunkwise may use
  byte_count host_memory = 0;       // whole machine, for chunk homes, optimizer states and staging
  byte_count nvme_capacity = 0;     // free bytes on the NVMe store's file system; 0 = no NVMe store

  double host_to_device_bytes_per_second = 0;  // per device (PCIe)
  double device_to_host_bytes_per_second = 0;
  double nvme_read_bytes_per_second = 0;       // whole machine, O_DIRECT sequential
  double nvme_write_bytes_per_second = 0;
  // CPU time (the kernel's and the I/O thread's) per byte moved to or from the NVMe store: on the host backend it
  // is taken from the cores the passes compute on (a virtual disk's is large: 0.1 ms per MB measured here)
  double nvme_cpu_seconds_per_byte = 0;
  // The NVMe rates by block size ("message_bytes": the block moved in one call). The runtime moves each chunk's
  // blocks whole, and a small block keeps fewer requests in flight (measured here: 1 MiB blocks at 0.65x the reads
  // and 0.7x the writes of 16 MiB ones). Empty: the flat rates above at every size (a described machine).
  bandwidth_curve nvme_read_by_block;
  bandwidth_curve nvme_write_by_block;

  bandwidth_curve all_gather;      // bus bandwidth per message size
  bandwidth_curve reduce_scatter;
  bandwidth_curve all_reduce;
  double collective_latency_seconds = 0;  // fixed cost of one collective call
  // Between machines (machines > 1): the bus bandwidth of a collective over one rank per machine, and its fixed
  // cost per call. A collective over every rank of the job runs at the slower of the two links.
  bandwidth_curve inter_machine;
  double inter_machine_latency_seconds = 0;

  double device_optimizer_params_per_second = 0;  // fused Adam on one device
  double host_optimizer_params_per_second = 0;    // CPU Adam, all cores shared by the machine's ranks
  double device_flops_per_second = 0;             // achieved training FLOP/s of one device
};

/// The NVMe store's read and write rates for blocks of `block_bytes`: the measured curve, else the flat rate.
constexpr double nvme_read_rate(const machine_profile& machine, byte_count block_bytes) noexcept {
  return machine.nvme_read_by_block.count > 0 ? machine.nvme_read_by_block.at(block_bytes)
                                              : machine.nvme_read_bytes_per_second;
}
constexpr double nvme_write_rate(const machine_profile& machine, byte_count block_bytes) noexcept {
  return machine.nvme_write_by_block.count > 0 ? machine.nvme_write_by_block.at(block_bytes)
                                               : machine.nvme_write_bytes_per_second;
}

/// `machine` with its NVMe store's rates, flat and by block, `speed` times the profiled ones: a drive that ran at
/// another rate under a run's own traffic than when it was profiled (a virtual disk still flushing a deleted store
/// measured 0.7x its rate a minute later).
constexpr machine_profile with_nvme_speed(machine_profile machine, double speed) noexcept {
  machine.nvme_read_bytes_per_second *= speed;
  machine.nvme_write_bytes_per_second *= speed;
  for (auto* curve : {&machine.nvme_read_by_block, &machine.nvme_write_by_block})
    for (std::uint32_t i = 0; i < curve->count; ++i) curve->points[i].bytes_per_second *= speed;
  return machine;
}

/// The ranks of the job: every machine's devices.
constexpr std::uint32_t job_ranks(const machine_profile& machine) noexcept { return machine.devices * machine.machines; }

/// Checks a machine for values the cost model cannot use; errors name the field.
constexpr void validate(const machine_profile& machine) {
  const auto fail = [&](const std::string& what) {
    detail::raise(error_code::invalid_profile, "machine profile '" + machine.name.str() + "': " + what);
  };
  if (machine.devices == 0) fail("devices is 0; a machine has at least one device (or one host rank)");
  if (machine.machines == 0) fail("machines is 0; a job runs on at least one machine");
  if (machine.machines > 1 && machine.inter_machine.count == 0)
    fail("several machines need the inter_machine bandwidth (a collective across machines, per message size)");
  if (!(machine.inter_machine_latency_seconds >= 0))
    fail("inter_machine_latency_seconds must be 0 or more: the fixed cost of one collective call between machines");
  if (machine.device_memory == 0) fail("device_memory is 0; give the memory chunkwise may use per device");
  if (machine.device_flops_per_second <= 0) fail("device_flops_per_second must be positive");
  if (machine.host_to_device_bytes_per_second <= 0 || machine.device_to_host_bytes_per_second <= 0)
    fail("host-device bandwidths must be positive");
  if (machine.device_optimizer_params_per_second <= 0 || machine.host_optimizer_params_per_second <= 0)
    fail("optimizer rates must be positive");
  // Written as !(x >= 0), not x < 0, so NaN fails too: a negative latency would make many small collectives look
  // cheaper than one large one and steer the search to the wrong chunk size.
  if (!(machine.collective_latency_seconds >= 0))
    fail("collective_latency_seconds must be 0 or more: the fixed cost of one collective call, in seconds");
  if (machine.nvme_capacity > 0 && (machine.nvme_read_bytes_per_second <= 0 || machine.nvme_write_bytes_per_second <= 0))
    fail("an NVMe store needs positive read and write bandwidths");
  if (!(machine.nvme_cpu_seconds_per_byte >= 0))
    fail("nvme_cpu_seconds_per_byte must be 0 or more: the CPU time per byte moved to or from the NVMe store");
  for (const auto* curve : {&machine.nvme_read_by_block, &machine.nvme_write_by_block})
    for (std::uint32_t i = 0; i < curve->count; ++i) {
      if (!(curve->points[i].bytes_per_second > 0)) fail("NVMe rates by block size must be positive");
      if (i > 0 && curve->points[i].message_bytes <= curve->points[i - 1].message_bytes)
        fail("NVMe rates by block size: the block sizes must increase");
    }
  if (machine.devices > 1 && (machine.all_gather.count == 0 || machine.reduce_scatter.count == 0 ||
                              machine.all_reduce.count == 0))
    fail("several devices need all_gather, reduce_scatter and all_reduce bandwidths");
  for (const auto* curve : {&machine.all_gather, &machine.reduce_scatter, &machine.all_reduce, &machine.inter_machine})
    for (std::uint32_t i = 0; i < curve->count; ++i) {
      if (curve->points[i].bytes_per_second <= 0) fail("collective bandwidths must be positive");
      if (i > 0 && curve->points[i].message_bytes <= curve->points[i - 1].message_bytes)
        fail("collective bandwidth message sizes must increase");
    }
}

/// A machine described by its headline numbers, with the rest filled in from typical ratios (documented in
/// docs/cost-model.md): collectives over the host link at 80% of it, 20 us per collective call, the device's
/// fused Adam at its memory bandwidth over 28 bytes per parameter.
struct machine_description {
  std::uint32_t gpus = 1;                   // per machine
  std::uint32_t machines = 1;               // alike, joined by the inter-machine link
  double inter_machine_bytes_per_second = 12.5e9;  // bus bandwidth between machines: 100 Gb/s Ethernet or InfiniBand
  double inter_machine_latency_seconds = 50e-6;
  byte_count gpu_memory = 24 * GiB;
  byte_count host_memory = 64 * GiB;
  double pcie_bytes_per_second = 16e9;
  double nvme_bytes_per_second = 3e9;       // read; writes at 80% of it
  byte_count nvme_capacity = 1024 * GiB;
  double collective_bytes_per_second = 0;   // 0: 80% of the host link (GPUs talking over PCIe)
  double gpu_flops_per_second = 100e12;     // achieved, mixed precision
  double gpu_memory_bytes_per_second = 2e12;
  double cpu_adam_params_per_second = 1.6e9;
};

constexpr machine_profile describe_machine(const machine_description& d) {
  machine_profile m;
  m.name = "described";
  m.kind = device_kind::cuda;
  m.devices = d.gpus;
  m.device_memory = d.gpu_memory;
  m.host_memory = d.host_memory;
  m.nvme_capacity = d.nvme_capacity;
  m.host_to_device_bytes_per_second = d.pcie_bytes_per_second;
  m.device_to_host_bytes_per_second = d.pcie_bytes_per_second;
  m.nvme_read_bytes_per_second = d.nvme_bytes_per_second;
  m.nvme_write_bytes_per_second = 0.8 * d.nvme_bytes_per_second;
  const double bus = d.collective_bytes_per_second > 0 ? d.collective_bytes_per_second : 0.8 * d.pcie_bytes_per_second;
  m.all_gather = bandwidth_curve::flat(bus);
  m.reduce_scatter = bandwidth_curve::flat(bus);
  m.all_reduce = bandwidth_curve::flat(bus);
  m.collective_latency_seconds = 20e-6;
  m.machines = d.machines;
  if (d.machines > 1) {
    m.inter_machine = bandwidth_curve::flat(d.inter_machine_bytes_per_second);
    m.inter_machine_latency_seconds = d.inter_machine_latency_seconds;
  }
  m.device_optimizer_params_per_second = d.gpu_memory_bytes_per_second / 28.0;
  m.host_optimizer_params_per_second = d.cpu_adam_params_per_second;
  m.device_flops_per_second = d.gpu_flops_per_second;
  return m;
}

}  // namespace chunkwise
