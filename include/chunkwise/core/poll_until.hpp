#pragma once
// poll_until: wait for a condition by polling, yielding the core between polls, for at most a given time. The waits
// of a latency-bound stream of short operations (a thread rank's worker between collectives, the ranks' rendezvous,
// a request's completion) call it before they sleep: a peer usually answers within microseconds, while waking a
// sleeping thread costs tens of them on a virtual machine whose idle core halts. Yielding, not spinning, so that
// threads that outnumber the cores still take turns.
#include <chrono>
#include <thread>

namespace chunkwise {

/// Polls `ready()` until it returns true (then true) or `limit` has passed (then false). A zero limit polls once.
template <class Ready>
[[nodiscard]] bool poll_until(std::chrono::microseconds limit, Ready&& ready) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace chunkwise
