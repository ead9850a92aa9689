// A std::barrier that can be aborted.
//
// std::barrier wakes its waiters only when a phase completes, so a peer that died or stalled
// would hold the others forever. abort() completes the current phase on behalf of every
// participant that has not arrived yet; the woken waiters, and everyone who arrives later, see
// the flag and throw CommAborted. Arrivals are recorded under a mutex so that abort() knows who
// is missing, and a participant never arrives twice in one phase.
#pragma once

#include <barrier>
#include <mutex>
#include <vector>

#include "lockstep/error.hpp"

namespace lockstep::detail {

class AbortableBarrier {
 public:
  explicit AbortableBarrier(int participants)
      : arrived_(participants, false), barrier_(participants, PhaseDone{this}) {}

  // Participant `id` waits for the others. Throws CommAborted if the group was aborted before
  // or while waiting.
  void arrive_and_wait(int id) {
    {
      std::lock_guard lock(mutex_);
      if (aborted_) throw CommAborted();
      arrived_[id] = true;
    }
    barrier_.wait(barrier_.arrive());
    std::lock_guard lock(mutex_);
    if (aborted_) throw CommAborted();
  }

  void abort() noexcept {
    int missing = 0;
    {
      std::lock_guard lock(mutex_);
      if (aborted_) return;
      aborted_ = true;
      for (bool a : arrived_) missing += a ? 0 : 1;
    }
    // Nobody arrives after the flag is up, so these arrivals complete the phase exactly.
    if (missing > 0) (void)barrier_.arrive(missing);
  }

  bool aborted() const noexcept {
    std::lock_guard lock(mutex_);
    return aborted_;
  }

 private:
  struct PhaseDone {
    AbortableBarrier* self;
    // Runs once per phase, before anyone is released (and never concurrently with an arrival
    // of the next phase, which can only start after release).
    void operator()() noexcept {
      std::lock_guard lock(self->mutex_);
      std::fill(self->arrived_.begin(), self->arrived_.end(), false);
    }
  };

  mutable std::mutex mutex_;
  bool aborted_ = false;
  std::vector<bool> arrived_;
  std::barrier<PhaseDone> barrier_;
};

}  // namespace lockstep::detail
