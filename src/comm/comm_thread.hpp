// A rank's communication thread: runs the collectives a communicator was asked to start
// (Communicator::all_reduce_async and the other *_async calls) one after another, in the order
// they were submitted, while the worker goes on. Started on the first submit; the destructor finishes the queue and joins.
// The owner declares it as its last member, so the thread stops before anything it uses goes.
//
// Note [A short time slice for the communication thread]
//   The thread runs for microseconds at a time (a barrier phase, its slice of a sum) and then
//   waits: for its peers, for the wire, for the next bucket. Each time it wakes it needs a core,
//   and while backward runs every core may be taken by compute threads (workers x threads >=
//   cores). Linux's fair scheduler (EEVDF) lets a woken thread preempt the running one only when
//   its deadline is earlier, and with the default slice (1.4 ms on 2 cores) the woken thread
//   often waits out the running thread's slice instead: once per wake, several wakes per bucket.
//   So the thread asks for a 100 us slice (sched_setattr's sched_runtime for SCHED_OTHER, which
//   Linux 6.12 and later honour without privilege, earlier kernels ignore): after a wake its
//   deadline is early and it preempts compute at once; it runs briefly, so the short slice
//   costs it nothing. Its policy and nice value stay as they were. On the 2-core machine of
//   bench/RESULTS.md (bench_overlap's emulated link) this raised the share of communication
//   hidden from 51% to 69% with 2 workers and from 42% to 53% with 4 (medians of 4 rounds).
#pragma once

#include <cstdint>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "lockstep/comm.hpp"

namespace lockstep::detail {

// The slice the communication thread asks for, in nanoseconds (the kernel's least is 100 us).
constexpr std::uint64_t kCommThreadSliceNs = 100'000;

// The calling thread's time slice as the kernel reports it, nanoseconds; 0 where unknown (not
// Linux, a kernel before 6.12, or not SCHED_OTHER).
std::uint64_t time_slice_ns() noexcept;
// Asks for kCommThreadSliceNs for the calling thread, keeping its policy and nice value; does
// nothing where that is not possible (Note [A short time slice for the communication thread]).
void request_short_time_slice() noexcept;

class CommThread {
 public:
  CommThread() = default;
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Runs `collective` on the thread, after everything submitted before it.
  std::unique_ptr<CommWork> submit(std::function<void()> collective);

 private:
  struct Queued;
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Queued>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace lockstep::detail
