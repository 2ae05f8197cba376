#include <chunkwise/runtime/chunk_state.hpp>

#include <doctest/doctest.h>

using namespace chunkwise;

static_assert(legal_transition(chunk_state::released, chunk_state::fetching));
static_assert(!legal_transition(chunk_state::released, chunk_state::in_use));
static_assert(!legal_transition(chunk_state::grad_pending, chunk_state::released));

TEST_CASE("a streamed chunk goes through the whole life cycle and every move is counted") {
  chunk_life life(7);
  life.start_fetch();
  life.arrived();
  life.acquire();
  life.release();              // forward done
  life.evict();                // dropped until backward
  life.start_fetch();
  life.arrived();
  life.acquire();
  life.release(true);          // last backward use: gradients complete
  CHECK(life.state() == chunk_state::grad_pending);
  life.reduced();
  life.updated(/*on_device=*/false);
  CHECK(life.state() == chunk_state::released);
  const auto& s = life.statistics();
  CHECK(s.count(chunk_state::released, chunk_state::fetching) == 2);
  CHECK(s.count(chunk_state::ready, chunk_state::in_use) == 2);
  CHECK(s.count(chunk_state::in_use, chunk_state::grad_pending) == 1);
  CHECK(s.count(chunk_state::reduced, chunk_state::released) == 1);
  CHECK(s.total() == 11);
}

TEST_CASE("a tied chunk counts its users and only its last release completes the gradients") {
  chunk_life life(0, chunk_state::ready);  // resident
  life.acquire();
  life.acquire();
  CHECK(life.users() == 2);
  CHECK_THROWS_WITH_AS(life.release(true), doctest::Contains("1 other layer(s) still use it"), error);
  life.release();
  CHECK(life.state() == chunk_state::in_use);
  life.release(true);
  CHECK(life.state() == chunk_state::grad_pending);
  life.reduced();
  life.updated(/*on_device=*/true);
  CHECK(life.state() == chunk_state::ready);
}

TEST_CASE("illegal transitions throw naming the chunk, both states and the legal moves") {
  chunk_life life(3);
  CHECK_THROWS_WITH_AS(life.acquire(),
                       doctest::Contains("chunk 3: illegal transition released -> in_use; from released it may go to fetching, grad_pending"),
                       error);
  try {
    life.reduced();
  } catch (const error& e) {
    CHECK(e.code() == error_code::illegal_state);
  }
  life.start_fetch();
  CHECK_THROWS_WITH_AS(life.release(), doctest::Contains("illegal transition fetching -> ready")  // not in use
                       , error);
  CHECK(life.statistics().total() == 1);  // failed moves are not counted
}
