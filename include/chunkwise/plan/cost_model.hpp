#pragma once
// The cost model: (plan, inner knobs, model profile, machine profile) -> memory per tier and step time.
// docs/cost-model.md derives every formula; the short form, per rank, with n chunks of average capacity C:
//
// Homes. The collective says what each rank keeps of each role: Hp, Hg, Ho = Collective::bytes_per_rank(role, ...)
// for parameters (C per chunk), gradients (C) and optimizer states (C * k, k = (8 + master) / s: Adam's m and v in
// fp32 plus an fp32 master copy when parameters are s = 2-byte types). Per chunk: cp = Hp/n, cg = Hg/n, co = Ho/n.
// The placement keeps R = Placement::resident_chunks(n, b) chunks on the device (the first R in first-use order) and
// streams the other S = n - R through b - R device blocks. The optimizer policy moves the states of Roff of the R
// resident chunks off the device. Streamed chunks keep gradients and states in their home.
//
// Memory. device = Placement::device_bytes(cp, n, b) + gathered chunks (Collective::working_bytes(parameter) per chunk
// of the widest pass, plus one prefetched) + 2 full-chunk gradient buffers + (R - Roff)(cg + co) + peak activations.
// host = ranks * (Placement::host_bytes + (S + Roff)(cg + co) of the states kept in host memory);
// nvme = ranks * (Placement::nvme_bytes + states kept on NVMe).
//
// Time. Forward and backward overlap compute (profile FLOPs / device FLOP/s) with collectives (Collective::traffic
// over the measured bus bandwidth at chunk size, plus a latency per call), host-to-device fetches (Belady misses of a
// cold cache along the profiled chunk order: every streamed chunk changed at home last step), device-to-host gradient
// moves and NVMe reads: phase = max of those + the first fetch, which nothing hides (on the host backend, whose
// device is the CPU, compute, collectives and copies share the cores and add up; NVMe reads overlap them). The
// update runs on the device for (R - Roff) chunks and on the host's cores, shared by all ranks, for S + Roff
// chunks, concurrently with NVMe state streaming and the upload of updated resident parameters: optimizer = max of
// those (on the host backend, whose device is the CPU, the two updates share the cores and add up).
// step = phase + optimizer; when the trainer's updates overlap backward (model_profile::updates_overlap_backward),
// step = phase + max(optimizer / n, optimizer - backward's share of the phase) (on the host backend only the update's
// NVMe traffic and uploads hide: its arithmetic needs the cores backward computes on).
#include <chunkwise/collective/concepts.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/placement/concepts.hpp>
#include <chunkwise/plan/detail/chunk_trace.hpp>
#include <chunkwise/plan/optimizer_execution.hpp>
#include <chunkwise/plan/plan.hpp>
#include <chunkwise/plan/prediction.hpp>
#include <chunkwise/profile/machine_profile.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>

namespace chunkwise {

namespace detail {

constexpr double seconds(double bytes, double bytes_per_second) noexcept {
  return bytes <= 0 ? 0.0 : bytes / bytes_per_second;
}

/// Average bytes of one parameter element: 4 for an fp32 model, 2 for a bf16 or fp16 one.
constexpr double parameter_bytes_per_element(const model_profile& model) noexcept {
  std::uint64_t elements = 0;
  for (const auto& t : model.tensors) elements += t.elements;
  return static_cast<double>(model.tensor_bytes()) / static_cast<double>(elements);
}

/// Bytes of optimizer state per parameter element: Adam's two fp32 moments, plus an fp32 master copy for 16-bit
/// parameters (mixed precision).
constexpr double state_bytes_per_element(double parameter_bytes_per_element) noexcept {
  return 8.0 + (parameter_bytes_per_element < 4.0 ? 4.0 : 0.0);
}

template <class Space>
inline constexpr bool on_nvme = std::same_as<Space, space::nvme>;

/// Per-rank byte shares of one chunk for each role, and the working buffers, at one chunk size.
struct chunk_shares {
  std::uint64_t chunks = 0;
  byte_count chunk_bytes = 0;    // largest chunk capacity
  byte_count average_bytes = 0;  // average chunk capacity
  byte_count parameter = 0;      // cp
  byte_count gradient = 0;       // cg
  byte_count state = 0;          // co
  byte_count gather_working = 0; // one gathered parameter chunk (0 when parameters are not sharded)
  // cp of the first chunk, of the largest other one, and the others' average: a device cache that keeps a prefix of
  // chunks resident holds those at their sizes and sizes its blocks to the largest streamed chunk
  byte_count first_parameter = 0;
  byte_count rest_parameter = 0;
  byte_count rest_average_parameter = 0;
  byte_count gradient_working = 0;
  // What the model contributes, computed once here rather than in every evaluation of the search:
  double state_bytes_per_element = 0;  // optimizer state bytes per parameter element
  byte_count activation_bytes = 0;     // the profile's peak activation bytes
  double flops = 0;                    // the profile's FLOPs per step
  double backward_flops = 0;           // of which in backward passes
  bool updates_overlap = false;        // model_profile::updates_overlap_backward
};

template <class Collective>
constexpr chunk_shares shares_of(const model_profile& model, const layout_summary& layout, int ranks) {
  chunk_shares s;
  s.chunks = layout.chunk_count;
  s.chunk_bytes = layout.chunk_bytes;
  s.average_bytes = div_ceil(layout.total_bytes, layout.chunk_count);
  const auto n = static_cast<std::size_t>(layout.chunk_count);
  const double parameter_bytes = parameter_bytes_per_element(model);
  s.state_bytes_per_element = state_bytes_per_element(parameter_bytes);
  s.activation_bytes = model.peak_activation_bytes();
  s.flops = static_cast<double>(model.total_flops());
  for (const auto& pass : model.passes)
    if (pass.kind == pass_kind::backward) s.backward_flops += static_cast<double>(pass.flops);
  s.updates_overlap = model.updates_overlap_backward;
  const auto state_chunk = static_cast<byte_count>(static_cast<double>(s.average_bytes) *
                                                   (s.state_bytes_per_element / parameter_bytes));
  s.parameter = div_ceil(Collective::bytes_per_rank(tensor_role::parameter, s.average_bytes, n, ranks), n);
  s.gradient = div_ceil(Collective::bytes_per_rank(tensor_role::gradient, s.average_bytes, n, ranks), n);
  s.state = div_ceil(Collective::bytes_per_rank(tensor_role::optimizer_state, state_chunk, n, ranks), n);
  const auto share = [&](byte_count chunk) {  // cp of a chunk of this capacity, in proportion to the average's
    return s.average_bytes == 0 ? 0 : static_cast<byte_count>(static_cast<double>(chunk) *
                                                              static_cast<double>(s.parameter) /
                                                              static_cast<double>(s.average_bytes));
  };
  s.first_parameter = share(layout.first_chunk_bytes);
  s.rest_parameter = share(layout.rest_chunk_bytes);
  s.rest_average_parameter = n > 1 ? share(div_ceil(layout.total_bytes - layout.first_chunk_bytes, n - 1)) : 0;
  // One rank's shard is the whole chunk: nothing to gather.
  s.gather_working = ranks > 1 ? Collective::working_bytes(tensor_role::parameter, s.chunk_bytes, ranks) : 0;
  const byte_count gradient_working = Collective::working_bytes(tensor_role::gradient, s.chunk_bytes, ranks);
  s.gradient_working = gradient_working > 0 ? gradient_working : s.chunk_bytes;
  return s;
}

}  // namespace detail

/// The buffers an NVMe home's update pipeline keeps a chunk's working block in, from its gradient's reduction to its
/// update (runtime/detail/nvme_update_pipeline.hpp: 3 scratch sets, up to 6 landing buffers): how many of the device
/// cache's copies the updates can take while they trail backward.
inline constexpr std::uint64_t nvme_update_buffers = 9;

/// Memory of `Plan` at `device_blocks` blocks with `offloaded` resident chunks' optimizer states off the device.
template <class Plan>
constexpr memory_use predict_memory(const machine_profile& machine,
                                    const detail::chunk_shares& s, const detail::chunk_trace& trace,
                                    std::uint64_t device_blocks, std::uint64_t offloaded) {
  using placement = typename Plan::placement;
  using execution = typename Plan::optimizer_execution;
  const auto n = static_cast<std::size_t>(s.chunks);
  const auto b = static_cast<std::size_t>(device_blocks);
  const std::uint64_t resident = placement::resident_chunks(n, b);
  const std::uint64_t streamed = s.chunks - resident;
  const byte_count ranks = machine.devices;

  memory_use m;
  m.device_parameters = placement::device_bytes(s.parameter, n, b);
  // Per-chunk shares are the average chunk's. Where chunks differ in size and some stream, the runtime keeps chunks
  // [0, resident) at their own sizes (private_chunks: the embedding's first) and sizes the cache's blocks to the
  // largest streamed chunk (the largest of all when chunk 0 streams too); the resident chunks' gradients and states
  // scale with their sizes, in average chunks `resident_share`, and the streamed ones' with the rest.
  double resident_share = static_cast<double>(resident);
  if constexpr (placement::uses_device_cache) {
    if (streamed > 0 && s.rest_parameter != s.first_parameter) {
      const byte_count kept = resident == 0 ? 0 : s.first_parameter + (resident - 1) * s.rest_average_parameter;
      const byte_count block = resident == 0 ? std::max(s.first_parameter, s.rest_parameter) : s.rest_parameter;
      m.device_parameters = kept + (std::min<std::uint64_t>(b, s.chunks) - resident) * block;
      if (s.parameter > 0) resident_share = static_cast<double>(kept) / static_cast<double>(s.parameter);
    }
  }
  const double streamed_share = static_cast<double>(s.chunks) - resident_share;
  const auto times = [](double count, byte_count bytes) {
    return static_cast<byte_count>(count * static_cast<double>(bytes) + 0.5);
  };
  m.device_working = s.gather_working * (trace.widest_pass + 1) +
                     std::max<std::uint64_t>(2, trace.live_gradients) * s.gradient_working;
  m.device_optimizer = times(resident_share - static_cast<double>(offloaded), s.gradient + s.state);
  m.device_activations = s.activation_bytes;
  m.device = m.device_parameters + m.device_working + m.device_optimizer + m.device_activations;

  // Gradients always pass through host memory on their way to a host-side update; states stay where their space is.
  const bool streamed_states_on_nvme = detail::on_nvme<typename placement::home_space>;
  const bool offloaded_states_on_nvme = detail::on_nvme<typename execution::offload_space>;
  byte_count host = placement::host_bytes(s.parameter, n, b) + times(streamed_share, s.gradient) +
                    offloaded * s.gradient;
  byte_count nvme = placement::nvme_bytes(s.parameter, n, b);
  (streamed_states_on_nvme ? nvme : host) += times(streamed_share, s.state);
  (offloaded_states_on_nvme ? nvme : host) += offloaded * s.state;
  m.host = ranks * host;
  m.nvme = ranks * nvme;
  return m;
}

namespace detail {
/// The block the drive moves per request: each chunk's arrays (its parameters, each of its fp32 states) move whole,
/// one call each.
constexpr byte_count nvme_block_bytes(const chunk_shares& s) {
  return static_cast<byte_count>(s.state_bytes_per_element > 0
                                     ? static_cast<double>(s.state) * 4.0 / s.state_bytes_per_element
                                     : static_cast<double>(s.parameter));
}
}  // namespace detail

/// Step time of `Plan` with the memory above; `fetches` is the cache's count of chunk fetches per step.
template <class Plan>
constexpr time_breakdown predict_time(const machine_profile& machine,
                                      const detail::chunk_shares& s, std::uint64_t device_blocks,
                                      std::uint64_t offloaded, std::uint64_t fetches) {
  using placement = typename Plan::placement;
  using collective = typename Plan::collective;
  using execution = typename Plan::optimizer_execution;
  using detail::seconds;
  const auto n = static_cast<std::size_t>(s.chunks);
  const int ranks = static_cast<int>(job_ranks(machine));
  const std::uint64_t resident = placement::resident_chunks(n, static_cast<std::size_t>(device_blocks));
  const std::uint64_t streamed = s.chunks - resident;
  const bool home_on_nvme = detail::on_nvme<typename placement::home_space>;
  const bool offload_on_nvme = detail::on_nvme<typename execution::offload_space>;

  time_breakdown t;
  t.compute = s.flops / machine.device_flops_per_second;

  // Collectives: bus bytes over the bus bandwidth at this chunk size, plus a fixed cost per call. Over several
  // machines a collective of every rank runs at the slower link (its ring crosses between machines); hybrid<G>'s
  // group collectives stay inside a machine when G divides its ranks (groups are consecutive ranks, as launchers
  // place them), and its cross-group all-reduce of the gradient shards runs between machines.
  const step_traffic traffic = collective::traffic(s.average_bytes, s.average_bytes, n, ranks);
  const double message = static_cast<double>(s.average_bytes);
  const int group = collective::group_size > 0 ? collective::group_size : ranks;  // the ranks of one collective
  const int groups = ranks / group;
  const bool spans_machines = machine.machines > 1;
  const bool group_crosses = spans_machines && (collective::group_size == 0 || machine.devices % group != 0);
  const auto bandwidth = [&](const bandwidth_curve& curve, bool crosses) {
    const double local = curve.at(s.average_bytes);
    return crosses ? std::min(local, machine.inter_machine.at(s.average_bytes)) : local;
  };
  const auto latency = [&](bool crosses) {
    return machine.collective_latency_seconds + (crosses ? machine.inter_machine_latency_seconds : 0.0);
  };
  const auto calls = [&](byte_count bytes, double per_call) { return per_call > 0 ? static_cast<double>(bytes) / per_call : 0.0; };
  const double ring_gather = group > 1 ? message * (group - 1) / group : 0.0;
  const double shard = message / group;
  const double cross_all_reduce = groups > 1 ? 2 * shard * (groups - 1) / groups : 0.0;
  const double gather_bandwidth = bandwidth(machine.all_gather, group_crosses);
  t.collective = seconds(static_cast<double>(traffic.all_gather), gather_bandwidth) +
                 seconds(static_cast<double>(traffic.reduce_scatter),
                         bandwidth(machine.reduce_scatter, group_crosses)) +
                 seconds(static_cast<double>(traffic.all_reduce), bandwidth(machine.all_reduce, group_crosses)) +
                 seconds(static_cast<double>(traffic.cross_group_all_reduce),
                         bandwidth(machine.all_reduce, spans_machines)) +
                 latency(group_crosses) * (calls(traffic.all_gather, ring_gather) +
                                           calls(traffic.reduce_scatter, ring_gather) +
                                           calls(traffic.all_reduce, 2 * ring_gather)) +
                 latency(spans_machines) * calls(traffic.cross_group_all_reduce, cross_all_reduce);

  // The drive's rates for this plan's blocks: a small block keeps fewer requests in flight.
  const byte_count nvme_block = detail::nvme_block_bytes(s);
  const double nvme_read = nvme_read_rate(machine, nvme_block);
  const double nvme_write = nvme_write_rate(machine, nvme_block);

  // Moves in forward and backward.
  const double fetch_bytes = static_cast<double>(fetches * s.parameter);
  const double gradient_down = static_cast<double>((streamed + offloaded) * s.gradient);
  t.host_to_device = seconds(fetch_bytes, machine.host_to_device_bytes_per_second);
  t.device_to_host = seconds(gradient_down, machine.device_to_host_bytes_per_second);
  const double nvme_fetch = home_on_nvme ? seconds(fetch_bytes, nvme_read) : 0.0;
  // Nothing hides the first fetch of a step (and its NVMe read), nor the first gather.
  const double first_fetch = streamed > 0 ? seconds(static_cast<double>(s.parameter), machine.host_to_device_bytes_per_second) +
                                                (home_on_nvme ? seconds(static_cast<double>(s.parameter), nvme_read) : 0.0)
                                          : 0.0;
  const double first_gather = traffic.all_gather > 0 ? seconds(ring_gather, gather_bandwidth) : 0.0;
  // The update's NVMe traffic (per rank): states of streamed chunks with NVMe homes and offloaded states on NVMe.
  const double state_bytes_on_nvme = static_cast<double>(s.state) *
                                     static_cast<double>((home_on_nvme ? streamed : 0) + (offload_on_nvme ? offloaded : 0));
  const double parameter_writes_to_nvme = home_on_nvme ? static_cast<double>(streamed * s.parameter) : 0.0;
  // On the host backend the "device" is the CPU: the collectives' copies and waits and the host-device copies run
  // on the cores the passes compute on (every core is computing), so they add to compute rather than hide behind it
  // (measured at 2 thread ranks on 2 cores: per_tensor/sharded's 84 collectives a step cost 3.8 ms beside 9.6 ms of
  // compute while thread_comm's waits slept at once; they poll first now, 5-12 us a call). NVMe transfers are the
  // drive's DMA and overlap, but their CPU time (the kernel's, the I/O thread's) does not: it is taken from a core,
  // and a parallel loop waits for its slowest thread, so the whole of it counts.
  const bool shared_cores = machine.kind == device_kind::host;
  const auto phase_moving = [&](double nvme_bytes) {
    const double moves = shared_cores ? t.compute + t.collective + t.host_to_device + t.device_to_host +
                                            nvme_bytes * machine.nvme_cpu_seconds_per_byte
                                      : 0.0;
    return shared_cores ? std::max(moves, nvme_fetch + first_fetch)
                        : std::max({t.compute, t.collective, t.host_to_device, t.device_to_host, nvme_fetch}) +
                              first_fetch + first_gather;
  };
  const double nvme_bytes_but_parameter_reads =
      (home_on_nvme ? fetch_bytes : 0.0) + 2 * state_bytes_on_nvme + parameter_writes_to_nvme;
  const double backward_share = s.flops > 0 ? s.backward_flops / s.flops : 0.0;
  // The drive's time during backward that backward's own fetches leave to the updates beside it.
  const auto drive_beside_backward = [&](double phase) {
    return std::max(0.0, phase * backward_share - nvme_fetch * backward_share);
  };
  // An fp32 update needs the chunk's parameters (its master weights); a 16-bit one rewrites its working copy from
  // the fp32 master in the states. The runtime hands the update the device cache's copy, fetched for backward,
  // rather than read the drive again, where one of its nvme_update_buffers (scratch sets and landing buffers) is
  // free for it when the gradient is reduced. Deferred to step(): the chunks the cache still holds, at most its
  // blocks. Beside backward: every chunk while the updates keep up with backward (a chunk's update I/O within the
  // drive time its share of backward leaves); where they trail it, the reduced chunks queue, the buffers are full
  // after buffers / (1 - keep) chunks, and from then on a `keep` share of the chunks finds one free. (GPT-2 1.5B on
  // this 2-core VM, where the drive bounds backward and the updates: 20% measured, 47% predicted; 4x512: 75%, 92%.)
  std::uint64_t handed_over = std::min(streamed, device_blocks);
  if (s.updates_overlap && streamed > 0) {
    const double update_io = seconds(static_cast<double>(s.state * ranks), nvme_read) +
                             seconds(static_cast<double>((s.state + s.parameter) * ranks),
                                     nvme_write);
    const double drive_per_chunk =
        drive_beside_backward(phase_moving(nvme_bytes_but_parameter_reads)) / static_cast<double>(n);
    const double keep = update_io > 0 ? std::min(1.0, drive_per_chunk / update_io) : 1.0;
    const double chunks = static_cast<double>(streamed);
    double handed = chunks;
    if (keep < 1.0) {
      const double filled = static_cast<double>(nvme_update_buffers) / (1.0 - keep);
      if (filled < chunks) handed = filled + (chunks - filled) * keep;
    }
    handed_over = static_cast<std::uint64_t>(handed + 0.5);
  }
  const double parameter_reads_from_nvme =
      home_on_nvme && s.state_bytes_per_element == 8.0 ? static_cast<double>((streamed - handed_over) * s.parameter)
                                                       : 0.0;
  const double phase = phase_moving(nvme_bytes_but_parameter_reads + parameter_reads_from_nvme);

  // The update: device kernel for resident chunks with states on device; host kernel for the rest, its cores shared
  // by every rank of the machine; NVMe streams states (and streamed parameters) in and out concurrently.
  // On the host backend device and host updates share the same cores, every rank's included, so they add up
  // instead of overlapping.
  const double elements_per_chunk = static_cast<double>(s.state) / s.state_bytes_per_element;
  const double device_update = elements_per_chunk * static_cast<double>(resident - offloaded) *
                               (shared_cores ? ranks : 1) / machine.device_optimizer_params_per_second;
  const double host_update = elements_per_chunk * static_cast<double>(streamed + offloaded) * ranks /
                             machine.host_optimizer_params_per_second;
  const double nvme_states =
      seconds((state_bytes_on_nvme + parameter_reads_from_nvme) * ranks, nvme_read) +
      seconds((state_bytes_on_nvme + parameter_writes_to_nvme) * ranks, nvme_write);
  const double upload = seconds(static_cast<double>(offloaded * s.parameter), machine.host_to_device_bytes_per_second);
  t.optimizer = shared_cores ? device_update + host_update : std::max(device_update, host_update);
  // the last offloaded chunk's parameters go up after its update: nothing hides that one
  const double last_upload =
      offloaded > 0 ? seconds(static_cast<double>(s.parameter), machine.host_to_device_bytes_per_second) : 0.0;
  double update = std::max({t.optimizer, nvme_states, upload}) + last_upload;
  // Updates beside backward: each chunk's starts once its gradient is reduced, so backward's time hides the update
  // but for the last chunk's share, which starts when backward ends. The drive is one: backward's own fetches from
  // NVMe take their share of it first. Where the cores are shared, the update's arithmetic takes the cores backward
  // computes on (measured, GPT-2 12x768 on 2 cores: the passes 770 ms, the step 840), so only its NVMe traffic and
  // uploads hide.
  if (s.updates_overlap && n > 0) {
    const double hidden = nvme_states > 0 ? drive_beside_backward(phase) : phase * backward_share;
    const double chunks = static_cast<double>(n);
    if (shared_cores) {
      const double update_traffic = std::max(nvme_states, upload);
      update = std::max({t.optimizer, update_traffic - hidden, update_traffic / chunks}) + last_upload;
    } else {
      update = std::max(update / chunks, update - hidden);
    }
  }

  t.nvme = nvme_fetch + nvme_states;
  t.host_to_device += upload;
  t.collective_exposed = shared_cores ? t.collective : std::max(0.0, t.collective - t.compute) + first_gather;
  t.host_to_device_exposed =
      shared_cores ? t.host_to_device - upload : std::max(0.0, t.host_to_device - upload - t.compute) + first_fetch;
  t.device_to_host_exposed = shared_cores ? t.device_to_host : std::max(0.0, t.device_to_host - t.compute);
  t.nvme_exposed = std::max(0.0, nvme_fetch - t.compute);
  t.step = phase + update;
  return t;
}

}  // namespace chunkwise
