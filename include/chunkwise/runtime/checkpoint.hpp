#pragma once
// Sharded, atomic, checksummed checkpoints of the runtime's training state, with resharding: each rank saves the
// pieces of every tensor it owns (fp32 master weights and Adam's two moments, read from the home storage) and loads
// the pieces that overlap what it owns in this run's layout, whatever rank count and plan saved them (bf16/fp16 working
// copies are rounded from the loaded master weights). File format and commit
// protocol: runtime/checkpoint_file.hpp. Both are collective calls between steps; the ranks agree on the outcome.
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/atomic_file.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/layout/chunk_map.hpp>
#include <chunkwise/profile/model_profile.hpp>
#include <chunkwise/runtime/checkpoint_file.hpp>
#include <chunkwise/runtime/home_view.hpp>
#include <chunkwise/runtime/detail/rank_agreement.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace chunkwise {

/// What a checkpoint reads and writes: the layout, the chunk records (geometry), the home storage (values), and
/// this rank's identity.
template <class Record, class Homes, communicator Comm>
struct checkpoint_site {
  const model_profile& model;
  const chunk_map& map;
  std::vector<Record>& chunks;
  Homes& homes;
  detail::host_exchange<Comm>& comm;  // the outcomes' agreements
  checkpoint_identity identity;
};

/// Saves the training state after identity.steps steps: each rank writes its owned pieces of every tensor, then
/// rank 0 commits the step. If any rank fails, every rank throws and the previous checkpoint stays the committed one.
template <class Record, class Homes, communicator Comm>
void save_checkpoint(const checkpoint_site<Record, Homes, Comm>& site, const std::filesystem::path& directory) {
  const auto rank = site.identity.rank, ranks = site.identity.ranks;
  char step_name[32];
  std::snprintf(step_name, sizeof step_name, "step-%09llu", static_cast<unsigned long long>(site.identity.steps));
  const auto step_directory = directory / step_name;
  detail::agree_on_outcome(site.comm, "save", directory, [&] {
    std::vector<checkpoint_piece> pieces;
    std::vector<std::vector<float>> values;
    for (auto& b : site.chunks)
      site.homes.read(b.index, [&](const home_view& home) {
        const std::size_t owned_end = b.owned_end();
        for (const auto& slot : site.map.chunks[b.index].slots) {
          const std::size_t first = slot.offset / size_of(home.type);
          const std::size_t lo = std::max(first, b.owned.offset);
          const std::size_t hi = std::min(first + site.model.tensors[slot.tensor].elements, owned_end);
          if (lo >= hi) continue;
          const std::size_t n = hi - lo;
          std::vector<float> v(3 * n);
          const auto at = [](std::size_t i) { return static_cast<std::ptrdiff_t>(i); };
          std::copy_n(home.master.begin() + at(lo - b.owned.offset), n, v.begin());  // fp32 whatever the compute type
          std::copy_n(home.moment1.begin() + at(lo - b.owned.offset), n, v.begin() + at(n));
          std::copy_n(home.moment2.begin() + at(lo - b.owned.offset), n, v.begin() + at(2 * n));
          pieces.push_back({slot.tensor, lo - first, n});
          values.push_back(std::move(v));
        }
      });
    std::filesystem::create_directories(step_directory);
    write_file_atomically(checkpoint_rank_file(step_directory, rank, ranks),
                          encode_checkpoint(site.identity, std::move(pieces), values));
  });
  // Every rank's file is complete: commit, then drop older steps.
  detail::agree_on_outcome(site.comm, "commit", directory, [&] {
    if (rank != 0) return;
    write_file_atomically(directory / "LATEST", std::string(step_name) + " " + std::to_string(ranks));
    for (const auto& entry : std::filesystem::directory_iterator(directory))
      if (entry.is_directory() && entry.path().filename().string().rfind("step-", 0) == 0 &&
          entry.path().filename() != step_name)
        std::filesystem::remove_all(entry.path());
  });
}

namespace detail {

/// What this rank restores into one chunk, and which of those elements the checkpoint covered.
struct staged_chunk {
  std::vector<float> home, moment1, moment2;
  std::vector<unsigned char> have_home, have_moments;
};

// Reads every rank file of the committed step, taking the pieces that overlap this rank's home parameters and
// owned moments in this run's layout; checks that every tensor element this rank needs was found.
template <class Record, class Homes, communicator Comm>
std::vector<staged_chunk> read_checkpoint(const checkpoint_site<Record, Homes, Comm>& site,
                                          const std::filesystem::path& directory, std::uint64_t& steps) {
  const checkpoint_commit commit = read_checkpoint_commit(directory);
  const checkpoint_identity& mine = site.identity;
  const auto& model = site.model;
  std::vector<staged_chunk> staged(site.chunks.size());
  const std::size_t element_bytes = size_of(site.homes.type());
  for (const auto& b : site.chunks) {
    auto& to = staged[b.index];
    to.home.assign(b.home_elements, 0.0f);
    to.moment1.assign(b.owned.elements, 0.0f);
    to.moment2.assign(b.owned.elements, 0.0f);
    to.have_home.assign(b.home_elements, 0);
    to.have_moments.assign(b.owned.elements, 0);
  }
  for (std::uint64_t q = 0; q < commit.ranks; ++q) {
    const auto file = checkpoint_rank_file(commit.step_directory, q, commit.ranks);
    if (!std::filesystem::exists(file))
      raise(error_code::io_error, "checkpoint: '" + file.string() + "' is missing; LATEST names " +
                                      std::to_string(commit.ranks) + " rank files in '" +
                                      commit.step_directory.string() + "'");
    checkpoint_reader reader(file);
    const auto& id = reader.identity();
    if (id.model != mine.model || id.tensor_hash != mine.tensor_hash)
      raise(error_code::invalid_argument, "checkpoint '" + file.string() + "' was saved for another model ('" +
                                              id.model + "'; this run trains '" + mine.model +
                                              "': its tensors' names or sizes differ)");
    if (id.ranks != commit.ranks || id.rank != q || (q > 0 && id.steps != steps))
      raise(error_code::parse_error, "checkpoint '" + file.string() + "' says rank " + std::to_string(id.rank) +
                                         " of " + std::to_string(id.ranks) + " after " + std::to_string(id.steps) +
                                         " steps; LATEST and the other files disagree (a mixed or partly "
                                         "overwritten checkpoint)");
    steps = id.steps;
    for (std::size_t k = 0; k < reader.pieces().size(); ++k) {
      const auto& piece = reader.pieces()[k];
      if (piece.tensor >= model.tensors.size() || piece.first + piece.elements > model.tensors[piece.tensor].elements)
        raise(error_code::parse_error, "checkpoint '" + file.string() + "': piece " + std::to_string(k) +
                                           " lies outside tensor " + std::to_string(piece.tensor));
      const auto& location = site.map.locations[piece.tensor];
      const auto& b = site.chunks[location.chunk];
      auto& to = staged[location.chunk];
      const std::size_t first = location.offset / element_bytes + piece.first, end = first + piece.elements;
      const std::size_t home_first = b.home_first(), home_end = b.home_end(), owned_end = b.owned_end();
      const auto missing = [&](std::size_t lo, std::size_t hi, std::size_t base, const std::vector<unsigned char>& have) {
        for (std::size_t i = lo; i < hi; ++i)
          if (!have[i - base]) return true;
        return false;
      };
      const std::size_t p_lo = std::max(first, home_first), p_hi = std::min(end, home_end);
      const std::size_t m_lo = std::max(first, b.owned.offset), m_hi = std::min(end, owned_end);
      const bool want_params = p_lo < p_hi && missing(p_lo, p_hi, home_first, to.have_home);
      const bool want_moments = m_lo < m_hi && missing(m_lo, m_hi, b.owned.offset, to.have_moments);
      if (!want_params && !want_moments) continue;
      const std::vector<float> values = reader.read(k);
      const std::size_t n = piece.elements;
      for (std::size_t i = p_lo; i < p_hi; ++i) {
        to.home[i - home_first] = values[i - first];
        to.have_home[i - home_first] = 1;
      }
      for (std::size_t i = m_lo; i < m_hi; ++i) {
        to.moment1[i - b.owned.offset] = values[n + i - first];
        to.moment2[i - b.owned.offset] = values[2 * n + i - first];
        to.have_moments[i - b.owned.offset] = 1;
      }
    }
  }
  // Every element of every tensor this rank keeps must have been found.
  for (const auto& b : site.chunks) {
    const auto& to = staged[b.index];
    const std::size_t home_first = b.home_first(), home_end = b.home_end();
    for (const auto& slot : site.map.chunks[b.index].slots) {
      const std::size_t first = slot.offset / element_bytes, end = first + model.tensors[slot.tensor].elements;
      bool complete = true;
      for (std::size_t i = std::max(first, home_first); i < std::min(end, home_end); ++i)
        complete = complete && to.have_home[i - home_first];
      for (std::size_t i = std::max(first, b.owned.offset); i < std::min(end, b.owned_end()); ++i)
        complete = complete && to.have_moments[i - b.owned.offset];
      if (!complete)
        raise(error_code::parse_error, "checkpoint '" + commit.step_directory.string() + "' misses part of tensor '" +
                                           model.tensors[slot.tensor].name.str() + "'; its rank files do not cover "
                                           "the model");
    }
  }
  return staged;
}

}  // namespace detail

/// Restores the committed checkpoint of `directory` into the home storage, saved with any rank count and any plan of
/// the same model; returns its step count. Nothing is restored unless every rank has everything it needs. The caller
/// drops device copies first (homes.invalidate) and resets the chunks' life cycles after.
template <class Record, class Homes, communicator Comm>
std::uint64_t load_checkpoint(const checkpoint_site<Record, Homes, Comm>& site, const std::filesystem::path& directory) {
  std::vector<detail::staged_chunk> staged;
  std::uint64_t steps = 0;
  detail::agree_on_outcome(site.comm, "load", directory, [&] { staged = detail::read_checkpoint(site, directory, steps); });
  for (auto& b : site.chunks) {
    auto& from = staged[b.index];
    site.homes.update(b.index, [&](const home_view& home) {
      home.assign(from.home);
      std::copy(from.moment1.begin(), from.moment1.end(), home.moment1.begin());
      std::copy(from.moment2.begin(), from.moment2.end(), home.moment2.begin());
    });
  }
  return steps;
}

}  // namespace chunkwise
