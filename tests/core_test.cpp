#include <chunkwise/core.hpp>
#include <chunkwise/core/checked_call.hpp>
#include <chunkwise/core/checkpoint_format.hpp>
#include <chunkwise/core/hash.hpp>
#include <chunkwise/core/worker_threads.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cerrno>
#include <future>
#include <new>
#include <thread>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

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

// ---- the checkpoint format (core/checkpoint_format.hpp) ----

namespace {

constexpr checkpoint_kind test_kind{"testkind", "a test file", "test file"};
constexpr checkpoint_kind other_kind{"otherknd", "another test file", "other file"};

/// A small file of the format: an identity of three fields and four pieces, one of them empty (in the middle, so
/// that a file cut anywhere before its end leaves some piece short).
struct sample_file {
  std::string identity;
  std::vector<std::vector<unsigned char>> pieces;

  sample_file() {
    identity = checkpoint_fields().put_text("tiny").put(std::uint64_t{42}).put(std::uint32_t{7}).bytes();
    pieces.push_back({1, 2, 3, 4, 5});
    pieces.emplace_back();
    pieces.emplace_back();
    for (unsigned char i = 0; i < 13; ++i) pieces.back().push_back(static_cast<unsigned char>(0xa0 + i));
    pieces.emplace_back(sizeof(float) * 8);
    const float values[8] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-30f, -1e30f, 7.0f, 0.5f};
    std::memcpy(pieces.back().data(), values, sizeof values);
  }
  [[nodiscard]] checkpoint_format_writer writer(const checkpoint_kind& kind = test_kind) const {
    checkpoint_format_writer w(kind, identity);
    for (const auto& p : pieces) w.add_piece(p.data(), p.size());
    return w;
  }
  [[nodiscard]] std::string bytes(const checkpoint_kind& kind = test_kind) const { return writer(kind).bytes(); }
  [[nodiscard]] static std::string label(std::size_t k) { return "part " + std::to_string(k); }
};

/// Reads every piece of `bytes` as a stream, in order.
std::vector<std::vector<unsigned char>> read_stream(const std::string& bytes, const checkpoint_kind& kind = test_kind) {
  std::istringstream in(bytes);
  checkpoint_format_reader reader(in, kind, "test: ");
  std::vector<std::vector<unsigned char>> pieces;
  for (std::size_t k = 0; k < reader.pieces().size(); ++k) {
    pieces.emplace_back(reader.pieces()[k].bytes);
    reader.read_piece(k, pieces.back().data(), sample_file::label(k));
  }
  return pieces;
}

/// The message of the chunkwise::error `f` throws with code `code`; "(no error)" when it throws none.
std::string error_of(const std::function<void()>& f, error_code code = error_code::parse_error) {
  try {
    f();
  } catch (const error& e) {
    CHECK(e.code() == code);
    return e.what();
  }
  return "(no error)";
}

struct scratch_dir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("chunkwise_core_format_" + std::to_string(::getpid()));
  scratch_dir() {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("a checkpoint-format file round-trips its identity and pieces through a stream and a file") {
  const sample_file sample;
  const auto writer = sample.writer();
  const std::string bytes = writer.bytes();
  // The layout, pinned: a change here is a new format version.
  REQUIRE(bytes.size() == writer.file_bytes());
  CHECK(writer.header_bytes() == 64 + sample.identity.size() + 16 * 4);
  CHECK(bytes.size() == 64 + 20 + 16 * 4 + 5 + 0 + 13 + 32);
  CHECK(bytes.substr(0, 8) == "CHKWCKPT");
  CHECK(bytes.substr(8, 4) == std::string("\x03\0\0\0", 4));
  CHECK(bytes.substr(16, 8) == "testkind");
  CHECK(bytes.substr(64, sample.identity.size()) == sample.identity);
  CHECK(crc32c(bytes.data(), bytes.size()) == 0x0ec166dfu);  // the whole file, as this version writes it
  std::ostringstream streamed;
  writer.write(streamed);
  CHECK(streamed.str() == bytes);

  std::istringstream in(bytes);
  checkpoint_format_reader reader(in, test_kind, "test: ");
  CHECK(reader.identity() == sample.identity);
  CHECK(reader.file_bytes() == bytes.size());
  REQUIRE(reader.pieces().size() == 4);
  checkpoint_field_reader fields(reader);
  CHECK(fields.take_text(16) == "tiny");
  CHECK(fields.take<std::uint64_t>() == 42);
  CHECK(fields.take<std::uint32_t>() == 7);
  fields.finish();
  for (std::size_t k = 0; k < 4; ++k) {
    std::vector<unsigned char> piece(reader.pieces()[k].bytes);
    reader.read_piece(k, piece.data(), sample_file::label(k));
    CHECK(piece == sample.pieces[k]);
  }

  // A file: any piece, in any order, more than once.
  const scratch_dir dir;
  const auto path = dir.path / "sample.ckpt";
  writer.write_atomically(path);
  checkpoint_format_reader file(path, test_kind);
  for (std::size_t k = 4; k-- > 0;) CHECK(file.read_piece_as<unsigned char>(k, "") == sample.pieces[k]);
  const auto floats = file.read_piece_as<float>(3, "floats");
  REQUIRE(floats.size() == 8);
  CHECK(floats[1] == -2.5f);
  CHECK(floats[5] == -1e30f);
}

TEST_CASE("a flipped bit anywhere in a checkpoint-format header is detected and named by what it hit") {
  const sample_file sample;
  const std::string good = sample.bytes();
  const std::size_t header = sample.writer().header_bytes();
  for (std::size_t at = 0; at < header; ++at)
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[at] = static_cast<char>(bad[at] ^ (1 << bit));
      const std::string message = error_of([&] { (void)read_stream(bad); });
      CAPTURE(at);
      CAPTURE(message);
      CHECK(message.rfind("chunkwise: test: ", 0) == 0);
      if (at < 8)
        CHECK(message.find("not a chunkwise checkpoint file: its magic is") != std::string::npos);
      else if (at < 12)
        CHECK(message.find("is not supported: this build reads format version 3") != std::string::npos);
      else
        CHECK(message.find("checksum mismatch: its header does not match its checksum") != std::string::npos);
    }
  // A reader of a file names it.
  const scratch_dir dir;
  const auto path = dir.path / "flipped.ckpt";
  for (const std::size_t at : {std::size_t{20}, std::size_t{70}}) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x40);
    write_file_atomically(path, bad);
    const std::string message = error_of([&] { checkpoint_format_reader reader(path, test_kind); });
    CHECK(message.find("test file '" + path.string() + "' is corrupted or truncated: checksum mismatch: its header "
                       "does not match its checksum") != std::string::npos);
  }
}

TEST_CASE("a flipped bit in each checkpoint-format piece is detected and names the piece") {
  const sample_file sample;
  const std::string good = sample.bytes();
  const auto writer = sample.writer();
  const scratch_dir dir;
  const auto path = dir.path / "piece.ckpt";
  std::size_t offset = writer.header_bytes();
  for (std::size_t k = 0; k < sample.pieces.size(); offset += sample.pieces[k].size(), ++k)
    for (std::size_t at = offset; at < offset + sample.pieces[k].size(); ++at) {
      std::string bad = good;
      bad[at] = static_cast<char>(bad[at] ^ (1 << (at % 8)));
      CAPTURE(at);
      const std::string expected = "checksum mismatch: piece " + std::to_string(k) + " (part " + std::to_string(k) +
                                   ") does not match its checksum (stored 0x";
      CHECK(error_of([&] { (void)read_stream(bad); }).find("chunkwise: test: " + expected) != std::string::npos);
      // Through a file the header is fine and the other pieces still read.
      write_file_atomically(path, bad);
      checkpoint_format_reader file(path, test_kind);
      for (std::size_t other = 0; other < sample.pieces.size(); ++other) {
        if (other == k) {
          const std::string message = error_of([&] { (void)file.read_piece_as<unsigned char>(k, sample_file::label(k)); });
          CHECK(message.find("test file '" + path.string() + "' is corrupted or truncated: " + expected) !=
                std::string::npos);
        } else {
          CHECK(file.read_piece_as<unsigned char>(other, "") == sample.pieces[other]);
        }
      }
    }
}

TEST_CASE("a checkpoint-format file cut at any byte is found truncated, from a stream and from a file") {
  const sample_file sample;
  const std::string good = sample.bytes();
  const scratch_dir dir;
  const auto path = dir.path / "cut.ckpt";
  for (std::size_t length = 0; length < good.size(); ++length) {
    CAPTURE(length);
    const std::string cut = good.substr(0, length);
    const std::string streamed = error_of([&] { (void)read_stream(cut); });
    CHECK(streamed.find("chunkwise: test: the input is truncated: ") != std::string::npos);
    if (length < 64) CHECK(streamed.find("it ends after " + std::to_string(length) + " bytes, inside the 64-byte header") != std::string::npos);
    write_file_atomically(path, cut);
    const std::string read = error_of([&] { checkpoint_format_reader reader(path, test_kind); });
    CHECK(read.find("test file '" + path.string() + "' is corrupted or truncated: the input is truncated: ") !=
          std::string::npos);
  }
  // A byte too many is damage too (a file, whose size is known).
  write_file_atomically(path, good + '\0');
  CHECK(error_of([&] { checkpoint_format_reader reader(path, test_kind); })
            .find("it has " + std::to_string(good.size() + 1) + " bytes, 1 more than its header accounts for") !=
        std::string::npos);
}

TEST_CASE("a checkpoint-format file of another magic, version or kind is named as such") {
  const sample_file sample;
  const std::string good = sample.bytes();
  std::string magic = good;
  magic.replace(0, 8, "NOTOURS!");
  CHECK(error_of([&] { (void)read_stream(magic); })
            .find("test: not a chunkwise checkpoint file: its magic is \"NOTOURS!\", not \"CHKWCKPT\"") != std::string::npos);
  CHECK(error_of([&] { (void)read_stream("hello"); }).find("its magic is \"hello\"") != std::string::npos);
  std::string version = good;
  version[8] = 9;
  CHECK(error_of([&] { (void)read_stream(version); })
            .find("test: format version 9 is not supported: this build reads format version 3") != std::string::npos);
  CHECK(error_of([&] { (void)read_stream(sample.bytes(other_kind)); })
            .find("test: it holds kind \"otherknd\", not a test file (kind \"testkind\")") != std::string::npos);
  // The formats before the shared one: named with both versions, not called corrupt.
  std::string old_runtime = "CHKWCK02" + std::string(56, '\0');
  CHECK(error_of([&] { (void)read_stream(old_runtime); })
            .find("it is in format version 2 (magic \"CHKWCK02\", a runtime checkpoint of an older chunkwise); this "
                  "build reads format version 3 only") != std::string::npos);
  std::string old_state("CWOPTST\0\x01\0\0\0", 12);
  old_state += std::string(52, '\0');
  CHECK(error_of([&] { (void)read_stream(old_state); })
            .find("it is in format version 1 (magic \"CWOPTST\\x00\", an optimizer state of an older chunkwise); this "
                  "build reads format version 3") != std::string::npos);
  // Through a file, the file is named.
  const scratch_dir dir;
  const auto path = dir.path / "other.ckpt";
  sample.writer(other_kind).write_atomically(path);
  CHECK(error_of([&] { checkpoint_format_reader reader(path, test_kind); })
            .find("test file '" + path.string() + "': it holds kind \"otherknd\"") != std::string::npos);
  CHECK(error_of([&] { checkpoint_format_reader reader(dir.path / "missing.ckpt", test_kind); }, error_code::io_error)
            .find("missing.ckpt': cannot open it") != std::string::npos);
}

TEST_CASE("checkpoint-format identities that run short or have bytes left over are damage; stream pieces go in order") {
  const auto read_identity = [](const std::string& identity, const std::function<void(checkpoint_field_reader&)>& parse) {
    std::istringstream in(checkpoint_format_writer(test_kind, identity).bytes());
    checkpoint_format_reader reader(in, test_kind, "test: ");
    checkpoint_field_reader fields(reader);
    parse(fields);
  };
  CHECK(error_of([&] { read_identity("abc", [](checkpoint_field_reader& f) { (void)f.take<std::uint64_t>(); }); })
            .find("test: its identity ends after 3 bytes, inside a field of 8 bytes at byte 0") != std::string::npos);
  CHECK(error_of([&] { read_identity("abcdefgh", [](checkpoint_field_reader& f) { (void)f.take<std::uint32_t>(); f.finish(); }); })
            .find("its identity has 4 bytes after its last field") != std::string::npos);
  CHECK(error_of([&] {
          read_identity(checkpoint_fields().put_text("a long name").bytes(), [](checkpoint_field_reader& f) { (void)f.take_text(4); });
        }).find("claims 11 characters, more than the 4 it may have") != std::string::npos);

  const sample_file sample;
  std::istringstream in(sample.bytes());
  checkpoint_format_reader reader(in, test_kind, "test: ");
  std::vector<unsigned char> piece(64);
  CHECK(error_of([&] { reader.read_piece(2, piece.data(), ""); }, error_code::invalid_argument)
            .find("piece 2 asked for where piece 0 is next") != std::string::npos);
  CHECK(error_of([&] { reader.read_piece(4, piece.data(), ""); }, error_code::invalid_argument)
            .find("piece 4 does not exist; the file holds 4 pieces") != std::string::npos);
}

TEST_CASE("a checkpoint-format file written atomically keeps its old contents when the write fails") {
  const sample_file sample;
  const scratch_dir dir;
  const auto path = dir.path / "atomic.ckpt";
  sample.writer().write_atomically(path);
  const std::string before = read_file(path);
  checkpoint_format_writer bigger(test_kind, "another identity");
  bigger.add_piece(sample.pieces[3].data(), sample.pieces[3].size());
  testing::atomic_write_faults faults;
  faults.write_fails_after = 10;
  CHECK(error_of([&] { bigger.write_atomically(path, &faults); }, error_code::io_error).find("write") !=
        std::string::npos);
  CHECK(read_file(path) == before);
  checkpoint_format_reader reader(path, test_kind);
  CHECK(reader.identity() == sample.identity);
  CHECK(std::filesystem::directory_iterator(dir.path) != std::filesystem::directory_iterator());
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path)) ++files;
  CHECK(files == 1);  // no temporary file left behind
}

// ---- checked calls, out_of_memory, worker_threads, fnv1a --------------------------------------------------------

TEST_CASE("out_of_memory is caught as chunkwise::error with its code and as std::bad_alloc") {
  bool as_error = false, as_bad_alloc = false;
  try {
    chunkwise::throw_error(chunkwise::error_code::out_of_memory, "needs 3 GiB, budget is 2 GiB");
  } catch (const chunkwise::error& e) {
    as_error = e.code() == chunkwise::error_code::out_of_memory;
    CHECK(std::string(e.what()) == "chunkwise: needs 3 GiB, budget is 2 GiB");
  }
  try {
    chunkwise::throw_error(chunkwise::error_code::out_of_memory, "needs 3 GiB");
  } catch (const std::bad_alloc& e) {
    as_bad_alloc = std::string(e.what()) == "chunkwise: needs 3 GiB";
  }
  CHECK(as_error);
  CHECK(as_bad_alloc);
  // Every other code is a plain error, never a bad_alloc.
  CHECK_THROWS_AS(chunkwise::throw_error(chunkwise::error_code::io_error, "x"), chunkwise::error);
  bool io_as_bad_alloc = false;
  try {
    chunkwise::throw_error(chunkwise::error_code::io_error, "x");
  } catch (const std::bad_alloc&) {
    io_as_bad_alloc = true;
  } catch (const chunkwise::error&) {
  }
  CHECK_FALSE(io_as_bad_alloc);
}

namespace {
std::string failure_of(const std::function<void()>& call, chunkwise::error_code expected) {
  try {
    call();
  } catch (const chunkwise::error& e) {
    CHECK(e.code() == expected);
    return e.what();
  }
  FAIL("no error was thrown");
  return {};
}
}  // namespace

TEST_CASE("a failed POSIX call names the context, the call as written, errno's text and name, and the place") {
  const std::string message = failure_of(
      [] { CHUNKWISE_POSIX_TRY(::close(-1), std::string("closing the store")); }, chunkwise::error_code::io_error);
  CAPTURE(message);
  CHECK(message.find("chunkwise: closing the store: ::close(-1) failed: ") == 0);
  CHECK(message.find(std::strerror(EBADF)) != std::string::npos);
  CHECK(message.find("errno " + std::to_string(EBADF)) != std::string::npos);
  CHECK(message.find("EBADF") != std::string::npos);
  CHECK(message.find("core_test.cpp:") != std::string::npos);
  // Success evaluates the call once and throws nothing.
  int calls = 0;
  CHUNKWISE_POSIX_TRY((++calls, 0), "never");
  CHECK(calls == 1);
}

TEST_CASE("an io_uring-style -errno result and ENOMEM go through the same family; ENOMEM is out of memory") {
  const std::string message = failure_of([] { CHUNKWISE_URING_TRY(-EIO, "NVMe tier 'x'"); }, chunkwise::error_code::io_error);
  CHECK(message.find("NVMe tier 'x': -EIO failed: ") != std::string::npos);
  CHECK(message.find("errno " + std::to_string(EIO)) != std::string::npos);
  CHECK_THROWS_AS(chunkwise::throw_posix_failure("mmap", ENOMEM, "pinned host tier"), std::bad_alloc);
  const std::string without_context =
      failure_of([] { chunkwise::throw_posix_failure("rename 'a'", EXDEV, {}); }, chunkwise::error_code::io_error);
  CHECK(without_context.find("chunkwise: rename 'a' failed: ") == 0);
}

TEST_CASE("worker threads run pushed tasks in order with one worker and keep the first failure") {
  chunkwise::worker_threads one(1);
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) one.push([&order, i] { order.push_back(i); });
  one.push([] { throw chunkwise::error(chunkwise::error_code::io_error, "first"); });
  one.push([] { throw chunkwise::error(chunkwise::error_code::io_error, "second"); });
  one.push([&order] { order.push_back(100); });  // a failure does not stop the worker
  one.drain();
  REQUIRE(order.size() == 101);
  for (int i = 0; i <= 100; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
  CHECK_THROWS_WITH_AS(one.rethrow_if_failed(), "chunkwise: first", chunkwise::error);
  CHECK_NOTHROW(one.rethrow_if_failed());  // rethrown once
}

TEST_CASE("submit reports through its future and run_now_or_submit keeps issue order") {
  chunkwise::worker_threads one(1);
  std::vector<int> order;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  auto first = one.submit(std::packaged_task<void()>([&order, gate] {
    gate.wait();
    order.push_back(1);
  }));
  // The worker is busy: this one must queue behind it, not run on the caller now.
  auto second = one.run_now_or_submit(std::packaged_task<void()>([&order] { order.push_back(2); }));
  CHECK(order.empty());
  release.set_value();
  first.get();
  second.get();
  REQUIRE(order.size() == 2);
  CHECK(order[0] == 1);
  CHECK(order[1] == 2);
  // Idle (a future is ready a moment before its worker counts itself done: drain first): it runs on the calling
  // thread before returning.
  one.drain();
  const auto caller = std::this_thread::get_id();
  std::thread::id ran_on;
  one.run_now_or_submit(std::packaged_task<void()>([&ran_on] { ran_on = std::this_thread::get_id(); })).get();
  CHECK(ran_on == caller);
  auto failing = one.submit(std::packaged_task<void()>([] { throw chunkwise::error(chunkwise::error_code::comm_error, "x"); }));
  CHECK_THROWS_AS(failing.get(), chunkwise::error);
}

TEST_CASE("poll_until sees a condition set by another thread, gives up after its limit, and polls once at zero") {
  std::atomic<bool> flag{false};
  std::thread setter([&flag] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    flag.store(true);
  });
  CHECK(chunkwise::poll_until(std::chrono::seconds(10), [&flag] { return flag.load(); }));
  setter.join();
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(chunkwise::poll_until(std::chrono::milliseconds(5), [&calls] { return ++calls < 0; }));
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(5));
  CHECK(calls > 1);
  calls = 0;
  CHECK_FALSE(chunkwise::poll_until(std::chrono::microseconds(0), [&calls] { return ++calls < 0; }));
  CHECK(calls == 1);
  CHECK(chunkwise::poll_until(std::chrono::microseconds(0), [] { return true; }));
}

TEST_CASE("a polling worker takes tasks given while it polls and after it has gone to sleep") {
  chunkwise::worker_threads polling(1, std::chrono::microseconds(500));
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) polling.submit(std::packaged_task<void()>([&order, i] { order.push_back(i); })).get();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the poll: the worker sleeps
  polling.submit(std::packaged_task<void()>([&order] { order.push_back(50); })).get();
  REQUIRE(order.size() == 51);
  for (int i = 0; i <= 50; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("parallel_for runs every index once on workers and caller, also nested in a worker and with no worker") {
  for (const std::size_t workers : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
    CAPTURE(workers);
    chunkwise::worker_threads pool(workers);
    CHECK(pool.parallel_width() == workers + 1);
    for (const std::size_t tasks : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{5000}}) {
      std::vector<std::atomic<int>> hits(tasks);
      pool.parallel_for(tasks, [&](std::size_t i) noexcept { hits[i].fetch_add(1); });
      for (std::size_t i = 0; i < tasks; ++i) CHECK(hits[i].load() == 1);
    }
    // From inside a task of the same object: the caller does what no worker takes, nothing deadlocks.
    std::atomic<int> nested{0};
    pool.push([&] { pool.parallel_for(64, [&](std::size_t) noexcept { nested.fetch_add(1); }); });
    pool.drain();
    CHECK(nested.load() == 64);
  }
}

TEST_CASE("fnv1a is chunkwise's one identity hash: stable values, values and text mix in order") {
  static_assert(chunkwise::fnv1a().value() == chunkwise::fnv1a::offset_basis);
  static_assert(chunkwise::fnv1a().add("ab").value() == chunkwise::fnv1a().add("a").add("b").value());
  static_assert(chunkwise::fnv1a().add(1).add(2).value() != chunkwise::fnv1a().add(2).add(1).value());
  // Saved checkpoints and machine caches carry these: the values must never change.
  CHECK(chunkwise::fnv1a().add("a").value() == 0x44bd8ad473cd9906ull);
  CHECK(chunkwise::fnv1a().add("gpt2").add(std::uint64_t{768}).value() ==
        chunkwise::fnv1a(chunkwise::fnv1a().add("gpt2").value()).add(std::uint64_t{768}).value());
}
