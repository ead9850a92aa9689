// Note [Bounded stop] and thread exhaustion, end to end: every stop ends in bounded time with a
// report, and a thread that cannot be started is an error, never std::terminate. Each command
// runs under `timeout`, so that a regression fails instead of hanging CI.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "cli_runner.hpp"
#include "data/temp_files.hpp"
#include "sanitized.hpp"
#include "skip.hpp"

using lockstep::test::CliResult;

namespace {

const std::string kQuickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("cli: a checkpoint write that never returns ends the run within the grace period") {
  lockstep::test::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  // Worker 0 blocks at the end of step 2 (where it writes its checkpoint), ignoring the abort.
  const CliResult r = lockstep::test::run_command(
      "LOCKSTEP_FAULT=0:2:block timeout -s KILL 60 " + lockstep::test::cli_path() + " train " +
      kQuickstart + " --set trainer.steps=50 --set trainer.step_timeout_s=1 "
      "--set trainer.stop_grace_s=1 --set trainer.checkpoint.dir=" + (dir.path() / "c").string());
  const double took = seconds_since(start);
  CHECK_MESSAGE(r.code == 1, r.output);
  CHECK(took < 1 + 1 + 5);  // the step timeout, the grace period, and slack for a busy machine
  CHECK_MESSAGE(r.output.find("failed: worker 0 (cpu:0): did not return within "
                              "trainer.stop_grace_s = 1 s of the stop, and is left running: "
                              "worker 0 (cpu:0) in end of step at step 2; the run had stopped "
                              "for: worker 0 (cpu:0): no progress for ") != std::string::npos,
                r.output);
}

// Note [Abortable waits]: the worker waits on its device (a wait only the abort can end, as
// behind a collective whose peer died); the step timeout aborts the run, which ends the wait, so
// the worker returns long before the grace period and is not left behind.
TEST_CASE("cli: a worker blocked in a device wait is released by the abort: exit 1 within 10 s") {
  const auto start = std::chrono::steady_clock::now();
  const CliResult r = lockstep::test::run_command(
      "LOCKSTEP_FAULT=1:3:hang timeout -s KILL 60 " + lockstep::test::cli_path() + " train " +
      kQuickstart + " --set trainer.steps=50 --set trainer.step_timeout_s=1 "
      "--set trainer.stop_grace_s=30");
  CHECK_MESSAGE(r.code == 1, r.output);
  // The contract is a time: the step timeout (1 s), then the abort; 10 s is slack for a busy
  // machine, far below the 30 s grace period the worker would otherwise take.
  CHECK(seconds_since(start) < 10);
  CHECK_MESSAGE(r.output.find("failed: worker 1 (cpu:1): no progress for ") != std::string::npos,
                r.output);
  // The culprit and every other worker, each with its phase.
  CHECK_MESSAGE(r.output.find("at step 3, in forward; the other workers wait for it") !=
                    std::string::npos, r.output);
  CHECK(r.output.find("worker 1 in forward at step 3") != std::string::npos);
  // Worker 0 waits for it in the all-reduce of step 2's totals, agreed once step 3's first
  // forward is queued (Note [Deferred step read]).
  CHECK_MESSAGE(r.output.find("worker 0 in the step's all-reduce of totals at step 2") !=
                    std::string::npos,
                r.output);
  CHECK(r.output.find("left running") == std::string::npos);
}

// Note [Watchdog]: the save pauses 0.5 s after each of its 4 stages, 2 s in all, twice the step
// timeout; each stage counts as progress, so the run goes on.
TEST_CASE("cli: a checkpoint save slower than trainer.step_timeout_s does not stop the run") {
  lockstep::test::TempDir dir;
  const CliResult r = lockstep::test::run_command(
      "LOCKSTEP_FAULT=0:2:slowsave timeout -s KILL 60 " + lockstep::test::cli_path() + " train " +
      kQuickstart + " --set trainer.steps=4 --set trainer.step_timeout_s=1 "
      "--set trainer.checkpoint.every_steps=2 --set trainer.checkpoint.dir=" +
      (dir.path() / "c").string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK(r.output.find("checkpoint step 2: ") != std::string::npos);
  CHECK(r.output.find("checkpoint step 4: ") != std::string::npos);
}

TEST_CASE("cli: SIGTERM with a stalled worker ends within the grace period and exits 143") {
  lockstep::test::TempDir dir;
  const std::string log = (dir.path() / "log").string();
  // Worker 1 stalls at step 3 and never reaches the step's end; no step timeout is set.
  const CliResult started = lockstep::test::run_command(
      "(LOCKSTEP_FAULT=1:3:stall " + lockstep::test::cli_path() + " train " + kQuickstart +
      " --set trainer.steps=100000 --set trainer.stop_grace_s=2 >" + log + " 2>&1; echo \"exit "
      "$?\" >>" + log + ") >/dev/null 2>&1 & echo $!");
  const std::string shell = started.output.substr(0, started.output.find('\n'));
  const std::string lockstep_in_shell = " -P " + shell + " -x lockstep";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto start = std::chrono::steady_clock::now();
  lockstep::test::run_command("pkill -TERM" + lockstep_in_shell);
  std::string text;
  // The shell's own line, "exit CODE" (the stop line says "then exit" too).
  while (seconds_since(start) < 30 && text.find("\nexit ") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    text = lockstep::test::read_text(log);
  }
  lockstep::test::run_command("pkill -KILL" + lockstep_in_shell);  // when it did not end
  const double took = seconds_since(start);
  CHECK_MESSAGE(text.find("exit 143") != std::string::npos, text);
  CHECK(took < 2 + 5);  // the grace period, and slack for a busy machine: the contract is a time
  CHECK_MESSAGE(text.find("failed: worker 1 (cpu:1): a stop was requested ") != std::string::npos,
                text);
  CHECK_MESSAGE(text.find("this worker has not reached the end of its step: it is in forward at "
                          "step 3") != std::string::npos, text);
}

// Note [Thread exhaustion, end to end]
// `ulimit -u N` caps the threads of the user's processes, the shell and `timeout` included. How
// many a run needs depends on the machine's cores, so the limit is not guessed: it starts at 1,
// where not even `timeout` can fork, and rises until a run finishes. Every run on the way must
// end cleanly, one of three ways. Two are not ours and prove nothing: `timeout` could not fork
// ("fork system call failed"), or OpenBLAS could not start its pool when the library loaded,
// before main ("OpenBLAS blas_thread_init: pthread_create failed"), and raised SIGINT (exit 130).
// Otherwise lockstep ran, and must exit 1 naming the thread it could not start; at least one run
// must. On 2 cores: 1 and 2 are not ours, 3 and 4 ours, 5 finishes. As root, RLIMIT_NPROC does
// not apply: the command then runs as nobody (setpriv).
TEST_CASE("cli: thread exhaustion (ulimit -u) is an error naming the thread, never a crash") {
  if (lockstep::test::kSanitized)
    return lockstep::test::skip(lockstep::test::Skip::setup, "a sanitizer's own threads (LSan's "
                                                             "at exit) count against the limit");
  const std::optional<std::string> as_user = lockstep::test::unprivileged_prefix();
  if (!as_user)
    return lockstep::test::skip(lockstep::test::Skip::root,
                                "running as root without setpriv: ulimit -u would not apply");
  constexpr int kMostThreads = 256;  // far above any run's needs: a run that never finishes fails
  int refused = 0, finished_at = 0;
  for (int limit = 1; limit <= kMostThreads && finished_at == 0; ++limit) {
    CAPTURE(limit);
    const CliResult r = lockstep::test::run_command(
        *as_user + "bash -c 'ulimit -u " + std::to_string(limit) + "; exec timeout -s KILL 60 " +
        lockstep::test::cli_path() + " train " + kQuickstart +
        " --set trainer.steps=3 --set trainer.checkpoint.dir='");  // nobody cannot write runs/
    CHECK(r.output.find("terminate") == std::string::npos);
    const bool no_fork = r.output.find("fork system call failed") != std::string::npos;
    const bool no_openblas_pool =
        r.code == 130 &&
        r.output.find("OpenBLAS blas_thread_init: pthread_create failed") != std::string::npos;
    if (r.code == 0) {
      finished_at = limit;
    } else if (!no_fork && !no_openblas_pool) {
      CHECK_MESSAGE(r.code == 1, r.output);
      CHECK_MESSAGE(r.output.find(": cannot start the ") != std::string::npos, r.output);
      CHECK(r.output.find("ulimit -u") != std::string::npos);
      ++refused;
    }
  }
  CHECK(finished_at > 0);
  CHECK(refused > 0);
}
