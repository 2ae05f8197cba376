#pragma once
// What a trainer registers: a named tensor with an element count, a dtype and a role.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/dtype.hpp>
#include <chunkwise/core/error.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace chunkwise {

/// A tensor's name in a literal type (no heap), so profiles can be built and searched in constant expressions
/// on every compiler we support. 95 characters hold the names PyTorch models use
/// ("model.layers.31.self_attn.q_proj.weight" is 39).
class tensor_name {
 public:
  static constexpr std::size_t capacity = 95;

  constexpr tensor_name() = default;
  constexpr tensor_name(std::string_view text) {  // NOLINT: implicit on purpose, names are written as literals
    if (text.size() > capacity)
      detail::raise(error_code::invalid_argument, "tensor name '" + std::string(text) + "' has " +
                                                      std::to_string(text.size()) + " characters; at most " +
                                                      std::to_string(capacity) + " fit");
    std::copy(text.begin(), text.end(), chars_.begin());
    length_ = static_cast<std::uint8_t>(text.size());
  }
  constexpr tensor_name(const char* text) : tensor_name(std::string_view(text)) {}
  tensor_name(const std::string& text) : tensor_name(std::string_view(text)) {}  // NOLINT: as above

  [[nodiscard]] constexpr std::string_view view() const noexcept { return {chars_.data(), length_}; }
  [[nodiscard]] std::string str() const { return std::string(view()); }
  [[nodiscard]] constexpr bool empty() const noexcept { return length_ == 0; }
  constexpr bool operator==(const tensor_name& other) const noexcept { return view() == other.view(); }

 private:
  std::array<char, capacity> chars_{};
  std::uint8_t length_ = 0;
};

enum class tensor_role : std::uint8_t { parameter, gradient, optimizer_state };

constexpr std::string_view to_string(tensor_role role) noexcept {
  switch (role) {
    case tensor_role::parameter: return "parameter";
    case tensor_role::gradient: return "gradient";
    case tensor_role::optimizer_state: return "optimizer_state";
  }
  return "?";
}

constexpr bool parse_tensor_role(std::string_view name, tensor_role& out) noexcept {
  for (auto role : {tensor_role::parameter, tensor_role::gradient, tensor_role::optimizer_state})
    if (to_string(role) == name) {
      out = role;
      return true;
    }
  return false;
}

struct tensor_spec {
  tensor_name name;
  std::uint64_t elements = 0;
  dtype type = dtype::fp32;
  tensor_role role = tensor_role::parameter;
  /// Shared by several layers (GPT-2's token embedding is also its LM head): used far apart in the pass order,
  /// so layouts give it a chunk of its own instead of pinning its neighbours.
  bool tied = false;

  [[nodiscard]] constexpr byte_count bytes() const noexcept { return elements * size_of(type); }
};

}  // namespace chunkwise
