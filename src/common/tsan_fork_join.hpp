// Tells ThreadSanitizer about the fork and the join of a oneTBB parallel loop; nothing in a build
// without TSan.
//
//   TsanForkJoin fork_join;  // before the loop: what the caller wrote is visible to the tasks
//   tbb::parallel_for(range, [&](auto r) { fork_join.task_begins(); ...; fork_join.task_ends(); });
//   fork_join.joined();       // after it: what the tasks wrote is visible to the caller
//
// A oneTBB pipeline's stages hand an item from task to task: the stage that made it calls
// release(item) when done, the next acquire(item) before it reads; and the calls of a serial
// stage, on whichever threads, are ordered by acquire and release of an object of that stage.
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
  void release(void* item) { __tsan_release(item); }
  void acquire(void* item) { __tsan_acquire(item); }
  TsanForkJoin(const TsanForkJoin&) = delete;
  TsanForkJoin& operator=(const TsanForkJoin&) = delete;

 private:
  char fork_ = 0, join_ = 0;
};
#else
class TsanForkJoin {
 public:
  void task_begins() {}
  void task_ends() {}
  void joined() {}
  void release(void*) {}
  void acquire(void*) {}
};
#endif

}  // namespace lockstep::detail
