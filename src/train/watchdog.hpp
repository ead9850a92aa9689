// The step timeout (trainer.step_timeout_s).
//
// Note [Watchdog]
//   One stalled worker soon leaves the others waiting for it in a collective, so the whole group
//   goes quiet. Each worker beats its Heartbeats entry at fixed points of its step (every rank
//   passes the same points in the same order). When no worker has beaten for step_timeout_s,
//   the one that has passed the fewest points is the culprit, and the run is aborted in its name.
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

// Per local worker: when it last showed progress, how many progress points it has passed, and
// its step then. Written by each worker on its own thread, read by the watchdog.
class Heartbeats {
 public:
  Heartbeats(int workers, double now_s);
  void beat(int rank, std::int64_t step);
  // What worker `rank` does now (a string literal): for the report of a worker that does not
  // return (Note [Bounded stop] in trainer.cpp). Not progress: the watchdog ignores it.
  void enter(int rank, const char* phase);
  const char* phase(int rank) const { return phase_[rank].load(); }
  std::int64_t step(int rank) const { return step_[rank].load(); }

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
  std::unique_ptr<std::atomic<const char*>[]> phase_;
};

// A thread that aborts `comm`'s group once the workers have been quiet for `timeout_s`, after
// calling `on_timeout` with the culprit (a local rank) and a message saying what happened.
// Does nothing when timeout_s is 0. Stops when destroyed or when the group is aborted.
class Watchdog {
 public:
  using OnTimeout = std::function<void(int rank, const std::string& message)>;
  Watchdog(const Heartbeats& heartbeats, double timeout_s, Communicator& comm,
           OnTimeout on_timeout);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void watch();

  const Heartbeats& heartbeats_;
  double timeout_s_;
  Communicator& comm_;
  OnTimeout on_timeout_;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace lockstep::detail
