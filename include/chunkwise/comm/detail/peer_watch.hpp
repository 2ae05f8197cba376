#pragma once
// What a process rank that waited too long for a collective can say of its peers (mpi_comm's timeout): which
// process each rank is and on which machine, and for the peers on this machine whether the process still runs, is
// stopped, or is gone. MPI does not say which rank a collective is waiting for; the peers' processes usually do.
#include <cerrno>
#include <chrono>
#include <csignal>
#include <fstream>
#include <string>
#include <vector>

#include <sys/types.h>
#include <unistd.h>

namespace chunkwise::detail {

/// Words for the state of process `pid` on this machine: "runs", "is stopped (...)" or "is gone (...)".
inline std::string process_state(long pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return "is gone (no such process)";
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return "runs (its state could not be read)";
  // "pid (command) S ...": the state follows the last ')' (a command may hold parentheses).
  const auto close = line.rfind(')');
  const char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
  if (state == 'T' || state == 't') return "is stopped (SIGSTOP, a debugger or job control)";
  if (state == 'Z' || state == 'X') return "is gone (it exited: a zombie its launcher has not reaped)";
  return "runs";
}

struct peer_watch {
  std::chrono::milliseconds timeout{0};  // 0: wait as long as MPI does
  int rank = 0;
  std::vector<long> pids;          // by rank
  std::vector<std::string> hosts;  // by rank
  std::string failure;             // set when a wait timed out: nothing on the communicator completes after that

  /// The peers on this machine that do not run, or that all do; the peers elsewhere by count.
  [[nodiscard]] std::string describe_peers() const {
    std::string not_running, elsewhere;
    int running = 0, remote = 0;
    for (std::size_t q = 0; q < pids.size(); ++q) {
      if (static_cast<int>(q) == rank) continue;
      if (hosts[q] != hosts[static_cast<std::size_t>(rank)]) {
        ++remote;
        continue;
      }
      const std::string state = process_state(pids[q]);
      if (state.rfind("runs", 0) == 0) {
        ++running;
        continue;
      }
      not_running += (not_running.empty() ? "" : "; ") + std::string("rank ") + std::to_string(q) + " (pid " +
                     std::to_string(pids[q]) + ") " + state;
    }
    std::string text = not_running.empty() ? "every peer on this machine runs (" + std::to_string(running) + ")"
                                           : not_running;
    if (remote > 0)
      text += "; " + std::to_string(remote) + " rank(s) on other machines cannot be checked from here";
    return text;
  }
};

}  // namespace chunkwise::detail
