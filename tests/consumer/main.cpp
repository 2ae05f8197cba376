// Uses the layout search on GPT-2 124M; prints the result so the driver can check it ran.
#include <chunkwise/chunkwise.hpp>

#include <cstdio>

int main() {
  using namespace chunkwise;
  const auto model = gpt2_profile(gpt2_124m);
  const auto map = layout::min_waste<>::build(model, {.ranks = 2});
  std::printf("consumer ok: %zu chunks of %s\n", map.chunks.size(), format_bytes(map.summary().chunk_bytes).c_str());
  return map.chunks.empty() ? 1 : 0;
}
