#pragma once
// per_tensor: one chunk per tensor, sized to it (rounded up to ranks * alignment): per-parameter sharding as
// PyTorch FSDP1 and DeepSpeed ZeRO-3 do it. Many small collectives, little waste.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/layout/concepts.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <string_view>

namespace chunkwise::layout {

struct per_tensor {
  static constexpr std::string_view name = "per_tensor";

  static constexpr chunk_map build(const model_profile& model, const layout_options& options) {
    validate(model);
    validate(options);
    chunk_map map{options, {}, {}};
    map.chunks.reserve(model.tensors.size());
    map.locations.reserve(model.tensors.size());
    for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
      const auto& t = model.tensors[i];
      map.chunks.push_back(chunk{round_up(t.bytes(), options.granule()), {chunk_slot{i, 0, t.bytes()}}, t.tied});
      map.locations.push_back(tensor_location{i, 0});
    }
    return map;
  }
  static constexpr layout_summary summarize(const model_profile& model, const layout_options& options) {
    return build(model, options).summary();
  }
};

static_assert(chunk_layout<per_tensor>);

}  // namespace chunkwise::layout
