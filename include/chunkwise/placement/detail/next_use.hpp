#pragma once
// Positions of each chunk in the profiled (cyclic) access order, and the distance to a chunk's next use from a cursor:
// the key of next-use (Belady) eviction.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>
#include <algorithm>

namespace chunkwise::detail {

class next_use_index {
 public:
  static constexpr std::size_t never = std::numeric_limits<std::size_t>::max();

  next_use_index(const std::vector<std::uint32_t>& order, std::size_t chunks) : order_(order), positions_(chunks) {
    for (std::size_t p = 0; p < order_.size(); ++p) positions_[order_[p]].push_back(p);
  }

  [[nodiscard]] std::size_t period() const noexcept { return order_.size(); }
  [[nodiscard]] std::uint32_t at(std::size_t cursor) const noexcept { return order_[cursor % order_.size()]; }
  [[nodiscard]] bool in_order(std::uint32_t chunk) const noexcept { return !positions_[chunk].empty(); }

  /// Accesses from absolute position `cursor` until `chunk` is next used (0: it is the access at `cursor`);
  /// `never` for a chunk absent from the order.
  [[nodiscard]] std::size_t distance(std::uint32_t chunk, std::size_t cursor) const noexcept {
    const auto& where = positions_[chunk];
    if (where.empty()) return never;
    const std::size_t phase = cursor % order_.size();
    const auto next = std::lower_bound(where.begin(), where.end(), phase);
    return next != where.end() ? *next - phase : order_.size() - phase + where.front();
  }

 private:
  std::vector<std::uint32_t> order_;
  std::vector<std::vector<std::size_t>> positions_;
};

}  // namespace chunkwise::detail
