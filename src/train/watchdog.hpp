// The step timeout (trainer.step_timeout_s).
//
// Note [Watchdog]
//   One stalled worker soon leaves the others waiting for it in a collective, so the whole group
//   goes quiet. Each worker beats its Heartbeats entry at fixed points of its step (every rank
//   passes the same points in the same order), and inside the long stretches that are healthy
//   however slow they are: after each eval batch and each stage of a checkpoint save, so that a
//   slow file system does not trip the timeout. When no worker has beaten for step_timeout_s,
//   the one that has passed the fewest points is the culprit, and the whole group is aborted
//   in its name, the message naming the phase every worker was in. The abort also ends the
//   workers' device waits (Note [Abortable waits] in device.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace lockstep {
class Communicator;
}

namespace lockstep::detail {

// What a worker is doing, as its reports name it: "forward", "backward bucket 2" (backward is
// filling bucket 2), "all-reduce 3" (waiting for bucket 3's reduction), "optimiser", "eval",
// "checkpoint", ...
enum class Phase : int {
  starting, set_up, warm_up, forward, backward, totals, all_reduce, optimizer, report, eval,
  replica_check, end_of_step, checkpoint, finish
};
// The phase's name, with its bucket when it has one (index >= 0).
std::string describe(Phase phase, int index);

// Per local worker: when it last showed progress, how many progress points it has passed, its
// step then, and its phase. Written by each worker on its own thread, read by the watchdog.
class Heartbeats {
 public:
  Heartbeats(int workers, double now_s);
  // A progress point: every rank passes the same ones in the same order.
  void beat(int rank, std::int64_t step);
  // Still working, inside a long healthy stretch that ranks need not share (an eval batch, a
  // stage of a checkpoint save): keeps the watchdog quiet without counting a point.
  void alive(int rank);
  // What worker `rank` does now, with the bucket it concerns (-1: none): for the reports of a
  // worker that stalls (Watchdog) or does not return (Note [Bounded stop] in trainer.cpp). Not
  // progress: the watchdog ignores it.
  void enter(int rank, Phase phase, int index = -1);
  // "backward bucket 2"
  std::string phase(int rank) const;
  std::int64_t step(int rank) const { return step_[rank].load(); }
  int workers() const noexcept { return workers_; }

  struct Quiet {
    int behind = 0;          // the local worker that has passed the fewest progress points
    std::int64_t step = 0;   // its step
    double silent_s = 0.0;   // since the latest beat of any worker
  };
  Quiet quiet(double now_s) const;

 private:
  int workers_;
  std::unique_ptr<std::atomic<double>[]> last_s_;
  std::unique_ptr<std::atomic<std::int64_t>[]> points_;
  std::unique_ptr<std::atomic<std::int64_t>[]> step_;
  std::unique_ptr<std::atomic<std::int64_t>[]> phase_;  // Phase << 32 | index + 1, read at once
};

// A thread that aborts `comm`'s group once the workers have been quiet for `timeout_s`, after
// calling `on_timeout` with the culprit (a local rank) and a message saying what happened and
// where every local worker was (by global rank: local rank + first_rank). Does nothing when
// timeout_s is 0. Stops when destroyed or when the group is aborted.
class Watchdog {
 public:
  using OnTimeout = std::function<void(int rank, const std::string& message)>;
  Watchdog(const Heartbeats& heartbeats, double timeout_s, int first_rank, Communicator& comm,
           OnTimeout on_timeout);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void watch();

  const Heartbeats& heartbeats_;
  double timeout_s_;
  int first_rank_;
  Communicator& comm_;
  OnTimeout on_timeout_;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace lockstep::detail
