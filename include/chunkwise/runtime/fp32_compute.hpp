#pragma once
// fp32_compute<Runtime>: lets a CPU trainer that computes in fp32 train a model whose chunks hold bf16 or fp16
// parameters and gradients (mixed precision: what moves, is gathered, reduced and cached is 16-bit; the master
// weights and Adam states are fp32 where the states live). parameter(t) gives an fp32 copy of tensor t's working
// parameters; gradient(t) a zeroed fp32 buffer, which flush() adds into the 16-bit accumulator, multiplied by the
// runtime's loss scale and rounded once, when the pass's compute is done and before the runtime releases it (on the
// optimizer kernels' SIMD paths, optim/convert.hpp). In fp32 both hand out the runtime's own memory and flush() does
// nothing. On a device the host cannot address (Runtime::chunks_on_host false) the same goes through host copies:
// parameters are copied down, fp32 gradients are the accumulator's values copied down and written back at flush(),
// 16-bit ones are added into the accumulator's copied values and written back; the bits are the host backend's.
//
// Scaling at the flush rather than the loss: with a power-of-two scale the product is the same bits as scaling the
// loss in fp32 compute, and the scale does its job where fp16 can overflow or underflow: in the accumulators and the
// reduction.
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/optim/convert.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <span>
#include <type_traits>
#include <vector>

namespace chunkwise {

template <class Runtime>
class fp32_compute {
 public:
  explicit fp32_compute(Runtime& rt)
      : rt_(&rt), params_(rt.layout().locations.size()), grads_(rt.layout().locations.size()) {}

  /// Tensor t's working parameters as fp32 (valid until the next parameter(t) call).
  float* parameter(std::uint32_t t) {
    return visit_element(rt_->element_type(), "fp32_compute", [&]<class T>(T) -> float* {
      const auto working = rt_->template parameter<T>(t);
      if constexpr (std::is_same_v<T, float>) {
        if constexpr (Runtime::chunks_on_host) return working.data();
        params_[t].resize(working.size());
        rt_->copy_to_host(std::span<float>(params_[t]), std::span<const float>(working));
      } else {
        params_[t].resize(working.size());
        if constexpr (Runtime::chunks_on_host) optim::widen<T>(working, params_[t]);
        else optim::widen<T>(host_copy(working), params_[t]);
      }
      return params_[t].data();
    });
  }
  /// An fp32 buffer for tensor t's gradient in this pass (the accumulator itself in fp32); the same buffer when
  /// asked again before the flush.
  float* gradient(std::uint32_t t) {
    return visit_element(rt_->element_type(), "fp32_compute", [&]<class T>(T) -> float* {
      const auto accumulator = rt_->template gradient<T>(t);
      if (std::find(written_.begin(), written_.end(), t) != written_.end()) return grads_[t].data();
      if constexpr (std::is_same_v<T, float>) {
        if constexpr (Runtime::chunks_on_host) return accumulator.data();
        grads_[t].resize(accumulator.size());
        rt_->copy_to_host(std::span<float>(grads_[t]), std::span<const float>(accumulator));
      } else {
        grads_[t].assign(accumulator.size(), 0.0f);
      }
      written_.push_back(t);
      return grads_[t].data();
    });
  }
  /// Adds this pass's fp32 gradients into the 16-bit accumulators (times the loss scale), or writes the fp32 ones
  /// back to a device the host cannot address. Call before release.
  void flush() {
    visit_element(rt_->element_type(), "fp32_compute", [&]<class T>(T) {
      for (const auto t : written_) {
        const auto accumulator = rt_->template gradient<T>(t);
        if constexpr (std::is_same_v<T, float>) {
          rt_->copy_to_device(accumulator, std::span<const float>(grads_[t]));
        } else if constexpr (Runtime::chunks_on_host) {
          optim::accumulate_scaled<T>(accumulator, grads_[t], rt_->loss_scale());
        } else {
          auto sum = host_copy(accumulator);
          optim::accumulate_scaled<T>(std::span<T>(sum), grads_[t], rt_->loss_scale());
          rt_->copy_to_device(accumulator, std::span<const T>(sum));
        }
      }
    });
    written_.clear();
  }

  /// Calls flush() at the end of its scope, unless an exception is unwinding (a pass that failed midway has
  /// incomplete gradients): `auto flushing = compute.flush_at_exit();` once the pass is acquired.
  class flush_guard {
   public:
    explicit flush_guard(fp32_compute& owner) : owner_(owner) {}
    flush_guard(const flush_guard&) = delete;
    flush_guard& operator=(const flush_guard&) = delete;
    ~flush_guard() noexcept(false) {
      if (std::uncaught_exceptions() == unwinding_) owner_.flush();
    }

   private:
    fp32_compute& owner_;
    int unwinding_ = std::uncaught_exceptions();
  };
  [[nodiscard]] flush_guard flush_at_exit() { return flush_guard(*this); }

 private:
  // A device span's values, copied to the host.
  template <class T>
  std::vector<T> host_copy(std::span<T> device) {
    std::vector<T> copy(device.size());
    rt_->copy_to_host(std::span<T>(copy), std::span<const T>(device));
    return copy;
  }

  Runtime* rt_;
  std::vector<std::vector<float>> params_, grads_;
  std::vector<std::uint32_t> written_;  // tensors whose gradients this pass wrote
};

}  // namespace chunkwise
