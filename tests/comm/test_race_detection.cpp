// ThreadSanitizer reports a race of our own thread with a CPU kernel's oneTBB tasks, and nothing
// for a buffer handed over properly (Note [TSan and oneTBB] in src/common/tsan_fork_join.hpp).
// In a TSan build each case runs this program again with LOCKSTEP_TEST_RACE set and
// third_party/tsan.supp in force; run so, the program makes the race (or the hand-over) and
// TSan, halting on a report, ends it.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "common/tsan_fork_join.hpp"
#include "lockstep/device.hpp"
#include "../cli/cli_runner.hpp"
#include "../skip.hpp"

namespace {

// The kernel's buffer: four blocks of the CPU device's elementwise ops, so that its tasks run on
// oneTBB's threads.
constexpr std::size_t kElements = 4 * 16384;

// A communication thread of ours writes the buffer; the kernel scales it. With `race`, the
// kernel starts once it sees the writes through a relaxed flag, which orders nothing; else the
// thread is joined first.
void write_then_scale(bool race) {
  auto dev = lockstep::make_cpu_device(0, 2);
  lockstep::DeviceArray<float> x(*dev, kElements);
  std::atomic<bool> written{false};
  std::thread comm([&] {
    float* p = x.data();
    for (std::size_t i = 0; i < kElements; ++i) p[i] = 1.0f;
    written.store(true, std::memory_order_relaxed);
  });
  if (race) {
    while (!written.load(std::memory_order_relaxed)) std::this_thread::yield();
  } else {
    comm.join();
  }
  dev->scale(x.data(), 2.0f, kElements);
  if (race) comm.join();
  const float* p = x.data();  // read after the kernel's join
  double sum = 0.0;
  for (std::size_t i = 0; i < kElements; ++i) sum += p[i];
  CHECK(sum == 2.0 * kElements);
}

// This case run again in a child, with the race or without, under the repository's
// suppressions; TSan ends a run that it reports on with exit 66.
lockstep::test::CliResult run_child(const char* case_name, const char* mode) {
  return lockstep::test::run_command(
      std::string("LOCKSTEP_TEST_RACE=") + mode + " TSAN_OPTIONS=\"${TSAN_OPTIONS:-}" +
      ":halt_on_error=1:exitcode=66:suppressions=" LOCKSTEP_SOURCE_DIR
      "/third_party/tsan.supp\" '" + std::filesystem::read_symlink("/proc/self/exe").string() +
      "' '--test-case=" + case_name + "'");
}

#ifdef LOCKSTEP_TSAN
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif

constexpr const char* kRaceCase =
    "TSan reports a race of our own thread with the oneTBB tasks of a CPU kernel";
constexpr const char* kHandOverCase =
    "TSan reports nothing for a buffer handed to the oneTBB tasks of a CPU kernel and back";

}  // namespace

TEST_CASE(kRaceCase) {
  if (std::getenv("LOCKSTEP_TEST_RACE") != nullptr) return write_then_scale(true);
  if (!kTsan) return lockstep::test::skip(lockstep::test::Skip::setup, "not a TSan build");
  const lockstep::test::CliResult r = run_child(kRaceCase, "race");
  INFO(r.output);
  CHECK(r.code == 66);
  CHECK(r.output.find("WARNING: ThreadSanitizer: data race") != std::string::npos);
  // One side of it ran inside oneTBB, whose frames the suppressions once matched.
  CHECK(r.output.find("libtbb") != std::string::npos);
}

TEST_CASE(kHandOverCase) {
  if (std::getenv("LOCKSTEP_TEST_RACE") != nullptr) return write_then_scale(false);
  if (!kTsan) return lockstep::test::skip(lockstep::test::Skip::setup, "not a TSan build");
  const lockstep::test::CliResult r = run_child(kHandOverCase, "none");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("ThreadSanitizer") == std::string::npos);
}
