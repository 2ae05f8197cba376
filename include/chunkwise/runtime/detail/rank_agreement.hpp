#pragma once
// Agreements among ranks, each one small collective: that every rank runs the same plan on the same model (or the
// collectives would pair mismatched buffers: thread_comm notices, MPI and NCCL may not), and that an operation
// succeeded on every rank (a checkpoint save or load that fails on one rank fails on all, never a hang).
#include <chunkwise/comm/concepts.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/hash.hpp>
#include <chunkwise/profile/model_profile.hpp>
#include <chunkwise/runtime/detail/host_exchange.hpp>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace chunkwise::detail {

/// FNV-1a over the tensors' names and element counts: what a checkpoint and the plan agreement compare.
inline std::uint64_t tensor_list_hash(const model_profile& model) {
  fnv1a hash;
  for (const auto& t : model.tensors) hash.add(t.name.view()).add(t.elements);
  return hash.value();
}

/// One all-gather of `fingerprint`; a rank that differs from rank 0 fails every rank, naming it and `running`.
template <communicator Comm>
void agree_on_fingerprint(host_exchange<Comm>& comm, std::uint64_t fingerprint, const std::string& running) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const std::uint64_t>(&fingerprint, 1), std::span<std::uint64_t>(all));
  for (std::size_t q = 0; q < all.size(); ++q)
    if (all[q] != all[0])
      raise(error_code::invalid_argument,
            "runtime: the ranks disagree on the plan: rank " + std::to_string(q) +
                " differs from rank 0 in its plan, model or layout knobs (this is rank " + std::to_string(comm.rank()) +
                ", running " + running + "); every rank must choose the same plan from the same model and machine "
                "profile");
}

/// Runs `body`; then the ranks agree: if any rank failed, every rank throws (its own error, or one naming how many
/// other ranks failed).
template <communicator Comm, class Body>
void agree_on_outcome(host_exchange<Comm>& comm, const char* what, const std::filesystem::path& directory,
                      Body&& body) {
  std::exception_ptr failure;
  try {
    body();
  } catch (...) {  // every failure, out_of_memory included (it is no unambiguous std::exception)
    failure = std::current_exception();
  }
  const float failed = failure ? 1.0f : 0.0f;
  float failures = 0.0f;
  comm.all_reduce(std::span<const float>(&failed, 1), std::span<float>(&failures, 1), reduce_op::sum);
  if (failure) std::rethrow_exception(failure);
  if (failures > 0.0f)
    raise(error_code::io_error, std::string("checkpoint ") + what + " '" + directory.string() + "': " +
                                    std::to_string(static_cast<int>(failures)) +
                                    " other rank(s) failed (their errors say why); " +
                                    (std::string_view(what) == "load" ? "nothing was restored"
                                                                      : "the previous checkpoint stays"));
}

}  // namespace chunkwise::detail
