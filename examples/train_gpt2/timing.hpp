#pragma once
// The trainer's calibrations time a piece of work as a median: one untimed warm-up, then `iterations` timed runs, so
// a burst of other work on the machine does not set the rate.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace gpt2 {

template <class Work>
double median_seconds(int iterations, Work&& work) {
  work();
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    work();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

}  // namespace gpt2
