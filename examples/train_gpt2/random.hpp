#pragma once
// The example's random numbers: splitmix64 (Steele, Lea and Flood 2014), a generator fully defined by its few lines,
// so initial weights and batch order are the same on every standard library (std::normal_distribution and
// std::uniform_int_distribution are not specified bit for bit).
#include <cmath>
#include <cstdint>
#include <string_view>

namespace gpt2 {

class splitmix64 {
 public:
  explicit splitmix64(std::uint64_t seed) noexcept : state_(seed) {}

  /// The generator seeded with `seed` after `calls` calls of next(): its state only counts them, so a stream can be
  /// cut into pieces that threads draw at once, giving the very values one thread would.
  static splitmix64 after(std::uint64_t seed, std::uint64_t calls) noexcept {
    return splitmix64(seed + calls * increment);
  }

  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += increment);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  /// Uniform in [0, 1), 53 random bits.
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  /// Uniform in [0, bound), bound > 0 (modulo; the bias is below 2^-40 for the bounds used here).
  std::uint64_t below(std::uint64_t bound) noexcept { return next() % bound; }

  /// Standard normal, Box-Muller; one value per call (the second of the pair is dropped, so no hidden state).
  double normal() noexcept {
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2);
  }

 private:
  static constexpr std::uint64_t increment = 0x9e3779b97f4a7c15ULL;
  std::uint64_t state_;
};

/// FNV-1a of a name: gives each tensor its own stream from one seed, so a tensor's initial values do not depend on
/// which tensors were initialised before it.
constexpr std::uint64_t name_hash(std::string_view name) noexcept {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return hash;
}

}  // namespace gpt2
