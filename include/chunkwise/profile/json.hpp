#pragma once
// model_profile <-> JSON. The format (version 1):
//   { "format": "chunkwise.model_profile", "version": 1, "name": "gpt2-124m",
//     "tensors": [ { "name": "wte", "elements": 38597376, "dtype": "fp32", "role": "parameter", "tied": true }, ... ],
//     "passes":  [ { "label": "h.0", "kind": "forward", "tensors": [2, 3, ...], "activation_bytes": 123,
//                  "flops": 456 }, ... ] }
// A pass is one layer's forward or backward. "role" defaults to "parameter", "tied" to false, a pass's "flops" to 0
// (unknown). Loading validates field types (errors name the field's path) and then the profile itself (validate()).
// Files written before the rename name the array "steps"; the loader reads them too (errors then name the key the
// file holds: "f.json.steps[2].tensors[0]"), and saving always writes "passes".
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/profile/detail/json_fields.hpp>
#include <chunkwise/profile/model_profile.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace chunkwise {

inline constexpr std::string_view model_profile_format = "chunkwise.model_profile";
inline constexpr std::uint64_t model_profile_version = 1;

inline nlohmann::json to_json(const model_profile& model) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : model.tensors)
    tensors.push_back({{"name", t.name.str()},
                       {"elements", t.elements},
                       {"dtype", std::string(to_string(t.type))},
                       {"role", std::string(to_string(t.role))},
                       {"tied", t.tied}});
  nlohmann::json passes = nlohmann::json::array();
  for (const auto& s : model.passes)
    passes.push_back({{"label", s.label.str()},
                     {"kind", std::string(to_string(s.kind))},
                     {"tensors", s.tensors},
                     {"activation_bytes", s.activation_bytes},
                     {"flops", s.flops}});
  return {{"format", model_profile_format}, {"version", model_profile_version}, {"name", model.name.str()},
          {"tensors", std::move(tensors)},  {"passes", std::move(passes)}};
}

/// Reads a profile from parsed JSON; `path` names the document in error messages ("profile", a file name).
inline model_profile model_profile_from_json(const nlohmann::json& document, const std::string& path = "profile") {
  using namespace detail;
  const std::string format = json_string(json_field(document, "format", path), path + ".format");
  if (format != model_profile_format)
    raise_field(path + ".format", "expected \"" + std::string(model_profile_format) + "\", found \"" + format + "\"");
  const std::uint64_t version = json_unsigned(json_field(document, "version", path), path + ".version");
  if (version != model_profile_version)
    raise_field(path + ".version", "version " + std::to_string(version) + " is not supported; this build reads " +
                                       std::to_string(model_profile_version));
  model_profile model;
  model.name = json_name(json_field(document, "name", path), path + ".name");

  const auto& tensors = json_array(json_field(document, "tensors", path), path + ".tensors");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string at = path + ".tensors[" + std::to_string(i) + "]";
    const auto& entry = tensors[i];
    tensor_spec spec;
    spec.name = json_name(json_field(entry, "name", at), at + ".name");
    spec.elements = json_unsigned(json_field(entry, "elements", at), at + ".elements");
    const std::string type = json_string(json_field(entry, "dtype", at), at + ".dtype");
    if (!parse_dtype(type, spec.type))
      raise_field(at + ".dtype", "unknown dtype \"" + type + "\"; use fp32, fp16, bf16, fp64, int32, int64 or uint8");
    if (entry.contains("role")) {
      const std::string role = json_string(entry["role"], at + ".role");
      if (!parse_tensor_role(role, spec.role))
        raise_field(at + ".role", "unknown role \"" + role + "\"; use parameter, gradient or optimizer_state");
    }
    if (entry.contains("tied")) spec.tied = json_bool(entry["tied"], at + ".tied");
    model.tensors.push_back(spec);
  }

  // "steps" is the key of files written before the rename; a document holding both is ambiguous.
  const bool old_key = !document.contains("passes") && document.contains("steps");
  if (document.contains("passes") && document.contains("steps"))
    raise_field(path + ".steps", "found both \"passes\" and its old name \"steps\"; keep only \"passes\"");
  const std::string passes_key = old_key ? "steps" : "passes";
  const auto& passes = json_array(json_field(document, passes_key, path), path + "." + passes_key);
  for (std::size_t i = 0; i < passes.size(); ++i) {
    const std::string at = path + "." + passes_key + "[" + std::to_string(i) + "]";
    const auto& entry = passes[i];
    profile_pass pass;
    pass.label = json_name(json_field(entry, "label", at), at + ".label");
    const std::string kind = json_string(json_field(entry, "kind", at), at + ".kind");
    if (kind == "forward") pass.kind = pass_kind::forward;
    else if (kind == "backward") pass.kind = pass_kind::backward;
    else raise_field(at + ".kind", "expected \"forward\" or \"backward\", found \"" + kind + "\"");
    const auto& indices = json_array(json_field(entry, "tensors", at), at + ".tensors");
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const std::string index_at = at + ".tensors[" + std::to_string(k) + "]";
      const std::uint64_t index = json_unsigned(indices[k], index_at);
      if (index >= model.tensors.size())
        raise_field(index_at, "tensor index " + std::to_string(index) + " is out of range; the profile has " +
                                  std::to_string(model.tensors.size()) + " tensors");
      pass.tensors.push_back(static_cast<std::uint32_t>(index));
    }
    pass.activation_bytes = json_unsigned(json_field(entry, "activation_bytes", at), at + ".activation_bytes");
    if (entry.contains("flops")) pass.flops = json_unsigned(entry["flops"], at + ".flops");
    model.passes.push_back(std::move(pass));
  }
  validate(model);
  return model;
}

inline model_profile load_model_profile(const std::filesystem::path& file) {
  return model_profile_from_json(detail::parse_json_file(file), file.string());
}

inline void save_model_profile(const model_profile& model, const std::filesystem::path& file) {
  write_file_atomically(file, to_json(model).dump(1) + "\n");
}

}  // namespace chunkwise
