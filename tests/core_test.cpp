#include <chunkwise/core.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace chunkwise;

static_assert(64_MiB == 67108864);
static_assert(3_GiB == 3221225472ull);
static_assert(round_up(1000, 256) == 1024 && round_up(1024, 256) == 1024);
static_assert(to_bf16(1.0f).bits == 0x3f80);
static_assert(to_fp16(1.0f).bits == 0x3c00);
static_assert(size_of(dtype::bf16) == 2 && size_of(dtype::fp32) == 4);
static_assert(tensor_spec{"wte", 1000, dtype::bf16}.bytes() == 2000);

TEST_CASE("byte counts print in the largest binary unit with two decimals") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(64_MiB) == "64.00 MiB");
  CHECK(format_bytes(3_GiB + 512_MiB) == "3.50 GiB");
  CHECK(format_bytes(2_TiB) == "2.00 TiB");
}

TEST_CASE("byte sizes parse with binary and decimal units and reject junk") {
  CHECK(parse_bytes("4096") == 4096);
  CHECK(parse_bytes("64MiB") == 64_MiB);
  CHECK(parse_bytes("24 GiB") == 24_GiB);
  CHECK(parse_bytes("1.5GiB") == 1536_MiB);
  CHECK(parse_bytes("3GB") == 3000000000ull);
  CHECK(parse_bytes("16kb") == 16000);
  CHECK_THROWS_WITH_AS(parse_bytes("lots"), doctest::Contains("'lots' is not a byte size"), error);
  CHECK_THROWS_AS(parse_bytes("12 parsecs"), error);
  CHECK_THROWS_AS(parse_bytes(""), error);
  for (const char* bad : {"1.2.3GiB", "1..5MiB", ".", ". GiB"})  // strtod would stop early, or read 0
    CHECK_THROWS_WITH_AS(parse_bytes(bad), doctest::Contains("is not a byte size"), error);
}

TEST_CASE("fp32 to bf16 rounds to nearest even on known bit patterns") {
  const auto bf = [](std::uint32_t bits) { return to_bf16(std::bit_cast<float>(bits)).bits; };
  CHECK(bf(0x3f800000) == 0x3f80);  // 1.0
  CHECK(bf(0x3f808000) == 0x3f80);  // exactly halfway, lsb even: stays
  CHECK(bf(0x3f818000) == 0x3f82);  // exactly halfway, lsb odd: rounds up to even
  CHECK(bf(0x3f808001) == 0x3f81);  // above halfway: up
  CHECK(bf(0x3f807fff) == 0x3f80);  // below halfway: down
  CHECK(bf(0x7f7fffff) == 0x7f80);  // FLT_MAX rounds to +inf
  CHECK(bf(0xff800000) == 0xff80);  // -inf
  CHECK(bf(0x80000000) == 0x8000);  // -0
  CHECK(bf(0x00000001) == 0x0000);  // smallest subnormal rounds to zero
  const auto nan = bf(0x7fc00001);
  CHECK((nan & 0x7f80) == 0x7f80);
  CHECK((nan & 0x007f) != 0);  // still a NaN, never infinity
  CHECK(to_float(bf16{0x4049}) == 3.140625f);
}

TEST_CASE("fp32 to fp16 rounds to nearest even on known bit patterns") {
  CHECK(to_fp16(1.0f).bits == 0x3c00);
  CHECK(to_fp16(-2.0f).bits == 0xc000);
  CHECK(to_fp16(65504.0f).bits == 0x7bff);                 // largest finite half
  CHECK(to_fp16(65519.99f).bits == 0x7bff);                // below the tie: stays finite
  CHECK(to_fp16(65520.0f).bits == 0x7c00);                 // the tie rounds to even = infinity
  CHECK(to_fp16(std::ldexp(1.0f, -14)).bits == 0x0400);    // smallest normal
  CHECK(to_fp16(std::ldexp(1.0f, -24)).bits == 0x0001);    // smallest subnormal
  CHECK(to_fp16(std::ldexp(1.0f, -25)).bits == 0x0000);    // half of it: tie to even = 0
  CHECK(to_fp16(std::ldexp(1.5f, -25)).bits == 0x0001);    // above the tie
  CHECK(to_fp16(std::ldexp(3.0f, -25)).bits == 0x0002);    // 1.5 ulp: tie to even = 2
  CHECK(to_fp16(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);  // halfway between 1 and 1+2^-10: even
  CHECK(to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);
  CHECK(to_fp16(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  const auto nan = to_fp16(std::numeric_limits<float>::quiet_NaN()).bits;
  CHECK((nan & 0x7c00) == 0x7c00);
  CHECK((nan & 0x03ff) != 0);
}

TEST_CASE("every half value survives fp16 -> fp32 -> fp16 unchanged") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const fp16 h{static_cast<std::uint16_t>(bits)};
    const float f = to_float(h);
    if (std::isnan(f)) continue;
    REQUIRE(to_fp16(f).bits == h.bits);
  }
}

TEST_CASE("fp16 rounding matches a double-precision reference on random floats") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> exponent(-27.0, 16.5);
  for (int i = 0; i < 200000; ++i) {
    const float value = static_cast<float>(std::exp2(exponent(rng))) * ((i & 1) ? -1.0f : 1.0f);
    const fp16 h = to_fp16(value);
    // Reference: the nearest half (ties to even) by comparing distances to both neighbours in double.
    const double x = value;
    const fp16 next{static_cast<std::uint16_t>(h.bits + 1)};
    const fp16 prev{static_cast<std::uint16_t>(h.bits - 1)};
    const double d = std::abs(double(to_float(h)) - x);
    if (!std::isinf(to_float(h))) {
      if ((h.bits & 0x7fff) != 0x7bff) REQUIRE(d <= std::abs(double(to_float(next)) - x));
      if ((h.bits & 0x7fff) != 0) REQUIRE(d <= std::abs(double(to_float(prev)) - x));
    }
  }
}

TEST_CASE("tensor names longer than the capacity are an error that names them") {
  const std::string long_name(tensor_name::capacity + 1, 'x');
  CHECK_THROWS_WITH_AS(tensor_name{long_name}, doctest::Contains("at most 95 fit"), error);
  CHECK(tensor_name{"h.0.attn.c_attn.weight"}.view() == "h.0.attn.c_attn.weight");
}

TEST_CASE("errors carry their code and a prefixed message") {
  try {
    throw_error(error_code::out_of_memory, "needs 3.20 GiB, budget is 2.00 GiB");
    FAIL("no throw");
  } catch (const error& e) {
    CHECK(e.code() == error_code::out_of_memory);
    CHECK(std::string(e.what()) == "chunkwise: needs 3.20 GiB, budget is 2.00 GiB");
    CHECK(to_string(e.code()) == "out_of_memory");
  }
}

TEST_CASE("counts parse as whole non-negative integers and junk names the flag") {
  CHECK(parse_count("42", "--steps") == 42);
  CHECK(parse_count("0", "--steps") == 0);
  CHECK_THROWS_WITH_AS(parse_count("4x", "--steps"), doctest::Contains("--steps expects a non-negative integer, got '4x'"),
                       error);
  CHECK_THROWS_AS(parse_count("-1", "--steps"), error);
  CHECK_THROWS_AS(parse_count("", "--steps"), error);
  CHECK_THROWS_AS(parse_count(" 7", "--steps"), error);
}
