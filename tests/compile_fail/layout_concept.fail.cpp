// expect: chunk_layout
// A type that lacks summarize() is not a chunk layout: a constrained use names the concept in the diagnostic.
#include <chunkwise/layout.hpp>

struct half_a_layout {
  static constexpr std::string_view name = "half";
  static chunkwise::chunk_map build(const chunkwise::model_profile&, const chunkwise::layout_options&) { return {}; }
};

template <chunkwise::chunk_layout Layout>
constexpr auto layout_name() { return Layout::name; }

int main() { return static_cast<int>(layout_name<half_a_layout>().size()); }
