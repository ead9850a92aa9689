// Tells ThreadSanitizer about the fork and the join of a oneTBB parallel loop; nothing in a build
// without TSan.
//
//   TsanForkJoin fork_join;  // before the loop: what the caller wrote is visible to the tasks
//   tbb::parallel_for(range, [&](auto r) { fork_join.task_begins(); ...; fork_join.task_ends(); });
//   fork_join.joined();       // after it: what the tasks wrote is visible to the caller
//
// A task reads the loop's closure (its captures, made on the caller's stack) before it can call
// task_begins(), and when oneTBB's workers are already running (a loop right after another)
// nothing TSan sees orders the two. A loop that can follow another therefore names a static
// object of its call site, which a task reaches without reading the closure:
//   static char site;
//   const auto task = [&](std::size_t i) { tsan_acquire(&site); fork_join.task_begins(); ...
//   tsan_release(&site);  // after the closure is made
//   tbb::parallel_for(std::size_t{0}, n, task);
//
// Note [TSan and oneTBB]
// ~~~~~~~~~~~~~~~~~~~~~~
// Debian's oneTBB is not built with TSan, so TSan sees neither how a parallel loop hands its
// tasks what the caller wrote, nor how the caller waits for them: every write of a task looks
// like a race with the caller's read after the loop. third_party/tsan.supp used to silence every
// report with a libtbb frame, and with them any race of our own threads (a communication thread
// against a gradient buffer a kernel writes) with a task. Instead each of our loops on oneTBB
// says its fork and join to TSan here: the caller releases before the loop and acquires after;
// each task acquires at its start and releases at its end, on two objects of the loop, so tasks
// stay unordered with each other and every other thread stays unordered with them.
// tests/comm/test_race_detection.cpp shows a race with a kernel's task reported.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define LOCKSTEP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOCKSTEP_TSAN 1
#endif
#endif

#ifdef LOCKSTEP_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace lockstep::detail {

#ifdef LOCKSTEP_TSAN
class TsanForkJoin {
 public:
  TsanForkJoin() { __tsan_release(&fork_); }
  void task_begins() { __tsan_acquire(&fork_); }
  void task_ends() { __tsan_release(&join_); }
  void joined() { __tsan_acquire(&join_); }
  TsanForkJoin(const TsanForkJoin&) = delete;
  TsanForkJoin& operator=(const TsanForkJoin&) = delete;

 private:
  char fork_ = 0, join_ = 0;
};
inline void tsan_release(void* site) { __tsan_release(site); }
inline void tsan_acquire(void* site) { __tsan_acquire(site); }
#else
inline void tsan_release(void*) {}
inline void tsan_acquire(void*) {}
class TsanForkJoin {
 public:
  void task_begins() {}
  void task_ends() {}
  void joined() {}
};
#endif

}  // namespace lockstep::detail
