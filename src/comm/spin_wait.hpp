// Waiting for a word to change: a short spin, then a futex.
//
// Note [Spin, then wait]
//   The waits of the communicator (a barrier phase, a collective on the communication thread)
//   are often short when the peers run on other cores: a spinning thread then wakes without a
//   system call and without losing its time slice. They are long when a peer shares our core
//   or is still computing, and then spinning would steal the core from the very thread we wait
//   for (bench/RESULTS.md runs 4 ranks on 2 cores). std::atomic::wait does both: libstdc++
//   polls the word 12 times with a pause between polls, then 4 times with a yield, then
//   blocks on a futex, which costs nothing while it sleeps; the writer calls notify_all after
//   every change. A longer spin of our own in front of it (64 pauses) measured slower for small
//   all-reduces on 2 cores (16 KB at 2 ranks: 1.2-2.1 GB/s busbw against 3.5), so there is none.
#pragma once

#include <atomic>

namespace lockstep::detail {

// Returns the value of `word` once it no longer holds `old` (acquire).
template <class T>
T spin_then_wait(const std::atomic<T>& word, T old) noexcept {
  for (;;) {
    if (const T now = word.load(std::memory_order_acquire); now != old) return now;
    word.wait(old, std::memory_order_acquire);
  }
}

}  // namespace lockstep::detail
