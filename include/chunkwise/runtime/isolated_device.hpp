#pragma once
// backend_parts<isolated_backend>: the runtime on a device whose memory the host cannot address, on a machine without
// a GPU (tier/isolated_device.hpp). Its device optimizer is the SIMD CPU Adam on the aliases of the arrays (this
// device's "kernel"): the same bits as the host backend's. A runtime test on it shows that the runtime moves device
// memory only through backend_parts<Backend>, as the CUDA device tier requires; a trainer can check itself the same
// way. Slower than the host backend (a mapping per block, copies where it computes in place).
#include <chunkwise/optim/cpu_adam.hpp>
#include <chunkwise/runtime/backend_parts.hpp>
#include <chunkwise/tier/isolated_device.hpp>

#include <span>
#include <vector>

namespace chunkwise {

/// The SIMD CPU Adam on the aliases of the arrays it is given (this device's "kernel"): the same bits as on the host.
class isolated_adam {
 public:
  using config_type = optim::adam_config;
  static constexpr std::size_t state_arrays = 2;

  isolated_adam(const optim::adam_config& config, const optim::cpu_options& options) : adam_(config, options) {}
  [[nodiscard]] const optim::adam_config& config() const noexcept { return adam_.config(); }
  // After the device's default stream, as cuda_adam's kernels queue behind the trainer's on the legacy stream.
  void step(std::span<const optim::chunk_arrays> chunks, const optim::step_args& args) {
    isolated_default_stream::wait_idle();
    adam_.step(aliases(chunks), args);
  }
  double grad_sum_of_squares(std::span<const optim::chunk_arrays> chunks) {
    isolated_default_stream::wait_idle();
    return adam_.grad_sum_of_squares(aliases(chunks));
  }

 private:
  static std::vector<optim::chunk_arrays> aliases(std::span<const optim::chunk_arrays> chunks) {
    std::vector<optim::chunk_arrays> out(chunks.begin(), chunks.end());
    const auto alias = [](auto* p) { return p == nullptr ? p : static_cast<decltype(p)>(host_alias(p)); };
    for (auto& c : out) {
      c.master = alias(c.master);
      c.grad = alias(c.grad);
      c.moment1 = alias(c.moment1);
      c.moment2 = alias(c.moment2);
      c.working = alias(c.working);
    }
    return out;
  }
  optim::cpu_adam adam_;
};
static_assert(optim::chunk_optimizer<isolated_adam>);

template <>
struct backend_parts<isolated_backend> {
  using device_tier = isolated_device_tier;
  using device_optimizer = isolated_adam;
  using pinned_tier = isolated_pinned_tier;
  static constexpr bool device_is_host_memory = false;
  static device_optimizer make_optimizer(isolated_backend& /*backend*/, const optim::adam_config& config,
                                         unsigned threads) {
    return device_optimizer(config, {.threads = threads});
  }
};

}  // namespace chunkwise
