// expect: placement_policy
// A type that is not a placement policy (no byte counts) is rejected at the seam by the concept.
#include <chunkwise/placement/concepts.hpp>

struct not_a_policy {
  using home_space = chunkwise::space::host;
};

template <chunkwise::placement_policy Policy>
constexpr chunkwise::byte_count device_bytes() {
  return Policy::device_bytes(1, 1, 1);
}

int main() { return static_cast<int>(device_bytes<not_a_policy>()); }
