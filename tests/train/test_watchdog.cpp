// Heartbeats and the watchdog's names for phases (Note [Watchdog] in src/train/watchdog.hpp).
#include <doctest/doctest.h>

#include "train/trace.hpp"
#include "train/watchdog.hpp"

using namespace lockstep::detail;

TEST_CASE("phases are named with their bucket: backward bucket k, all-reduce k") {
  CHECK(describe(Phase::warm_up, -1) == "warm-up");
  CHECK(describe(Phase::forward, -1) == "forward");
  CHECK(describe(Phase::backward, -1) == "backward");
  CHECK(describe(Phase::backward, 2) == "backward bucket 2");
  CHECK(describe(Phase::all_reduce, 3) == "all-reduce 3");
  CHECK(describe(Phase::optimizer, -1) == "optimiser");
  CHECK(describe(Phase::eval, -1) == "eval");
  CHECK(describe(Phase::checkpoint, -1) == "checkpoint");

  Heartbeats beats(2, steady_now_s());
  CHECK(beats.phase(1) == "starting");
  beats.enter(1, Phase::backward, 0);
  beats.enter(0, Phase::all_reduce, 12);
  CHECK(beats.phase(1) == "backward bucket 0");
  CHECK(beats.phase(0) == "all-reduce 12");
}

TEST_CASE("alive() keeps the watchdog quiet without counting as a progress point") {
  const double t0 = steady_now_s();
  Heartbeats beats(2, t0);
  beats.beat(0, 1);
  beats.beat(0, 1);
  beats.beat(1, 1);
  // Worker 1 is busy in a long healthy stretch (an eval, a save): it is alive, but it has still
  // passed fewer points than worker 0, so a later stall would still be pinned on the right one.
  for (int i = 0; i < 5; ++i) beats.alive(1);
  const Heartbeats::Quiet q = beats.quiet(steady_now_s());
  CHECK(q.behind == 1);
  CHECK(q.step == 1);
  CHECK(q.silent_s < 1.0);
  CHECK(beats.quiet(t0 + 1000.0).silent_s > 900.0);
}
