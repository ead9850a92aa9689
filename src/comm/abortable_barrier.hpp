// A barrier that can be aborted, and whose waiters spin briefly, then sleep on a futex.
//
// Note [Barrier waits]
//   A phase is a count of arrivals and a generation number. The last participant to arrive
//   resets the count and bumps the generation; the others wait for the generation to change.
//   A waiter spins briefly, then sleeps on a futex (spin_then_wait, Note [Spin, then wait]).
//   abort() raises a flag in the same word and wakes every waiter; from then on every arrival
//   throws CommAborted. Arrivals after an abort are never counted, so the count of an aborted
//   barrier does not matter any more.
//   A phase either completes or is aborted, the same for every participant (Note [A completed
//   phase stands]): the generation and the flag share one word, and the last arrival bumps the
//   generation only while the flag is down (a compare-and-swap); a waiter woken by the word's
//   change throws only when its generation did not move.
//   Memory order: every arrival is an acq_rel increment of the count and the last one releases
//   the new generation, so what any participant wrote before arriving is visible to every
//   participant after the phase (the all-reduce's buffers rely on it).
//
// Note [A completed phase stands]
//   Once every participant has arrived, the phase has happened: an abort that comes later (a
//   peer that failed after it, Note [Failure] in src/train/worker_loop.hpp) must not undo it
//   for the ranks that had not woken up yet. Otherwise a rank whose all-reduce the lost worker
//   had completed could throw out of it, or not, by the scheduler's whim, and the state the
//   survivors hold after a device loss would depend on timing (Note [Shrink] in
//   src/train/recovery.hpp): with this rule every rank completes exactly the collectives that
//   every rank joined before the abort.
#pragma once

#include <atomic>
#include <cstdint>

#include "comm/spin_wait.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {

class AbortableBarrier {
 public:
  explicit AbortableBarrier(int participants) : participants_(participants) {}

  // Waits for the other participants. Throws CommAborted if the group was aborted before the
  // phase completed (Note [A completed phase stands]).
  void arrive_and_wait() {
    // The word before arriving: an abort() after this load changes it and wakes us, one before
    // it has raised the flag we test next.
    const std::uint32_t seen = word_.load();
    if (seen & kAborted) throw CommAborted();
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == participants_) {
      arrived_.store(0, std::memory_order_relaxed);
      std::uint32_t expected = seen;  // the word changes only by an abort until we bump it
      if (!word_.compare_exchange_strong(expected, seen + kGeneration, std::memory_order_acq_rel))
        throw CommAborted();
      word_.notify_all();
      return;
    }
    const std::uint32_t now = spin_then_wait(word_, seen);
    if ((now & ~kAborted) == seen) throw CommAborted();  // woken by the abort alone
  }

  void abort() noexcept {
    if (word_.fetch_or(kAborted) & kAborted) return;
    word_.notify_all();
  }

  bool aborted() const noexcept { return (word_.load() & kAborted) != 0; }

 private:
  static constexpr std::uint32_t kAborted = 1, kGeneration = 2;
  const int participants_;
  std::atomic<int> arrived_{0};
  std::atomic<std::uint32_t> word_{0};  // generation x 2, plus the abort flag
};

}  // namespace lockstep::detail
