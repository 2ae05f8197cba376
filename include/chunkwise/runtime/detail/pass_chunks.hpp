#pragma once
// The chunks each profiled pass touches (runtime/detail/assembly.hpp's chunks_by_pass builds them), and the one
// question the runtime's parts ask of them.
#include <chunkwise/core/abi.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace chunkwise::detail::inline CHUNKWISE_ABI {

/// pass_chunks[pass]: the chunks the pass touches, in first-touch order.
using pass_chunk_lists = std::vector<std::vector<std::uint32_t>>;

/// Whether `pass` touches chunk c (false past the last pass).
inline bool pass_uses(const pass_chunk_lists& pass_chunks, std::size_t pass, std::uint32_t c) {
  return pass < pass_chunks.size() && std::find(pass_chunks[pass].begin(), pass_chunks[pass].end(), c) !=
                                          pass_chunks[pass].end();
}

}  // namespace chunkwise::detail
