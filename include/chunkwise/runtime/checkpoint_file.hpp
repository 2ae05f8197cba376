#pragma once
// The runtime's checkpoint: one file per rank holding that rank's owned pieces of every tensor (parameters and Adam's
// two moments), so a checkpoint is independent of the chunk layout and loads with any rank count or plan (resharding).
//
// A save writes <dir>/step-<S>/rank-<r>-of-<N>.chunkwise on every rank (temporary file, fsync, rename), then rank 0
// commits it by replacing <dir>/LATEST ("step-<S> <N>") atomically and removes older step directories: a run killed
// mid-save leaves the previous checkpoint whole.
//
// A rank file is a file of chunkwise's checkpoint format (core/checkpoint_format.hpp: header with magic, version and
// checksums, pieces each with its CRC-32C) of kind "rankfile". Its identity (little-endian):
//   u32 model name length, name, u32 plan name length, name
//   u64 tensor hash (FNV-1a over names and element counts), u64 ranks, u64 rank, u64 optimizer steps
//   per piece: u32 tensor, u64 first element, u64 elements
// and piece k holds that range's parameters, then moment 1, then moment 2 (3 * elements fp32).
// The format's reader verifies the header before any field is trusted and each piece when it is read. Format
// version 3 replaced the runtime's own format 2 ("CHKWCK02"), whose files are refused with both versions named.
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/core/checkpoint_format.hpp>
#include <chunkwise/core/error.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chunkwise {

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
  std::uint64_t data_offset = 0;  // in the file (set by the reader)
  std::uint32_t crc = 0;          // CRC-32C of its data (set by the reader)
};

/// The kind tag of a runtime checkpoint's rank file in chunkwise's checkpoint format.
inline constexpr checkpoint_kind checkpoint_rank_file_kind{"rankfile", "a runtime checkpoint rank file", "checkpoint"};

namespace detail {
inline constexpr std::size_t checkpoint_name_limit = 4096;  // characters of a model or plan name
}  // namespace detail

/// The bytes of one rank's file. `values[k]` holds piece k's 3 * elements floats (parameters, moment 1, moment 2).
inline std::string encode_checkpoint(const checkpoint_identity& id, const std::vector<checkpoint_piece>& pieces,
                                     const std::vector<std::vector<float>>& values) {
  if (values.size() != pieces.size())
    detail::raise(error_code::invalid_argument, "encode_checkpoint: " + std::to_string(pieces.size()) +
                                                    " pieces and " + std::to_string(values.size()) + " value arrays");
  checkpoint_fields identity;
  identity.put_text(id.model).put_text(id.plan).put(id.tensor_hash).put(id.ranks).put(id.rank).put(id.steps);
  for (const auto& p : pieces) identity.put(p.tensor).put(p.first).put(p.elements);
  checkpoint_format_writer writer(checkpoint_rank_file_kind, std::move(identity).bytes());
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    if (values[k].size() != 3 * pieces[k].elements)
      detail::raise(error_code::invalid_argument, "encode_checkpoint: piece " + std::to_string(k) + " has " +
                                                      std::to_string(values[k].size()) + " values, not 3 * " +
                                                      std::to_string(pieces[k].elements));
    writer.add_piece(std::span<const float>(values[k]));
  }
  return writer.bytes();
}

/// One rank's checkpoint file, opened and its header verified; pieces are read (and verified) on demand.
class checkpoint_reader {
 public:
  explicit checkpoint_reader(const std::filesystem::path& file) : file_(file), format_(file, checkpoint_rank_file_kind) {
    checkpoint_field_reader fields(format_);
    id_.model = fields.take_text(detail::checkpoint_name_limit);
    id_.plan = fields.take_text(detail::checkpoint_name_limit);
    for (auto* field : {&id_.tensor_hash, &id_.ranks, &id_.rank, &id_.steps}) *field = fields.take<std::uint64_t>();
    pieces_.resize(format_.pieces().size());
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      auto& p = pieces_[k];
      p.tensor = fields.take<std::uint32_t>();
      p.first = fields.take<std::uint64_t>();
      p.elements = fields.take<std::uint64_t>();
      p.data_offset = format_.pieces()[k].offset;
      p.crc = format_.pieces()[k].crc;
      if (format_.pieces()[k].bytes / (3 * sizeof(float)) != p.elements || format_.pieces()[k].bytes % (3 * sizeof(float)) != 0)
        format_.corrupted(label(k) + " holds " + std::to_string(format_.pieces()[k].bytes) + " bytes, not those of 3 * " +
                          std::to_string(p.elements) + " floats");
    }
    fields.finish();
  }

  [[nodiscard]] const checkpoint_identity& identity() const noexcept { return id_; }
  [[nodiscard]] const std::vector<checkpoint_piece>& pieces() const noexcept { return pieces_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return file_; }

  /// Piece k's 3 * elements floats, checked against its checksum.
  std::vector<float> read(std::size_t k) {
    const auto& p = pieces_.at(k);
    std::vector<float> values(3 * p.elements);
    format_.read_piece(k, values.data(), "tensor " + std::to_string(p.tensor) + ", elements " + std::to_string(p.first) +
                                             ".." + std::to_string(p.first + p.elements));
    return values;
  }

 private:
  static std::string label(std::size_t k) { return "piece " + std::to_string(k); }

  std::filesystem::path file_;
  checkpoint_format_reader format_;
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
