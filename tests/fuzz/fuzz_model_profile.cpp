// libFuzzer target: bytes -> JSON -> model_profile_from_json. Every input must either load or throw
// chunkwise::error; a loaded profile must pass validate() and survive to_json -> text -> load unchanged.
#include "fuzz_support.hpp"

#include <chunkwise/profile/json.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace {

using chunkwise::fuzz::fail;

void check_equal(const chunkwise::model_profile& a, const chunkwise::model_profile& b) {
  CHUNKWISE_FUZZ_CHECK(a.name == b.name, "name differs after the round trip");
  CHUNKWISE_FUZZ_CHECK(a.tensors.size() == b.tensors.size(), "tensor count differs after the round trip");
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    CHUNKWISE_FUZZ_CHECK(x.name == y.name && x.elements == y.elements && x.type == y.type && x.role == y.role &&
                             x.tied == y.tied,
                         "tensor #" + std::to_string(i) + " differs after the round trip");
  }
  CHUNKWISE_FUZZ_CHECK(a.passes.size() == b.passes.size(), "pass count differs after the round trip");
  for (std::size_t i = 0; i < a.passes.size(); ++i) {
    const auto& x = a.passes[i];
    const auto& y = b.passes[i];
    CHUNKWISE_FUZZ_CHECK(x.label == y.label && x.kind == y.kind && x.tensors == y.tensors &&
                             x.activation_bytes == y.activation_bytes && x.flops == y.flops,
                         "pass #" + std::to_string(i) + " differs after the round trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chunkwise;
  const auto document = fuzz::parse({reinterpret_cast<const char*>(data), size});
  if (!document) return 0;

  model_profile model;
  if (!fuzz::accepted([&] { model = model_profile_from_json(*document); }, "model_profile_from_json")) return 0;

  if (!fuzz::accepted([&] { validate(model); }, "validate"))
    fail("a loaded model profile does not pass validate()");
  // What consumers compute from a valid profile must not overflow: the byte total covers every tensor.
  CHUNKWISE_FUZZ_CHECK(model.tensor_bytes() >= model.largest_tensor_bytes(), "tensor byte total overflows");
  for (const auto& t : model.tensors)
    CHUNKWISE_FUZZ_CHECK(t.bytes() / size_of(t.type) == t.elements, "tensor '" + t.name.str() + "' bytes overflow");

  // Round trip through text, as save_model_profile / load_model_profile do.
  std::string text;
  if (!fuzz::accepted([&] { text = to_json(model).dump(1); }, "to_json"))
    fail("to_json of a loaded profile threw");
  const auto reparsed = fuzz::parse(text);
  if (!reparsed) fail("to_json wrote text that does not parse: " + text.substr(0, 200));
  model_profile again;
  if (!fuzz::accepted([&] { again = model_profile_from_json(*reparsed); }, "reload"))
    fail("a saved profile does not load again");
  check_equal(model, again);

  // sort_by_first_use keeps a valid profile valid and keeps every tensor.
  model_profile sorted;
  if (!fuzz::accepted([&] { sorted = sort_by_first_use(model); validate(sorted); }, "sort_by_first_use"))
    fail("sort_by_first_use made a valid profile invalid");
  CHUNKWISE_FUZZ_CHECK(sorted.tensors.size() == model.tensors.size() && sorted.tensor_bytes() == model.tensor_bytes(),
                       "sort_by_first_use lost tensors");
  return 0;
}
