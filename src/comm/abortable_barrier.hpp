// A barrier that can be aborted, and whose waiters spin briefly, then sleep on a futex.
//
// Note [Barrier waits]
//   A phase is a count of arrivals and a generation number. The last participant to arrive
//   resets the count and bumps the generation; the others wait for the generation to change.
//   A waiter spins briefly, then sleeps on a futex (spin_then_wait, Note [Spin, then wait]).
//   abort() raises a flag and bumps the generation itself: every waiter wakes, and it and every
//   later arrival see the flag and throw CommAborted. Arrivals after an abort are never counted,
//   so the count of an aborted barrier does not matter any more.
//   Memory order: every arrival is an acq_rel increment of the count and the last one releases
//   the new generation, so what any participant wrote before arriving is visible to every
//   participant after the phase (the all-reduce's buffers rely on it).
#pragma once

#include <atomic>
#include <cstdint>

#include "comm/spin_wait.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {

class AbortableBarrier {
 public:
  explicit AbortableBarrier(int participants) : participants_(participants) {}

  // Waits for the other participants. Throws CommAborted if the group was aborted before or
  // while waiting.
  void arrive_and_wait() {
    // The generation before the flag: an abort() that bumps it after this load wakes us, one
    // that bumped it before has raised the flag we read next.
    const std::uint32_t generation = generation_.load();
    if (aborted()) throw CommAborted();
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == participants_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      generation_.notify_all();
    } else {
      spin_then_wait(generation_, generation);
    }
    if (aborted()) throw CommAborted();
  }

  void abort() noexcept {
    if (aborted_.exchange(true)) return;
    generation_.fetch_add(1);
    generation_.notify_all();
  }

  bool aborted() const noexcept { return aborted_.load(); }

 private:
  const int participants_;
  std::atomic<int> arrived_{0};
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> aborted_{false};
};

}  // namespace lockstep::detail
