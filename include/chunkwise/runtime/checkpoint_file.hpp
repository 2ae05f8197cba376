#pragma once
// The runtime's checkpoint: one file per rank holding that rank's owned pieces of every tensor (parameters and Adam's
// two moments), so a checkpoint is independent of the chunk layout and loads with any rank count or plan (resharding).
//
// A save writes <dir>/step-<S>/rank-<r>-of-<N>.chunkwise on every rank (temporary file, fsync, rename), then rank 0
// commits it by replacing <dir>/LATEST ("step-<S> <N>") atomically and removes older step directories: a run killed
// mid-save leaves the previous checkpoint whole.
//
// File layout (little-endian):
//   "CHKWCK02"                                          magic and format version
//   u32 model name length, name, u32 plan name length, name
//   u64 tensor hash (FNV-1a over names and element counts), u64 ranks, u64 rank, u64 optimizer steps, u64 pieces
//   pieces x { u32 tensor, u64 first element, u64 elements, u64 data offset, u32 CRC-32C of the data }
//   u32 CRC-32C of everything above
//   data: per piece, its parameters, then moment 1, then moment 2 (fp32)
// A reader verifies the header's checksum before trusting any field and each piece's checksum when it reads it.
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/checksum.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chunkwise::inline CHUNKWISE_ABI {

struct checkpoint_identity {
  std::string model;
  std::string plan;
  std::uint64_t tensor_hash = 0;
  std::uint64_t ranks = 0;
  std::uint64_t rank = 0;
  std::uint64_t steps = 0;
};

/// Elements [first, first + elements) of one tensor, with their parameters and moments.
struct checkpoint_piece {
  std::uint32_t tensor = 0;
  std::uint64_t first = 0;
  std::uint64_t elements = 0;
  std::uint64_t data_offset = 0;  // in the file (set by encode and by the reader)
  std::uint32_t crc = 0;
};

namespace detail {

inline constexpr std::string_view checkpoint_magic = "CHKWCK02";

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}
inline void put_text(std::string& out, const std::string& text) {
  put(out, static_cast<std::uint32_t>(text.size()));
  out += text;
}

}  // namespace detail

/// The bytes of one rank's file. `values[k]` holds piece k's 3 * elements floats (parameters, moment 1, moment 2).
inline std::string encode_checkpoint(const checkpoint_identity& id, std::vector<checkpoint_piece> pieces,
                                     const std::vector<std::vector<float>>& values) {
  std::string header(detail::checkpoint_magic);
  detail::put_text(header, id.model);
  detail::put_text(header, id.plan);
  for (const std::uint64_t field : {id.tensor_hash, id.ranks, id.rank, id.steps, std::uint64_t{pieces.size()}})
    detail::put(header, field);
  constexpr std::size_t entry_bytes = 4 + 8 + 8 + 8 + 4;
  std::uint64_t offset = header.size() + pieces.size() * entry_bytes + sizeof(std::uint32_t);
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    auto& p = pieces[k];
    p.data_offset = offset;
    p.crc = crc32c(values[k].data(), values[k].size() * sizeof(float));
    offset += values[k].size() * sizeof(float);
    detail::put(header, p.tensor);
    detail::put(header, p.first);
    detail::put(header, p.elements);
    detail::put(header, p.data_offset);
    detail::put(header, p.crc);
  }
  detail::put(header, crc32c(header.data(), header.size()));
  for (const auto& v : values) header.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return header;
}

/// One rank's checkpoint file, opened and its header verified; pieces are read (and verified) on demand.
class checkpoint_reader {
 public:
  explicit checkpoint_reader(const std::filesystem::path& file) : file_(file), in_(file, std::ios::binary) {
    if (!in_) detail::raise(error_code::io_error, "checkpoint '" + file.string() + "': cannot open it");
    in_.seekg(0, std::ios::end);
    size_ = static_cast<std::uint64_t>(in_.tellg());
    in_.seekg(0);
    std::string magic(detail::checkpoint_magic.size(), '\0');
    if (!read_into(magic.data(), magic.size()) || magic != detail::checkpoint_magic)
      detail::raise(error_code::parse_error, "checkpoint '" + file.string() +
                                                 "' is not a chunkwise checkpoint of this version (format 02)");
    std::string header = magic;
    id_.model = text(header);
    id_.plan = text(header);
    for (auto* field : {&id_.tensor_hash, &id_.ranks, &id_.rank, &id_.steps}) *field = number<std::uint64_t>(header);
    const auto count = number<std::uint64_t>(header);
    if (count > size_ / 32) corrupted();
    pieces_.resize(count);
    for (auto& p : pieces_) {
      p.tensor = number<std::uint32_t>(header);
      p.first = number<std::uint64_t>(header);
      p.elements = number<std::uint64_t>(header);
      p.data_offset = number<std::uint64_t>(header);
      p.crc = number<std::uint32_t>(header);
    }
    std::uint32_t stored = 0;
    if (!read_into(&stored, sizeof stored) || stored != crc32c(header.data(), header.size())) corrupted();
    for (const auto& p : pieces_)
      if (p.elements > size_ || p.data_offset > size_ || p.data_offset + 3 * p.elements * sizeof(float) > size_)
        corrupted();
  }

  [[nodiscard]] const checkpoint_identity& identity() const noexcept { return id_; }
  [[nodiscard]] const std::vector<checkpoint_piece>& pieces() const noexcept { return pieces_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return file_; }

  /// Piece k's 3 * elements floats, checked against its checksum.
  std::vector<float> read(std::size_t k) {
    const auto& p = pieces_.at(k);
    std::vector<float> values(3 * p.elements);
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(p.data_offset));
    if (!read_into(values.data(), values.size() * sizeof(float)) ||
        crc32c(values.data(), values.size() * sizeof(float)) != p.crc)
      detail::raise(error_code::parse_error, "checkpoint '" + file_.string() + "' is corrupted or truncated: piece " +
                                                 std::to_string(k) + " (tensor " + std::to_string(p.tensor) +
                                                 ", elements " + std::to_string(p.first) + ".." +
                                                 std::to_string(p.first + p.elements) + ") does not match its checksum");
    return values;
  }

 private:
  [[noreturn]] void corrupted() const {
    detail::raise(error_code::parse_error, "checkpoint '" + file_.string() +
                                               "' is corrupted or truncated: its header does not match its checksum");
  }
  bool read_into(void* out, std::size_t bytes) {
    in_.read(static_cast<char*>(out), static_cast<std::streamsize>(bytes));
    return static_cast<std::size_t>(in_.gcount()) == bytes;
  }
  template <class T>
  T number(std::string& header) {
    T value{};
    if (!read_into(&value, sizeof value)) corrupted();
    header.append(reinterpret_cast<const char*>(&value), sizeof value);
    return value;
  }
  std::string text(std::string& header) {
    const auto length = number<std::uint32_t>(header);
    if (length > 4096) corrupted();
    std::string value(length, '\0');
    if (!read_into(value.data(), length)) corrupted();
    header += value;
    return value;
  }

  std::filesystem::path file_;
  std::ifstream in_;
  std::uint64_t size_ = 0;
  checkpoint_identity id_;
  std::vector<checkpoint_piece> pieces_;
};

/// The committed step directory and rank count of a checkpoint directory (its LATEST file).
struct checkpoint_commit {
  std::filesystem::path step_directory;
  std::uint64_t ranks = 0;
};

inline std::filesystem::path checkpoint_rank_file(const std::filesystem::path& step_directory, std::uint64_t rank,
                                                  std::uint64_t ranks) {
  return step_directory / ("rank-" + std::to_string(rank) + "-of-" + std::to_string(ranks) + ".chunkwise");
}

inline checkpoint_commit read_checkpoint_commit(const std::filesystem::path& directory) {
  const auto latest = directory / "LATEST";
  if (!std::filesystem::exists(latest)) {
    std::string found;
    if (std::filesystem::is_directory(directory))
      for (const auto& entry : std::filesystem::directory_iterator(directory))
        found += (found.empty() ? "" : ", ") + entry.path().filename().string();
    detail::raise(error_code::io_error, "checkpoint: no LATEST file in '" + directory.string() + "' (found: " +
                                            (found.empty() ? "nothing" : found) +
                                            "); save_checkpoint writes it when every rank's file is complete");
  }
  const std::string text = read_file(latest);
  const auto space = text.find(' ');
  checkpoint_commit commit;
  try {
    if (space == std::string::npos || text.rfind("step-", 0) != 0) throw std::invalid_argument("format");
    commit.step_directory = directory / text.substr(0, space);
    commit.ranks = std::stoull(text.substr(space + 1));
  } catch (const std::exception&) {
    detail::raise(error_code::parse_error, "checkpoint '" + latest.string() + "' is not 'step-<S> <ranks>': '" +
                                               text.substr(0, 64) + "'");
  }
  if (commit.ranks == 0 || commit.ranks > 65536)
    detail::raise(error_code::parse_error, "checkpoint '" + latest.string() + "' names " +
                                               std::to_string(commit.ranks) + " ranks");
  return commit;
}

}  // namespace chunkwise
