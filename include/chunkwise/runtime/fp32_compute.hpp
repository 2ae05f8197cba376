#pragma once
// fp32_compute<Runtime>: lets a CPU trainer that computes in fp32 train a model whose chunks hold bf16 or fp16
// parameters and gradients (mixed precision: what moves, is gathered, reduced and cached is 16-bit; the master
// weights and Adam states are fp32 where the states live). parameter(t) gives an fp32 copy of tensor t's working
// parameters; gradient(t) a zeroed fp32 buffer, which flush() adds into the 16-bit accumulator, multiplied by the
// runtime's loss scale and rounded once, when the pass's compute is done and before the runtime releases it (on the
// optimizer kernels' SIMD paths, optim/convert.hpp). In fp32 both hand out the runtime's own memory and flush() does
// nothing.
//
// Scaling at the flush rather than the loss: with a power-of-two scale the product is the same bits as scaling the
// loss in fp32 compute, and the scale does its job where fp16 can overflow or underflow: in the accumulators and the
// reduction.
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/optim/convert.hpp>

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
      if constexpr (std::is_same_v<T, float>) return rt_->parameter(t).data();
      else {
        const auto working = rt_->template parameter<T>(t);
        params_[t].resize(working.size());
        optim::widen<T>(working, params_[t]);
        return params_[t].data();
      }
    });
  }
  /// An fp32 buffer for tensor t's gradient in this pass (the accumulator itself in fp32).
  float* gradient(std::uint32_t t) {
    return visit_element(rt_->element_type(), "fp32_compute", [&]<class T>(T) -> float* {
      if constexpr (std::is_same_v<T, float>) return rt_->gradient(t).data();
      else {
        grads_[t].assign(rt_->template gradient<T>(t).size(), 0.0f);
        written_.push_back(t);
        return grads_[t].data();
      }
    });
  }
  /// Adds this pass's fp32 gradients into the 16-bit accumulators (times the loss scale). Call before release.
  void flush() {
    visit_element(rt_->element_type(), "fp32_compute", [&]<class T>(T) {
      if constexpr (!std::is_same_v<T, float>) {
        const float scale = rt_->loss_scale();
        for (const auto t : written_) optim::accumulate_scaled<T>(rt_->template gradient<T>(t), grads_[t], scale);
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
  Runtime* rt_;
  std::vector<std::vector<float>> params_, grads_;
  std::vector<std::uint32_t> written_;  // tensors whose gradients this pass wrote
};

}  // namespace chunkwise
