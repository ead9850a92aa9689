// See Note [Watchdog] in watchdog.hpp.
#include "train/watchdog.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "common/start_thread.hpp"
#include "lockstep/comm.hpp"
#include "train/trace.hpp"

namespace lockstep::detail {

Heartbeats::Heartbeats(int workers, double now_s)
    : workers_(workers),
      last_s_(std::make_unique<std::atomic<double>[]>(workers)),
      points_(std::make_unique<std::atomic<std::int64_t>[]>(workers)),
      step_(std::make_unique<std::atomic<std::int64_t>[]>(workers)),
      phase_(std::make_unique<std::atomic<const char*>[]>(workers)) {
  for (int r = 0; r < workers; ++r) {
    last_s_[r].store(now_s);
    points_[r].store(0);
    step_[r].store(0);
    phase_[r].store("starting");
  }
}

void Heartbeats::enter(int rank, const char* phase) { phase_[rank].store(phase); }

void Heartbeats::beat(int rank, std::int64_t step) {
  step_[rank].store(step);
  points_[rank].fetch_add(1);
  last_s_[rank].store(steady_now_s());
}

Heartbeats::Quiet Heartbeats::quiet(double now_s) const {
  int behind = 0;
  double latest = last_s_[0].load();
  for (int r = 1; r < workers_; ++r) {
    if (points_[r].load() < points_[behind].load()) behind = r;
    latest = std::max(latest, last_s_[r].load());
  }
  return {.behind = behind, .step = step_[behind].load(), .silent_s = now_s - latest};
}

Watchdog::Watchdog(const Heartbeats& heartbeats, double timeout_s, Communicator& comm,
                   OnTimeout on_timeout)
    : heartbeats_(heartbeats), timeout_s_(timeout_s), comm_(comm), on_timeout_(std::move(on_timeout)) {
  if (timeout_s_ > 0.0) thread_ = start_thread("the watchdog thread", [this] { watch(); });
}

Watchdog::~Watchdog() {
  finished_.store(true);
  if (thread_.joinable()) thread_.join();
}

void Watchdog::watch() {
  const auto poll = std::chrono::duration<double>(std::min(0.1, timeout_s_ / 4));
  while (!finished_.load() && !comm_.aborted()) {
    std::this_thread::sleep_for(poll);
    const Heartbeats::Quiet q = heartbeats_.quiet(steady_now_s());
    if (q.silent_s > timeout_s_ && !finished_.load()) {
      on_timeout_(q.behind, fmt::format("no progress for {:.1f} s at step {}; the other workers "
                                        "wait for it (trainer.step_timeout_s: {})",
                                        q.silent_s, q.step, timeout_s_));
      comm_.abort();
    }
  }
}

}  // namespace lockstep::detail
