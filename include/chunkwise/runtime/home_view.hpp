#pragma once
// home_view: one chunk's state at its home, as the home storage lends it to the optimizer, checkpoints and
// initialisation:
//   working   this rank's home parameters in the compute type (fp32, bf16 or fp16): what the device copy, the cache
//             and the gathers carry, and what the trainer reads;
//   master    the fp32 master weights of the owned elements, which the optimizer updates;
//   moment1, moment2   Adam's moments of the owned elements (fp32).
// In fp32 the master weights are the owned part of the working parameters (one array, nothing is copied). In bf16
// and fp16 they are a separate fp32 array that lives with the moments, and each update rewrites the working copy
// from them in the same pass, rounded to nearest even (optim::chunk_arrays::working).
#include <chunkwise/core/dtype.hpp>

#include <algorithm>
#include <cstddef>
#include <span>

namespace chunkwise {

struct home_view {
  std::byte* working = nullptr;
  std::size_t working_elements = 0;
  dtype type = dtype::fp32;
  std::size_t owned_offset = 0;  // where the owned elements start in the working parameters
  std::span<float> master, moment1, moment2;

  /// The view of a chunk's arrays: `master` is used in bf16/fp16 only; in fp32 the master weights are the owned part
  /// of `working` (the one place this aliasing is decided).
  static home_view of(std::byte* working, std::size_t working_elements, dtype type, std::size_t owned_offset,
                      float* master, float* moment1, float* moment2, std::size_t state_elements) noexcept {
    home_view v{working, working_elements, type, owned_offset, {}, {moment1, state_elements},
                {moment2, state_elements}};
    v.master = {v.separate_master() ? master : reinterpret_cast<float*>(working) + owned_offset, state_elements};
    return v;
  }

  [[nodiscard]] bool separate_master() const noexcept { return type != dtype::fp32; }
  template <class T>
  [[nodiscard]] std::span<T> working_as() const noexcept {
    return {reinterpret_cast<T*>(working), working_elements};
  }
  /// The owned part of the working copy, which the optimizer rewrites from the master weights (null in fp32, where
  /// the master weights are the working parameters).
  [[nodiscard]] void* owned_working() const noexcept {
    return separate_master() ? working + owned_offset * size_of(type) : nullptr;
  }

  /// Sets the parameters from fp32 values of the whole home range: master weights exactly, the working copy rounded.
  void assign(std::span<const float> home_values) const {
    visit_element(type, "home_view", [&]<class T>(T) {
      const auto out = working_as<T>();
      std::transform(home_values.begin(), home_values.end(), out.begin(), [](float v) { return from_float<T>(v); });
    });
    if (separate_master())
      std::copy_n(home_values.begin() + static_cast<std::ptrdiff_t>(owned_offset), master.size(), master.begin());
  }
  /// The working parameters as fp32 (what the trainer computes with).
  void working_to(std::span<float> out) const {
    visit_element(type, "home_view", [&]<class T>(T) {
      const auto in = working_as<T>();
      std::transform(in.begin(), in.end(), out.begin(), [](T v) { return to_float(v); });
    });
  }
};

}  // namespace chunkwise
