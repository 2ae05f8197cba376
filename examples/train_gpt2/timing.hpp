#pragma once
// The trainer's calibrations and its step timing take medians: a calibration times a piece of work after one untimed
// warm-up, `iterations` timed runs, so a burst of other work on the machine does not set the rate.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

namespace gpt2 {

/// The median of `values` (the upper one of an even count); `values` not empty.
inline double median_of(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

template <class Work>
double median_seconds(int iterations, Work&& work) {
  work();
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    work();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median_of(std::move(times));
}

}  // namespace gpt2
