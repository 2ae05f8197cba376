#pragma once
// The life cycle of one chunk on one rank (DESIGN.md), as a checked state machine with counters:
//
//   released --fetch--> fetching --arrived--> ready --acquire--> in_use --release--> ready
//   ready --evict--> released                               (the device copy is dropped; the home shard stays)
//   in_use --release after its last backward--> grad_pending --reduced--> reduced
//   ready or released --gradients handed over (grad_ready, after the chunk was released)--> grad_pending
//   reduced --updated at home--> released                   (streamed chunks: the optimizer ran on the home tier)
//   reduced --updated on device--> ready                    (resident chunks)
//
// in_use counts its users (a tied chunk is acquired by two layers at once). Any other transition throws
// error_code::illegal_state naming the chunk, both states and the legal moves. Every transition is counted.
#include <chunkwise/core/error.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace chunkwise {

enum class chunk_state : std::uint8_t { released, fetching, ready, in_use, grad_pending, reduced };
inline constexpr std::size_t chunk_state_count = 6;

constexpr std::string_view to_string(chunk_state state) noexcept {
  switch (state) {
    case chunk_state::released: return "released";
    case chunk_state::fetching: return "fetching";
    case chunk_state::ready: return "ready";
    case chunk_state::in_use: return "in_use";
    case chunk_state::grad_pending: return "grad_pending";
    case chunk_state::reduced: return "reduced";
  }
  return "?";
}

/// The legal moves of the diagram above (in_use -> in_use: another user acquires or one of several releases).
constexpr bool legal_transition(chunk_state from, chunk_state to) noexcept {
  using enum chunk_state;
  switch (from) {
    case released: return to == fetching || to == grad_pending;
    case fetching: return to == ready;
    case ready: return to == in_use || to == released || to == grad_pending;
    case in_use: return to == in_use || to == ready || to == grad_pending;
    case grad_pending: return to == reduced;
    case reduced: return to == released || to == ready;
  }
  return false;
}

/// Transition counts: transitions[from][to].
struct chunk_statistics {
  std::array<std::array<std::uint64_t, chunk_state_count>, chunk_state_count> transitions{};

  [[nodiscard]] constexpr std::uint64_t count(chunk_state from, chunk_state to) const noexcept {
    return transitions[static_cast<std::size_t>(from)][static_cast<std::size_t>(to)];
  }
  [[nodiscard]] constexpr std::uint64_t total() const noexcept {
    std::uint64_t n = 0;
    for (const auto& row : transitions)
      for (const auto c : row) n += c;
    return n;
  }
  constexpr chunk_statistics& operator+=(const chunk_statistics& other) noexcept {
    for (std::size_t i = 0; i < chunk_state_count; ++i)
      for (std::size_t j = 0; j < chunk_state_count; ++j) transitions[i][j] += other.transitions[i][j];
    return *this;
  }
};

class chunk_life {
 public:
  /// `chunk` names the chunk in errors; resident chunks start ready (their data is on the device from the start).
  explicit chunk_life(std::uint32_t chunk, chunk_state initial = chunk_state::released) noexcept
      : chunk_(chunk), state_(initial) {}

  [[nodiscard]] chunk_state state() const noexcept { return state_; }
  [[nodiscard]] std::uint32_t users() const noexcept { return users_; }
  [[nodiscard]] const chunk_statistics& statistics() const noexcept { return statistics_; }

  void start_fetch() { move(chunk_state::fetching); }
  void arrived() { move(chunk_state::ready); }
  void evict() { move(chunk_state::released); }

  /// A layer starts using the chunk (ready or already in use).
  void acquire() {
    move(chunk_state::in_use);
    ++users_;
  }
  /// A layer is done with it. `gradients_complete`: this was the chunk's last use in backward, so its gradients are
  /// all accumulated and may be reduced (only with no other user left).
  void release(bool gradients_complete = false) {
    if (state_ != chunk_state::in_use) raise_illegal(chunk_state::ready);
    if (users_ == 1) {
      move(gradients_complete ? chunk_state::grad_pending : chunk_state::ready);
    } else {
      if (gradients_complete)
        detail::raise(error_code::illegal_state,
                      "chunk " + std::to_string(chunk_) + ": its gradients were declared complete while " +
                          std::to_string(users_ - 1) + " other layer(s) still use it");
      move(chunk_state::in_use);
    }
    --users_;
  }
  /// The trainer handed the chunk's gradients over (explicit hand-over) after its last release.
  void handed_over() { move(chunk_state::grad_pending); }
  void reduced() { move(chunk_state::reduced); }
  /// The optimizer updated the chunk: on its home tier (the device copy is stale: released) or on the device (ready).
  void updated(bool on_device) { move(on_device ? chunk_state::ready : chunk_state::released); }

 private:
  void move(chunk_state to) {
    if (!legal_transition(state_, to)) raise_illegal(to);
    ++statistics_.transitions[static_cast<std::size_t>(state_)][static_cast<std::size_t>(to)];
    state_ = to;
  }
  [[noreturn]] void raise_illegal(chunk_state to) const {
    std::string legal;
    for (std::size_t s = 0; s < chunk_state_count; ++s)
      if (legal_transition(state_, static_cast<chunk_state>(s)))
        legal += (legal.empty() ? "" : ", ") + std::string(to_string(static_cast<chunk_state>(s)));
    detail::raise(error_code::illegal_state, "chunk " + std::to_string(chunk_) + ": illegal transition " +
                                                 std::string(to_string(state_)) + " -> " + std::string(to_string(to)) +
                                                 "; from " + std::string(to_string(state_)) + " it may go to " + legal);
  }

  std::uint32_t chunk_;
  chunk_state state_;
  std::uint32_t users_ = 0;
  chunk_statistics statistics_;
};

}  // namespace chunkwise
