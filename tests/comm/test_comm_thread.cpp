// The communication thread's scheduling (Note [A short time slice for the communication
// thread] in src/comm/comm_thread.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <thread>

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "comm/comm_thread.hpp"
#include "skip.hpp"

using namespace lockstep;

TEST_CASE("the communication thread asks for a 100 us time slice and keeps its nice value") {
#if defined(__linux__)
  if (detail::time_slice_ns() == 0)
    return test::skip(test::Skip::platform,
                      "the kernel reports no per-thread time slice (Linux before 6.12)");
  // A thread niced to +3 (which needs no privilege) starts the communication thread, which
  // inherits its scheduling attributes; the collective reads what the thread ended up with.
  const std::uint64_t before = detail::time_slice_ns();
  std::uint64_t slice = 0;
  int nice = 0, starter_nice = 0;
  std::thread starter([&] {  // no assertions here: they would throw on the wrong thread
    const auto tid = static_cast<id_t>(syscall(SYS_gettid));
    if (setpriority(PRIO_PROCESS, tid, 3) != 0) return;
    starter_nice = getpriority(PRIO_PROCESS, tid);
    detail::CommThread comm;
    comm.submit([&] {
          slice = detail::time_slice_ns();
          nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
        })
        ->wait();
  });
  starter.join();
  CHECK(starter_nice == 3);
  CHECK(slice == detail::kCommThreadSliceNs);
  CHECK(nice == 3);
  CHECK(detail::time_slice_ns() == before);  // only the communication thread changed
#else
  test::skip(test::Skip::platform, "time slices are requested on Linux only");
#endif
}
