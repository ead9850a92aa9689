// Interrupted saves recover, and a run says where its outputs go: a second SIGINT during a
// checkpoint save says so; --resume falls back to the previous complete checkpoint (and the
// next run removes the dead writer's temp files), or, when none is complete, names the exact
// --init-from command that keeps the whole weights.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../data/temp_files.hpp"
#include "cli_runner.hpp"

namespace fs = std::filesystem;

namespace {

using lockstep::test::read_text;
using lockstep::test::run_cli;

const std::string kQuickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";

std::string step_file(int step, const std::string& extension) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%08d%s", step, extension.c_str());
  return name;
}

// Trains the quickstart into `ckpt` (a checkpoint every 5 steps) with the save of `slow_step`
// slowed down (LOCKSTEP_FAULT slowsave: 0.5 s after each stage), and sends two SIGINTs as soon as
// that save's file with `extension` is in place: its weights (before its state is written), or
// its state (while the save verifies). Returns the dead process's pid and what it printed on
// stderr.
std::pair<pid_t, std::string> interrupt_save(const lockstep::test::TempDir& dir,
                                             const fs::path& ckpt, int slow_step,
                                             const std::string& extension = ".safetensors") {
  const fs::path err = dir.path() / "stderr.txt";
  const std::string set_dir = "trainer.checkpoint.dir=" + ckpt.string();
  const std::string fault = "0:" + std::to_string(slow_step) + ":slowsave";
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (!freopen("/dev/null", "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(126);
    setenv("LOCKSTEP_FAULT", fault.c_str(), 1);
    execl(LOCKSTEP_CLI_PATH, "lockstep", "train", kQuickstart.c_str(), "--set",
          "trainer.steps=1000000", "--set", "trainer.checkpoint.every_steps=5", "--set",
          set_dir.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const fs::path written = ckpt / step_file(slow_step, extension);
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(written)) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      FAIL("the save of step " << slow_step << " did not start within 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(kill(pid, SIGINT) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(kill(pid, SIGINT) == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  return {pid, read_text(err)};
}

}  // namespace

TEST_CASE("cli: a save cut by a second SIGINT says so, and --resume falls back to the previous "
          "checkpoint") {
  const lockstep::test::TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  const auto [dead, err] = interrupt_save(dir, ckpt, 10);
  CHECK_MESSAGE(err.find("lockstep: second SIGINT while writing the checkpoint of step 10: exiting "
                         "at once; it stays incomplete, and --resume falls back to the previous "
                         "complete checkpoint, of step 5\n") != std::string::npos, err);
  // What the cut save left: whole weights of step 10, no state; step 5 complete.
  CHECK(fs::exists(ckpt / step_file(10, ".safetensors")));
  CHECK_FALSE(fs::exists(ckpt / step_file(10, ".state")));
  CHECK(fs::exists(ckpt / step_file(5, ".state")));
  // A save killed inside its state's write leaves its temp file, named with the writer's pid.
  const fs::path stale = ckpt / (step_file(10, ".state") + "." + std::to_string(dead) + ".0.tmp");
  const fs::path live = ckpt / (step_file(10, ".state") + "." + std::to_string(getpid()) + ".0.tmp");
  dir.write(stale.lexically_relative(dir.path()).string(), "partial");
  dir.write(live.lexically_relative(dir.path()).string(), "a live writer's");

  const auto resumed = run_cli("train " + kQuickstart + " --set trainer.steps=15 --set "
                               "trainer.checkpoint.every_steps=5 --set optimizer.lr=0.02 --set "
                               "trainer.checkpoint.dir=" + ckpt.string() + " --resume");
  REQUIRE_MESSAGE(resumed.code == 0, resumed.output);
  const std::string& out = resumed.output;
  CHECK_MESSAGE(out.find((ckpt / step_file(10, ".state")).string() + ": missing (the save did not "
                         "complete); using the previous checkpoint step_00000005") !=
                    std::string::npos, out);
  CHECK(out.find("resuming from " + (ckpt / step_file(5, ".safetensors")).string() + " (step 5)") !=
        std::string::npos);
  CHECK(out.find("changed on resume: optimizer.lr 0.05 -> 0.02 (from step 6 on)") !=
        std::string::npos);
  CHECK(out.find("step 15/15") != std::string::npos);
  CHECK_FALSE(fs::exists(stale));  // the dead writer's
  CHECK(fs::exists(live));         // a live process's file is never touched
  CHECK(fs::exists(ckpt / step_file(15, ".state")));
}

// Both files in place, the save is past its writes: the line says --resume starts from it, and
// it does.
// The first Ctrl-C lands while step 10's save is slowed (1.5 s or more): the answer comes at
// once, names the step the run then stops after (it does), and the run skips its final eval.
TEST_CASE("cli: the first Ctrl-C answers at once with the step it stops after, and no final eval runs") {
  const lockstep::test::TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt", out = dir.path() / "stdout.txt",
                 err = dir.path() / "stderr.txt";
  const std::string set_dir = "trainer.checkpoint.dir=" + ckpt.string();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(126);
    setenv("LOCKSTEP_FAULT", "0:10:slowsave", 1);
    execl(LOCKSTEP_CLI_PATH, "lockstep", "train", kQuickstart.c_str(), "--set",
          "trainer.steps=1000000", "--set", "trainer.checkpoint.every_steps=5", "--set",
          set_dir.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(ckpt / step_file(10, ".safetensors"))) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      FAIL("the save of step 10 did not start within 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(kill(pid, SIGINT) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string at_once = read_text(err);  // the save has a second or more to go
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  const std::string line = "lockstep: Ctrl-C: stopping after step 11: checkpoint, then exit (no "
                           "final eval); Ctrl-C again to quit without one\n";
  CHECK_MESSAGE(at_once.find(line) != std::string::npos, at_once);
  const std::string stderr_text = read_text(err), stdout_text = read_text(out);
  CHECK_MESSAGE(stderr_text.find("stopped by signal 2 after step 11; checkpoint") != std::string::npos,
                stderr_text);
  CHECK(fs::exists(ckpt / step_file(11, ".state")));
  CHECK_MESSAGE(stdout_text.find("eval loss") == std::string::npos, stdout_text);
  CHECK(stdout_text.find("  eval                skipped: the run was stopped\n") != std::string::npos);
}

TEST_CASE("cli: a second SIGINT once both files of a save are in place says that it resumes") {
  const lockstep::test::TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  const auto [dead, err] = interrupt_save(dir, ckpt, 10, ".state");
  CHECK_MESSAGE(err.find("lockstep: second SIGINT while finishing the checkpoint of step 10: "
                         "exiting at once; both its files are in place, and --resume starts "
                         "from it\n") != std::string::npos, err);
  CHECK(err.find("stays incomplete") == std::string::npos);
  const auto resumed = run_cli("train " + kQuickstart + " --set trainer.steps=12 --set "
                               "trainer.checkpoint.every_steps=5 --set "
                               "trainer.checkpoint.dir=" + ckpt.string() + " --resume");
  REQUIRE_MESSAGE(resumed.code == 0, resumed.output);
  CHECK_MESSAGE(resumed.output.find("resuming from " + (ckpt / step_file(10, ".safetensors")).string() +
                                    " (step 10)") != std::string::npos, resumed.output);
}

TEST_CASE("cli: with no complete checkpoint, --resume names the --init-from command that keeps the weights") {
  const lockstep::test::TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  const auto [dead, err] = interrupt_save(dir, ckpt, 5);
  // The first checkpoint of the run: the line promises no earlier one.
  CHECK_MESSAGE(err.find("second SIGINT while writing the checkpoint of step 5: exiting at once; "
                         "it stays incomplete, and no earlier checkpoint in its directory is complete: "
                         "--resume has none to start from\n") != std::string::npos, err);
  CHECK(err.find("falls back") == std::string::npos);
  const fs::path weights = ckpt / step_file(5, ".safetensors");
  REQUIRE(fs::exists(weights));
  REQUIRE_FALSE(fs::exists(ckpt / step_file(5, ".state")));

  const std::string sets = " --set trainer.steps=10 --set trainer.checkpoint.dir=" + ckpt.string();
  const auto refused = run_cli("train " + kQuickstart + sets + " --resume");
  CHECK(refused.code == 2);
  // In a directory of its own: the new run leaves the old one's files alone.
  const std::string command = "lockstep train " + kQuickstart + " --set trainer.steps=10 --set "
                              "trainer.checkpoint.dir=" + ckpt.string() + "-new --init-from " +
                              weights.string();
  CHECK_MESSAGE(refused.output.find("none of the 1 checkpoints is valid") != std::string::npos,
                refused.output);
  CHECK_MESSAGE(refused.output.find("the weights in " + weights.string() + " are whole; to keep "
                                    "them, start a new run from them (step 0, a fresh optimiser "
                                    "and schedule):\n    " + command + "\n") != std::string::npos,
                refused.output);

  // The command as printed works.
  const auto started = run_cli(command.substr(std::string("lockstep ").size()));
  REQUIRE_MESSAGE(started.code == 0, started.output);
  CHECK(started.output.find("initialised from " + weights.string()) != std::string::npos);
  CHECK(fs::exists(fs::path(ckpt.string() + "-new") / step_file(10, ".state")));
  CHECK(fs::exists(weights));
}

TEST_CASE("cli: a run announces its outputs, and each run opens its part of the metrics stream") {
  const lockstep::test::TempDir dir;
  const std::string p = dir.path().string();
  const std::string outputs = " --summary-json " + p + "/s.json --set trainer.report=" + p +
                              "/r.html --set trainer.metrics=" + p + "/m.jsonl --set "
                              "trainer.trace=" + p + "/t.json --set trainer.checkpoint.dir=" + p +
                              "/ckpt";
  const auto first = run_cli("train " + kQuickstart + " --set trainer.steps=5" + outputs);
  REQUIRE_MESSAGE(first.code == 0, first.output);
  CHECK_MESSAGE(first.output.find("outputs: summary " + p + "/s.json; report " + p + "/r.html; "
                                  "metrics " + p + "/m.jsonl (appended); trace " + p +
                                  "/t.json; checkpoints " + p + "/ckpt\n") != std::string::npos,
                first.output);
  // Only what is configured is named.
  const auto bare = run_cli("train " + kQuickstart + " --set trainer.steps=1 --set "
                            "trainer.metrics=" + p + "/m.jsonl");
  REQUIRE_MESSAGE(bare.code == 0, bare.output);
  CHECK(bare.output.find("outputs: metrics " + p + "/m.jsonl (appended)\n") != std::string::npos);

  // Two fresh runs appended to one file: each starts with its own "run" line.
  const std::string metrics = read_text(p + "/m.jsonl");
  std::vector<std::string> lines;
  for (std::size_t at = 0, end; (end = metrics.find('\n', at)) != std::string::npos; at = end + 1)
    lines.push_back(metrics.substr(at, end - at));
  REQUIRE(lines.size() >= 3);
  CHECK(lines.front().starts_with("{\"kind\": \"run\", \"start_time\": \""));
  CHECK(lines.front().find("\"resumed_from\": null, \"steps\": 5,") != std::string::npos);
  int runs = 0;
  for (const std::string& line : lines) runs += line.starts_with("{\"kind\": \"run\"") ? 1 : 0;
  CHECK(runs == 2);
  CHECK(lines.back().find("\"kind\": \"run\"") == std::string::npos);  // steps follow each
}
