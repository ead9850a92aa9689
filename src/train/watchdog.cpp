// See Note [Watchdog] in watchdog.hpp.
#include "train/watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/start_thread.hpp"
#include "lockstep/comm.hpp"
#include "train/trace.hpp"

namespace lockstep::detail {

std::string describe(Phase phase, int index) {
  static constexpr const char* kNames[] = {
      "starting", "set-up", "warm-up", "forward", "backward", "the step's all-reduce of totals",
      "all-reduce", "optimiser", "report (callbacks)", "eval", "replica check",
      "end of step", "checkpoint", "finish"};
  const char* name = kNames[static_cast<int>(phase)];
  if (index < 0) return name;
  return phase == Phase::backward ? fmt::format("{} bucket {}", name, index)
                                  : fmt::format("{} {}", name, index);
}

Heartbeats::Heartbeats(int workers, double now_s)
    : workers_(workers),
      last_s_(std::make_unique<std::atomic<double>[]>(workers)),
      points_(std::make_unique<std::atomic<std::int64_t>[]>(workers)),
      step_(std::make_unique<std::atomic<std::int64_t>[]>(workers)),
      phase_(std::make_unique<std::atomic<std::int64_t>[]>(workers)) {
  for (int r = 0; r < workers; ++r) {
    last_s_[r].store(now_s);
    points_[r].store(0);
    step_[r].store(0);
    enter(r, Phase::starting);
  }
}

void Heartbeats::enter(int rank, Phase phase, int index) {
  phase_[rank].store(std::int64_t{static_cast<int>(phase)} << 32 | (index + 1));
}

std::string Heartbeats::phase(int rank) const {
  const std::int64_t packed = phase_[rank].load();
  return describe(static_cast<Phase>(packed >> 32), static_cast<int>(packed & 0xffffffff) - 1);
}

void Heartbeats::beat(int rank, std::int64_t step) {
  step_[rank].store(step);
  points_[rank].fetch_add(1);
  last_s_[rank].store(steady_now_s());
}

void Heartbeats::alive(int rank) { last_s_[rank].store(steady_now_s()); }

Heartbeats::Quiet Heartbeats::quiet(double now_s) const {
  int behind = 0;
  double latest = last_s_[0].load();
  for (int r = 1; r < workers_; ++r) {
    if (points_[r].load() < points_[behind].load()) behind = r;
    latest = std::max(latest, last_s_[r].load());
  }
  return {.behind = behind, .step = step_[behind].load(), .silent_s = now_s - latest};
}

Watchdog::Watchdog(const Heartbeats& heartbeats, double timeout_s, int first_rank,
                   Communicator& comm, OnTimeout on_timeout)
    : heartbeats_(heartbeats),
      timeout_s_(timeout_s),
      first_rank_(first_rank),
      comm_(comm),
      on_timeout_(std::move(on_timeout)) {
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
      std::vector<std::string> where;
      for (int r = 0; r < heartbeats_.workers(); ++r)
        where.push_back(fmt::format("worker {} in {} at step {}", first_rank_ + r,
                                    heartbeats_.phase(r), heartbeats_.step(r)));
      on_timeout_(q.behind, fmt::format("no progress for {:.1f} s at step {}, in {}; the other "
                                        "workers wait for it (trainer.step_timeout_s: {}); {}",
                                        q.silent_s, q.step, heartbeats_.phase(q.behind),
                                        timeout_s_, fmt::join(where, ", ")));
      comm_.abort();  // the whole group, and with it every worker's device waits
    }
  }
}

}  // namespace lockstep::detail
