// Waiting for a word to change: a short spin, then a futex.
//
// Note [Spin, then wait]
//   The waits of the communicator (a barrier phase, a collective on the communication thread)
//   are often short when the peers run on other cores: a spinning thread then wakes without a
//   system call and without losing its time slice. They are long when a peer shares our core
//   or is still computing, and then spinning would steal the core from the very thread we wait
//   for (bench/RESULTS.md runs 4 ranks on 2 cores). So a waiter polls kSpins times with a pause
//   between polls (a few microseconds in all), then blocks in std::atomic::wait, a futex on
//   Linux, which costs nothing while it sleeps; the writer calls notify_all after every change.
#pragma once

#include <atomic>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace lockstep::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Returns the value of `word` once it no longer holds `old` (acquire).
template <class T>
T spin_then_wait(const std::atomic<T>& word, T old) noexcept {
  constexpr int kSpins = 64;
  for (int i = 0; i < kSpins; ++i) {
    if (const T now = word.load(std::memory_order_acquire); now != old) return now;
    cpu_relax();
  }
  for (;;) {
    word.wait(old, std::memory_order_acquire);
    if (const T now = word.load(std::memory_order_acquire); now != old) return now;
  }
}

}  // namespace lockstep::detail
