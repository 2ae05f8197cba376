#pragma once
// The one on-disk format of what chunkwise saves: a header that says what the file is and a sequence of pieces, each
// checked by its own CRC-32C. The optimizer state of one chunk (optim/state_io.hpp) and each rank's file of a runtime
// checkpoint (runtime/checkpoint_file.hpp) are two kinds of it: they differ only in their kind tag, in the fields of
// their identity and in what their pieces hold. One writer, one reader, one set of messages.
//
// Layout (little-endian; the 64-byte prefix is the same in every file of every kind):
//   offset          bytes  field
//        0              8  magic "CHKWCKPT"
//        8              4  format version (3)
//       12              4  zero
//       16              8  kind: 8 ASCII bytes naming what the file holds ("optstate", "rankfile")
//       24              8  I: bytes of the identity, the kind's own fields
//       32              8  P: pieces
//       40              8  bytes of the whole file: header and pieces
//       48              8  zero
//       56              4  CRC-32C of the identity and the piece table (offsets 64 .. 64 + I + 16 P)
//       60              4  CRC-32C of offsets 0 .. 59 (the rest of this prefix)
//       64              I  identity
//   64 + I           16 P  piece table: per piece u64 bytes, u32 CRC-32C of those bytes, u32 zero
//   64 + I + 16 P       .  the pieces back to back, in table order
//
// A reader checks the magic and the version first (a file of another version is named as such, not called corrupt;
// every later version keeps offsets 0 .. 12), then the prefix's checksum before it trusts any size, then the
// identity and table against theirs, then each piece against its own when it reads it. A reader of a file (not a
// stream) also compares the file's size with the header's at once, so a cut-off file fails before any piece is read.
// Version 3 is the first shared one: 1 was the optimizer state's own format ("CWOPTST"), 2 the runtime checkpoint's
// ("CHKWCK02"); files of those are named with their version and refused.
//
// Writes go through write_file_atomically (core/atomic_file.hpp): a file is either whole or absent.
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/core/checksum.hpp>
#include <chunkwise/core/error.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace chunkwise {

static_assert(std::endian::native == std::endian::little,
              "chunkwise's checkpoint format is little-endian and is written as the host holds it");

/// The format version this build writes and reads.
inline constexpr std::uint32_t checkpoint_format_version = 3;
/// Bytes of the fixed prefix of every header.
inline constexpr std::size_t checkpoint_prefix_bytes = 64;
/// Bytes of one piece's entry in the piece table.
inline constexpr std::size_t checkpoint_piece_entry_bytes = 16;

/// What a file holds: an 8-character tag stored in its header, and words for messages.
struct checkpoint_kind {
  std::array<char, 8> tag{};
  std::string_view what;  // "an optimizer state": what a file of this kind is
  std::string_view noun;  // "optimizer state": names a file in messages ("optimizer state '<path>' ...")

  constexpr checkpoint_kind(const char (&tag_text)[9], std::string_view what_text, std::string_view noun_text)
      : what(what_text), noun(noun_text) {
    for (std::size_t i = 0; i < 8; ++i) tag[i] = tag_text[i];
  }
  [[nodiscard]] constexpr std::string_view tag_view() const noexcept { return {tag.data(), tag.size()}; }
};

/// Bytes of a header with `identity_bytes` of identity and `pieces` pieces (the pieces' data begins there).
constexpr std::uint64_t checkpoint_header_bytes(std::uint64_t identity_bytes, std::uint64_t pieces) noexcept {
  return checkpoint_prefix_bytes + identity_bytes + checkpoint_piece_entry_bytes * pieces;
}

namespace detail {

inline constexpr std::array<char, 8> checkpoint_magic = {'C', 'H', 'K', 'W', 'C', 'K', 'P', 'T'};

template <class T>
void put_field(std::string& out, T value) {
  static_assert(std::is_integral_v<T>, "checkpoint fields are integers");
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}
template <class T>
T field_at(const unsigned char* bytes) noexcept {
  T value{};
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

/// `bytes` as a quoted string with anything unprintable escaped: how a foreign magic or kind is shown.
inline std::string quoted(std::string_view bytes) {
  std::string text = "\"";
  for (const char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      text += c;
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      text += escaped;
    }
  }
  return text + '"';
}

inline std::string hex32(std::uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", static_cast<unsigned>(value));
  return text;
}

/// The formats before the shared one, recognised by their magic so that their files are named, not called corrupt.
/// Returns the old version, or 0 when `magic` is none of them.
inline std::uint32_t legacy_checkpoint_version(std::string_view magic, const unsigned char* prefix, std::size_t got,
                                               std::string& what) {
  if (magic.substr(0, 6) == "CHKWCK" && magic.size() == 8 && magic[6] >= '0' && magic[6] <= '9' && magic[7] >= '0' &&
      magic[7] <= '9') {
    what = "a runtime checkpoint of an older chunkwise";
    return static_cast<std::uint32_t>((magic[6] - '0') * 10 + (magic[7] - '0'));
  }
  if (magic == std::string_view("CWOPTST\0", 8)) {
    what = "an optimizer state of an older chunkwise";
    return got >= 12 ? field_at<std::uint32_t>(prefix + 8) : 1;
  }
  return 0;
}

}  // namespace detail

/// Little-endian fields of an identity, appended in order; read back with checkpoint_field_reader.
class checkpoint_fields {
 public:
  template <class T>
  checkpoint_fields& put(T value) {
    detail::put_field(bytes_, value);
    return *this;
  }
  /// A u32 length, then the characters.
  checkpoint_fields& put_text(std::string_view text) {
    put(static_cast<std::uint32_t>(text.size()));
    bytes_ += text;
    return *this;
  }
  [[nodiscard]] const std::string& bytes() const& noexcept { return bytes_; }
  [[nodiscard]] std::string bytes() && noexcept { return std::move(bytes_); }

 private:
  std::string bytes_;
};

/// Writes one file of the format: a kind, its identity, and pieces whose bytes the caller keeps alive until written.
class checkpoint_format_writer {
 public:
  checkpoint_format_writer(const checkpoint_kind& kind, std::string identity)
      : kind_(kind), identity_(std::move(identity)) {}

  /// Appends a piece of `bytes` bytes at `data` (read now for its checksum, and again when the file is written).
  /// Returns its index.
  std::size_t add_piece(const void* data, std::size_t bytes) {
    pieces_.push_back({static_cast<const char*>(data), bytes, crc32c(data, bytes)});
    data_bytes_ += bytes;
    return pieces_.size() - 1;
  }
  template <class T>
  std::size_t add_piece(std::span<const T> values) {
    static_assert(std::is_trivially_copyable_v<T>, "a piece holds plain values");
    return add_piece(values.data(), values.size_bytes());
  }

  [[nodiscard]] std::size_t pieces() const noexcept { return pieces_.size(); }
  [[nodiscard]] std::uint64_t header_bytes() const noexcept {
    return checkpoint_header_bytes(identity_.size(), pieces_.size());
  }
  [[nodiscard]] std::uint64_t file_bytes() const noexcept { return header_bytes() + data_bytes_; }

  /// The header: prefix, identity and piece table.
  [[nodiscard]] std::string header() const {
    std::string tail = identity_;
    for (const auto& p : pieces_) {
      detail::put_field(tail, static_cast<std::uint64_t>(p.bytes));
      detail::put_field(tail, p.crc);
      detail::put_field(tail, std::uint32_t{0});
    }
    std::string prefix(detail::checkpoint_magic.data(), detail::checkpoint_magic.size());
    detail::put_field(prefix, checkpoint_format_version);
    detail::put_field(prefix, std::uint32_t{0});
    prefix.append(kind_.tag.data(), kind_.tag.size());
    detail::put_field(prefix, static_cast<std::uint64_t>(identity_.size()));
    detail::put_field(prefix, static_cast<std::uint64_t>(pieces_.size()));
    detail::put_field(prefix, file_bytes());
    detail::put_field(prefix, std::uint64_t{0});
    detail::put_field(prefix, crc32c(tail.data(), tail.size()));
    detail::put_field(prefix, crc32c(prefix.data(), prefix.size()));
    return prefix + tail;
  }

  /// The whole file.
  [[nodiscard]] std::string bytes() const {
    std::string out = header();
    out.reserve(static_cast<std::size_t>(file_bytes()));
    for (const auto& p : pieces_) out.append(p.data, p.bytes);
    return out;
  }

  /// Writes the file to a stream, header then pieces (no copy of the pieces). Throws io_error, its message starting
  /// with `context`, when the stream fails.
  void write(std::ostream& out, std::string_view context = {}) const {
    const std::string head = header();
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
    for (const auto& p : pieces_) out.write(p.data, static_cast<std::streamsize>(p.bytes));
    out.flush();
    if (!out)
      detail::raise(error_code::io_error, std::string(context) + "writing " + std::to_string(file_bytes()) +
                                              " bytes of " + std::string(kind_.what) + " failed");
  }

  /// Writes the file atomically (temporary file, fsync, rename): `path` holds either its old contents or all of
  /// this file, whatever fails.
  void write_atomically(const std::filesystem::path& path, const testing::atomic_write_faults* faults = nullptr) const {
    write_file_atomically(path, bytes(), faults);
  }

 private:
  struct piece_ref {
    const char* data;
    std::size_t bytes;
    std::uint32_t crc;
  };
  checkpoint_kind kind_;
  std::string identity_;
  std::vector<piece_ref> pieces_;
  std::uint64_t data_bytes_ = 0;
};

/// Reads one file of the format, from a stream (pieces in order) or from a file (any piece, any time). The header
/// is read and verified on construction; each piece is verified when it is read. Every failure is a
/// `chunkwise::error`: parse_error for a file that is damaged or of another format, version or kind, io_error for
/// one that cannot be opened, invalid_argument for a piece index out of range or out of order.
///
/// Messages: a reader of a file names it ("checkpoint '<path>' is corrupted or truncated: <what>", or
/// "checkpoint '<path>': <what>" when it is intact but not what was asked for); a reader of a stream starts each
/// message with the caller's context ("load_state: <what>"). The <what>s are the same for both:
///   the input is truncated: it ends after N bytes, inside the H-byte header
///   the input is truncated: it has N bytes, its header promises M
///   the input is truncated: piece K (<label>) has N of M bytes
///   checksum mismatch: its header does not match its checksum (stored X, computed Y)
///   checksum mismatch: piece K (<label>) does not match its checksum (stored X, computed Y)
///   not a chunkwise checkpoint file: its magic is "...", not "CHKWCKPT"
///   format version V is not supported: this build reads format version 3
///   it holds kind "...", not <what the caller expects> (kind "...")
class checkpoint_format_reader {
 public:
  /// One piece as the table describes it; `offset` is where its bytes begin in the file.
  struct piece {
    std::uint64_t bytes = 0;
    std::uint32_t crc = 0;
    std::uint64_t offset = 0;
  };

  /// Reads the header from a stream; pieces are then read in order. Messages start with `context`.
  checkpoint_format_reader(std::istream& in, const checkpoint_kind& expected, std::string context)
      : in_(&in), expected_(expected), context_(std::move(context)) {
    read_header(static_cast<std::uint64_t>(-1));
  }

  /// Opens `file` and reads its header; messages name it as "<kind noun> '<file>'".
  checkpoint_format_reader(const std::filesystem::path& file, const checkpoint_kind& expected)
      : checkpoint_format_reader(file, expected, std::string(expected.noun) + " '" + file.string() + "'") {}
  /// Opens `file` and reads its header; messages name it as `name`.
  checkpoint_format_reader(const std::filesystem::path& file, const checkpoint_kind& expected, std::string name)
      : file_(std::make_unique<std::ifstream>(file, std::ios::binary)), expected_(expected), name_(std::move(name)) {
    if (!*file_)
      detail::raise(error_code::io_error, name_ + ": cannot open it: " + std::strerror(errno ? errno : ENOENT));
    in_ = file_.get();
    std::error_code failure;
    const std::uint64_t size = std::filesystem::file_size(file, failure);
    if (failure) detail::raise(error_code::io_error, name_ + ": cannot read its size: " + failure.message());
    read_header(size);
  }

  [[nodiscard]] const checkpoint_kind& kind() const noexcept { return expected_; }
  /// The identity's bytes, verified against the header's checksum; parse them with checkpoint_field_reader.
  [[nodiscard]] std::string_view identity() const noexcept { return identity_; }
  [[nodiscard]] const std::vector<piece>& pieces() const noexcept { return pieces_; }
  [[nodiscard]] std::uint64_t file_bytes() const noexcept { return file_bytes_; }

  /// Reads piece `k` into `out` (pieces()[k].bytes bytes) and checks it against its checksum. `label` says what the
  /// piece is in messages ("tensor 3, elements 0..100"). On failure `out` holds whatever was read.
  void read_piece(std::size_t k, void* out, std::string_view label) {
    if (k >= pieces_.size())
      detail::raise(error_code::invalid_argument, message("piece " + std::to_string(k) + " does not exist; the file "
                                                          "holds " + std::to_string(pieces_.size()) + " pieces",
                                                          false));
    const piece& p = pieces_[k];
    if (file_) {
      in_->clear();
      in_->seekg(static_cast<std::streamoff>(p.offset));
    } else if (k != next_piece_) {
      detail::raise(error_code::invalid_argument,
                    message("piece " + std::to_string(k) + " asked for where piece " + std::to_string(next_piece_) +
                                " is next; a stream's pieces are read in order",
                            false));
    }
    const std::uint64_t got = read_into(out, p.bytes);
    next_piece_ = k + 1;
    if (got != p.bytes)
      corrupted("the input is truncated: " + piece_name(k, label) + " has " + std::to_string(got) + " of " +
                std::to_string(p.bytes) + " bytes");
    const std::uint32_t computed = crc32c(out, static_cast<std::size_t>(p.bytes));
    if (computed != p.crc)
      corrupted("checksum mismatch: " + piece_name(k, label) + " does not match its checksum (stored " +
                detail::hex32(p.crc) + ", computed " + detail::hex32(computed) + ")");
  }

  /// Piece `k` as values of T (its bytes must be a whole number of them).
  template <class T>
  std::vector<T> read_piece_as(std::size_t k, std::string_view label) {
    static_assert(std::is_trivially_copyable_v<T>, "a piece holds plain values");
    if (k < pieces_.size() && pieces_[k].bytes % sizeof(T) != 0)
      corrupted(piece_name(k, label) + " has " + std::to_string(pieces_[k].bytes) + " bytes, not a whole number of " +
                std::to_string(sizeof(T)) + "-byte values");
    std::vector<T> values(k < pieces_.size() ? static_cast<std::size_t>(pieces_[k].bytes / sizeof(T)) : 0);
    read_piece(k, values.data(), label);
    return values;
  }

  /// Raises the parse_error of a damaged file in this reader's words: "<name> is corrupted or truncated: <what>"
  /// (the kinds use it for identities that contradict the table).
  [[noreturn]] void corrupted(const std::string& what) const {
    detail::raise(error_code::parse_error, message(what, true));
  }
  /// Raises the parse_error of an intact file that is not what was asked for: "<name>: <what>".
  [[noreturn]] void refuse(const std::string& what) const { detail::raise(error_code::parse_error, message(what, false)); }

 private:
  std::string message(const std::string& what, bool damaged) const {
    if (name_.empty()) return context_ + what;
    return name_ + (damaged ? " is corrupted or truncated: " : ": ") + what;
  }
  static std::string piece_name(std::size_t k, std::string_view label) {
    std::string text = "piece " + std::to_string(k);
    if (!label.empty()) (text += " (") += std::string(label) += ")";
    return text;
  }
  std::uint64_t read_into(void* out, std::uint64_t bytes) {
    auto* at = static_cast<char*>(out);
    std::uint64_t got = 0;
    constexpr std::uint64_t step = std::uint64_t{1} << 30;  // streamsize is signed: read large pieces in parts
    while (got < bytes && *in_) {
      const std::uint64_t want = std::min(step, bytes - got);
      in_->read(at + got, static_cast<std::streamsize>(want));
      got += static_cast<std::uint64_t>(in_->gcount());
    }
    return got;
  }

  /// `size`: the file's bytes, or -1 for a stream.
  void read_header(std::uint64_t size) {
    std::array<unsigned char, checkpoint_prefix_bytes> prefix{};
    const auto got = static_cast<std::size_t>(read_into(prefix.data(), prefix.size()));
    const std::string_view magic(reinterpret_cast<const char*>(prefix.data()), std::min<std::size_t>(got, 8));
    const std::string_view ours(detail::checkpoint_magic.data(), detail::checkpoint_magic.size());
    if (magic != ours.substr(0, magic.size())) {
      std::string old_what;
      if (const auto old = detail::legacy_checkpoint_version(magic, prefix.data(), got, old_what); old != 0)
        refuse("it is in format version " + std::to_string(old) + " (magic " + detail::quoted(magic) + ", " +
               old_what + "); this build reads format version " + std::to_string(checkpoint_format_version) +
               " only: load it with the chunkwise that wrote it, or start over");
      refuse("not a chunkwise checkpoint file: its magic is " + detail::quoted(magic) + ", not " +
             detail::quoted(ours));
    }
    if (got >= 12) {
      const auto version = detail::field_at<std::uint32_t>(prefix.data() + 8);
      if (version != checkpoint_format_version)
        refuse("format version " + std::to_string(version) + " is not supported: this build reads format version " +
               std::to_string(checkpoint_format_version));
    }
    if (got < prefix.size())
      corrupted("the input is truncated: it ends after " + std::to_string(got) + " bytes, inside the " +
                std::to_string(prefix.size()) + "-byte header");
    const auto stored_prefix_crc = detail::field_at<std::uint32_t>(prefix.data() + 60);
    if (const std::uint32_t computed = crc32c(prefix.data(), 60); computed != stored_prefix_crc)
      corrupted("checksum mismatch: its header does not match its checksum (stored " + detail::hex32(stored_prefix_crc) +
                ", computed " + detail::hex32(computed) + ")");
    // The prefix is what a writer wrote: its fields may be trusted now.
    if (detail::field_at<std::uint32_t>(prefix.data() + 12) != 0 || detail::field_at<std::uint64_t>(prefix.data() + 48) != 0)
      refuse("reserved header bytes are not zero (a writer newer than format version " +
             std::to_string(checkpoint_format_version) + "?)");
    const std::string_view tag(reinterpret_cast<const char*>(prefix.data() + 16), 8);
    if (tag != expected_.tag_view())
      refuse("it holds kind " + detail::quoted(tag) + ", not " + std::string(expected_.what) + " (kind " +
             detail::quoted(expected_.tag_view()) + ")");
    const auto identity_bytes = detail::field_at<std::uint64_t>(prefix.data() + 24);
    const auto count = detail::field_at<std::uint64_t>(prefix.data() + 32);
    file_bytes_ = detail::field_at<std::uint64_t>(prefix.data() + 40);
    const auto stored_tail_crc = detail::field_at<std::uint32_t>(prefix.data() + 56);
    if (file_bytes_ < prefix.size() || identity_bytes > file_bytes_ - prefix.size() ||
        count > (file_bytes_ - prefix.size() - identity_bytes) / checkpoint_piece_entry_bytes)
      corrupted("its header is inconsistent: " + std::to_string(identity_bytes) + " identity bytes and " +
                std::to_string(count) + " pieces do not fit in the " + std::to_string(file_bytes_) +
                " bytes it says the file has");
    const std::uint64_t header_bytes = checkpoint_header_bytes(identity_bytes, count);
    if (size != static_cast<std::uint64_t>(-1) && size != file_bytes_) {
      if (size < file_bytes_)
        corrupted("the input is truncated: it has " + std::to_string(size) + " bytes, its header promises " +
                  std::to_string(file_bytes_));
      corrupted("it has " + std::to_string(size) + " bytes, " + std::to_string(size - file_bytes_) +
                " more than its header accounts for");
    }
    // Identity and table, read in bounded steps so that a cut-off stream fails before a large allocation.
    std::string tail;
    const std::uint64_t tail_bytes = header_bytes - prefix.size();
    while (tail.size() < tail_bytes) {
      const std::size_t before = tail.size();
      const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(tail_bytes - before, std::uint64_t{1} << 20));
      tail.resize(before + want);
      const auto read = static_cast<std::size_t>(read_into(tail.data() + before, want));
      if (read != want)
        corrupted("the input is truncated: it ends after " + std::to_string(prefix.size() + before + read) +
                  " bytes, inside the " + std::to_string(header_bytes) + "-byte header");
    }
    if (const std::uint32_t computed = crc32c(tail.data(), tail.size()); computed != stored_tail_crc)
      corrupted("checksum mismatch: its header does not match its checksum (stored " + detail::hex32(stored_tail_crc) +
                ", computed " + detail::hex32(computed) + ")");
    identity_ = tail.substr(0, static_cast<std::size_t>(identity_bytes));
    pieces_.resize(static_cast<std::size_t>(count));
    std::uint64_t offset = header_bytes;
    const auto* entry = reinterpret_cast<const unsigned char*>(tail.data()) + identity_bytes;
    for (auto& p : pieces_) {
      p.bytes = detail::field_at<std::uint64_t>(entry);
      p.crc = detail::field_at<std::uint32_t>(entry + 8);
      p.offset = offset;
      if (detail::field_at<std::uint32_t>(entry + 12) != 0) refuse("reserved bytes of its piece table are not zero");
      if (p.bytes > file_bytes_ - offset)
        corrupted("its header is inconsistent: its pieces hold more than the " + std::to_string(file_bytes_) +
                  " bytes it says the file has");
      offset += p.bytes;
      entry += checkpoint_piece_entry_bytes;
    }
    if (offset != file_bytes_)
      corrupted("its header is inconsistent: its pieces end at byte " + std::to_string(offset) + ", the file at " +
                std::to_string(file_bytes_));
  }

  std::unique_ptr<std::ifstream> file_;  // a reader of a file owns it; in_ points to it or to the caller's stream
  std::istream* in_ = nullptr;
  checkpoint_kind expected_;
  std::string context_;  // a stream's: the start of every message
  std::string name_;     // a file's: what every message names
  std::string identity_;
  std::vector<piece> pieces_;
  std::uint64_t file_bytes_ = 0;
  std::size_t next_piece_ = 0;
};

/// Reads an identity's fields in the order checkpoint_fields wrote them. A field past the end, a text longer than
/// its limit or bytes left over are the file's damage, reported in its reader's words.
class checkpoint_field_reader {
 public:
  explicit checkpoint_field_reader(const checkpoint_format_reader& file) : file_(file), bytes_(file.identity()) {}

  template <class T>
  T take() {
    static_assert(std::is_integral_v<T>, "checkpoint fields are integers");
    if (bytes_.size() - at_ < sizeof(T)) short_of(sizeof(T));
    const T value = detail::field_at<T>(reinterpret_cast<const unsigned char*>(bytes_.data()) + at_);
    at_ += sizeof(T);
    return value;
  }
  std::string take_text(std::size_t max_length) {
    const auto length = take<std::uint32_t>();
    if (length > max_length)
      file_.corrupted("a text field of its identity claims " + std::to_string(length) + " characters, more than the " +
                      std::to_string(max_length) + " it may have");
    if (bytes_.size() - at_ < length) short_of(length);
    std::string text(bytes_.substr(at_, length));
    at_ += length;
    return text;
  }
  /// Every field was read: none is left over.
  void finish() const {
    if (at_ != bytes_.size())
      file_.corrupted("its identity has " + std::to_string(bytes_.size() - at_) + " bytes after its last field");
  }

 private:
  [[noreturn]] void short_of(std::size_t wanted) const {
    file_.corrupted("its identity ends after " + std::to_string(bytes_.size()) + " bytes, inside a field of " +
                    std::to_string(wanted) + " bytes at byte " + std::to_string(at_));
  }
  const checkpoint_format_reader& file_;
  std::string_view bytes_;
  std::size_t at_ = 0;
};

}  // namespace chunkwise
