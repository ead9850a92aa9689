// Note [Opening an input], end to end: a FIFO or /dev/zero given as a config, a data file or a
// checkpoint exits 2 at once, naming the path and its type. Each command runs under `timeout`
// and a 4 GiB address-space limit, so that a regression (an open that blocks on the FIFO, a read
// of /dev/zero that never ends) fails the test instead of hanging CI or filling memory.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cli_runner.hpp"
#include "data/temp_files.hpp"
#include "sanitized.hpp"

namespace fs = std::filesystem;
using lockstep::test::CliResult;

namespace {

// The shell prefix that runs a command with its address space limited to `kib` KiB, then at
// most 30 s. An address-space limit counts reservations, and those grow with the machine: the
// CUDA driver's as soon as it opens a GPU, glibc's malloc arenas (up to 8 per core, 64 MB
// each), and the stacks and buffers of oneTBB's and OpenBLAS's threads (one per core). On a
// 16-core H200 machine a 4 GB limit was exhausted by those alone: thread creation failed and a
// run that had reported its error hung. So these runs see no GPU, use two malloc arenas and
// two cores, as on the 2-core machines this suite was sized on, and test what they mean to:
// the CPU backend's handling of hostile inputs.
std::string address_limit(long kib) {
  return "ulimit -v " + std::to_string(kib) +
         "; export CUDA_VISIBLE_DEVICES= MALLOC_ARENA_MAX=2; exec taskset -c 0,1 timeout -s KILL "
         "30 ";
}

// `args` to the lockstep binary, bounded in time and memory (not under a sanitizer, which needs
// the address space and runs slower); 137 when it had to be killed.
CliResult bounded_cli(const std::string& args) {
  const std::string limit = lockstep::test::kSanitized
                                ? "timeout -s KILL 120 "
                                : address_limit(4194304);
  return lockstep::test::run_command("(" + limit + lockstep::test::cli_path() + " " + args + ")");
}

// A config training on `data` as CSV.
fs::path csv_config(const lockstep::test::TempDir& dir, const fs::path& data) {
  return dir.write("c.yaml", "model: {type: mlp, hidden: [4]}\n"
                             "data: {dataset: csv, path: " + data.string() + ", batch_size: 4}\n"
                             "trainer: {devices: 1, steps: 2}\n");
}

void check_refused(const CliResult& r, const std::string& path, const std::string& type) {
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(r.output.find(path + ": cannot open") != std::string::npos, r.output);
  CHECK_MESSAGE(r.output.find("it is " + type + ", expected a regular file") != std::string::npos,
                r.output);
}

}  // namespace

TEST_CASE("cli: a FIFO or /dev/zero as config, data or checkpoint exits 2 at once, naming it") {
  lockstep::test::TempDir dir;
  const std::string quickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";
  // A checkpoint is a .safetensors and .state pair: both FIFOs, or both links to /dev/zero.
  const auto make = [&](const std::string& name, bool fifo) {
    const fs::path path = dir.path() / name;
    if (fifo) REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    else fs::create_symlink("/dev/zero", path);
    return path;
  };
  for (const bool fifo : {true, false}) {
    const std::string type = fifo ? "a FIFO (named pipe)" : "a character device";
    const std::string stem = fifo ? "fifo" : "zero";
    const fs::path plain = make(stem, fifo), weights = make(stem + ".safetensors", fifo);
    make(stem + ".state", fifo);
    CAPTURE(plain);
    check_refused(bounded_cli("train " + plain.string()), plain.string(), type);
    check_refused(bounded_cli("train " + csv_config(dir, plain).string()), plain.string(), type);
    check_refused(bounded_cli("eval " + quickstart + " --checkpoint " + weights.string()),
                  weights.string(), type);
    check_refused(bounded_cli("export " + weights.string() + " --out " +
                              (dir.path() / "out.safetensors").string()),
                  weights.string(), type);
    check_refused(bounded_cli("sample --checkpoint " + weights.string()), weights.string(), type);
  }
  // /dev/zero itself, not through a link.
  check_refused(bounded_cli("train /dev/zero"), "/dev/zero", "a character device");
}

// Note [One writer per checkpoint directory], end to end.
TEST_CASE("cli: a second run on a checkpoint directory exits 2 naming the first one's pid") {
  lockstep::test::TempDir dir;
  const fs::path ckpt = dir.path() / "ckpt";
  const std::string quickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";
  const std::string run = "train " + quickstart + " --set trainer.checkpoint.dir=" + ckpt.string();
  // The first run, in the background, long enough to be running when the second starts (and
  // killed below, with nothing between that can end the test); its pid is the subshell's,
  // which execs it.
  const std::string log = (dir.path() / "first.log").string();
  const CliResult started = lockstep::test::run_command(
      "(exec " + lockstep::test::cli_path() + " " + run + " --set trainer.steps=1000000 >" + log +
      " 2>&1) & echo $!");
  const std::string pid = started.output.substr(0, started.output.find('\n'));
  // Wait (at most 30 s) until it holds the lock and has written its pid there.
  std::string holder;
  for (int i = 0; i < 300 && holder.empty(); ++i) {
    holder = lockstep::test::read_text(ckpt / ".lock");
    if (holder.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const CliResult second = bounded_cli(run + " --set trainer.steps=2");
  lockstep::test::run_command("kill " + pid);
  CHECK(holder == pid + "\n");
  CHECK_MESSAGE(second.code == 2, second.output);
  CHECK_MESSAGE(second.output.find("checkpoint directory in use by another run (pid " + pid + ",") !=
                    std::string::npos,
                second.output);
}

TEST_CASE("cli: export refuses to write over its own input, and eval another model's checkpoint") {
  lockstep::test::TempDir dir;
  const std::string gpt = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
  const fs::path ckpt = dir.path() / "ckpt";
  // A small eval split throughout: the run evaluates at its end, and a sanitized build slowly.
  const std::string small = " --set model.n_layer=1 --set model.d_model=32 --set model.n_head=4"
                            " --set data.eval_fraction=0.02";
  const CliResult train = bounded_cli("train " + gpt + small + " --set trainer.steps=2 --set "
                                      "trainer.checkpoint.dir=" + ckpt.string());
  REQUIRE_MESSAGE(train.code == 0, train.output);
  const fs::path weights = ckpt / "step_00000002.safetensors";
  const fs::path state = ckpt / "step_00000002.state";
  REQUIRE(fs::exists(weights));
  for (const fs::path& target : {weights, state}) {
    const std::string before = lockstep::test::read_text(target);
    const CliResult r = bounded_cli("export " + weights.string() + " --out " + target.string());
    CHECK_MESSAGE(r.code == 2, r.output);
    CHECK(r.output.find("is the same file as the checkpoint's") != std::string::npos);
    CHECK(lockstep::test::read_text(target) == before);
  }
  // Same tensor shapes, another n_head: only the recorded model tells them apart.
  const std::string eval = "eval " + gpt + small;
  const CliResult ok = bounded_cli(eval + " --checkpoint " + ckpt.string());
  CHECK_MESSAGE(ok.code == 0, ok.output);
  const CliResult other =
      bounded_cli(eval + " --set model.n_head=2 --checkpoint " + ckpt.string());
  CHECK_MESSAGE(other.code == 2, other.output);
  CHECK(other.output.find("the checkpoint records the model") != std::string::npos);
}

// Note [Checking an output], end to end: exit 2 before the first step, naming the key or flag.
TEST_CASE("cli: outputs that cannot be written exit 2 before training") {
  lockstep::test::TempDir dir;
  const std::string quickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";
  const std::string file = dir.write("a_file", "x").string();
  const std::string missing = (dir.path() / "missing" / "out").string();
  // Under a file: a directory that cannot be made (a missing one is made, as checkpoint
  // directories are).
  const std::string unmakeable = (fs::path(file) / "sub" / "out").string();
  struct Case {
    std::string args, named;
  };
  for (const Case& c : {Case{"--summary-json " + dir.path().string(), "--summary-json"},
                        Case{"--summary-json " + unmakeable, "--summary-json"},
                        Case{"--set trainer.report=" + dir.path().string(), "trainer.report"},
                        Case{"--set trainer.trace=" + unmakeable, "trainer.trace"},
                        Case{"--set trainer.checkpoint.dir=" + file, "trainer.checkpoint.dir"}}) {
    CAPTURE(c.args);
    const CliResult r = bounded_cli("train " + quickstart + " --set trainer.steps=2 " + c.args);
    CHECK_MESSAGE(r.code == 2, r.output);
    CHECK_MESSAGE(r.output.find("error: " + c.named + " ") != std::string::npos, r.output);
    CHECK(r.output.find("step 1") == std::string::npos);
  }
  const CliResult r = bounded_cli("export " + dir.path().string() + " --out " + missing);
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.output.find("error: export --out " + missing + ": directory") != std::string::npos,
                r.output);
}

TEST_CASE("cli: LOCKSTEP_FAULT outside the run's ranks or steps exits 2") {
  const std::string quickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";
  const std::string run = quickstart + " --set trainer.devices=2 --set trainer.steps=5";
  struct Case {
    std::string fault, expected;
  };
  for (const Case& c : {Case{"2:3:forward", "rank 2 is outside the run's ranks 0..1"},
                        Case{"1:6:nan", "step 6 is outside the run's steps 1..5"}}) {
    const CliResult r = lockstep::test::run_command("LOCKSTEP_FAULT=" + c.fault + " timeout -s KILL 60 " +
                                                    lockstep::test::cli_path() + " train " + run);
    CHECK_MESSAGE(r.code == 2, r.output);
    CHECK_MESSAGE(r.output.find("error: LOCKSTEP_FAULT " + c.fault + ": " + c.expected) !=
                      std::string::npos,
                  r.output);
  }
}

// Note [Memory plan]: absurd sizes exit 2 before anything large is allocated, naming their key.
TEST_CASE("cli: absurd sizes exit 2 naming their key, and --dry-run prints the memory plan") {
  lockstep::test::TempDir dir;
  const std::string quickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";
  const std::string gpt = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
  const fs::path labels = dir.write("labels.csv", "1,2,0\n3,4,1000000000\n5,6,1\n");
  struct Case {
    std::string args, named;
  };
  for (const Case& c :
       {Case{quickstart + " --set model.hidden=[64,2000000000]", "model.hidden[1] = 2000000000"},
        Case{quickstart + " --set data.batch_size=1000000000", "data.batch_size = 1000000000"},
        Case{gpt + " --set model.d_model=400000 --set model.n_head=1", "model.d_model = 400000"},
        Case{csv_config(dir, labels).string(), "the data's 1000000001 classes"}}) {
    CAPTURE(c.args);
    const CliResult r = bounded_cli("train " + c.args);
    CHECK_MESSAGE(r.code == 2, r.output);
    CHECK_MESSAGE(r.output.find(": " + c.named) != std::string::npos, r.output);
    CHECK(r.output.find(" needs ") != std::string::npos);
    CHECK(r.output.find(" available (") != std::string::npos);
  }
  const CliResult plan = bounded_cli("train " + quickstart + " --dry-run");
  CHECK_MESSAGE(plan.code == 0, plan.output);
  CHECK(plan.output.find("memory plan: ") != std::string::npos);
  CHECK(plan.output.find("summary") == std::string::npos);  // it stopped before step 1
  // --compare-zero: the three settings' plans, one line each; zero 2 plans the gradient shards.
  const CliResult zeros = bounded_cli("train " + gpt + " --set trainer.devices=4 --dry-run --compare-zero");
  CHECK_MESSAGE(zeros.code == 0, zeros.output);
  for (const char* line : {"\nzero 0: ", "\nzero 1: ", "\nzero 2: ", "as a ZeRO-1 shard of 4",
                           "as a ZeRO-2 shard of 4", "as ZeRO-2 shards and buckets"})
    CHECK_MESSAGE(zeros.output.find(line) != std::string::npos, zeros.output);
  CHECK(bounded_cli("train " + quickstart + " --compare-zero").code == 2);  // needs --dry-run
  if (lockstep::test::kSanitized) return;  // ulimit -v: see bounded_cli
  // A limit of the process's own (ulimit -v) counts: 2 GB is too little for two workers of a
  // million hidden units (74 million parameters: 296 MB a copy, 888 MB with gradients and
  // momentum), though physical memory holds them.
  const CliResult limited = lockstep::test::run_command(
      "(" + address_limit(2000000) + lockstep::test::cli_path() + " train " +
      quickstart + " --set model.hidden=[1000000] --dry-run)");
  CHECK_MESSAGE(limited.code == 2, limited.output);
  CHECK(limited.output.find("available (RLIMIT_AS (ulimit -v))") != std::string::npos);
}

// Note [An output is never an input], end to end: an output that is an input (by name, through
// a symlink, or as another output) exits 2 before anything is written, naming both paths and
// where they came from; the input is as it was.
TEST_CASE("cli: train refuses an output that is one of its inputs, naming both") {
  lockstep::test::TempDir dir;
  const std::string quickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";
  const fs::path shipped = fs::path(LOCKSTEP_SOURCE_DIR) / "third_party" / "digits" / "digits.csv";
  const fs::path data = dir.write("digits.csv", lockstep::test::read_text(shipped));
  const fs::path link = dir.path() / "link.csv";
  fs::create_symlink(data, link);
  const std::string before = lockstep::test::read_text(data);
  const std::string run = "train " + quickstart + " --set trainer.steps=2 --set data.path=" +
                          data.string() + " ";
  struct Case {
    std::string args, output, input;
  };
  for (const Case& c :
       {Case{"--summary-json " + data.string(), "--summary-json " + data.string(),
             "data.path " + data.string()},
        Case{"--set trainer.metrics=" + link.string(), "trainer.metrics " + link.string(),
             "data.path " + data.string()},
        Case{"--set trainer.report=" + quickstart, "trainer.report " + quickstart,
             "the config " + quickstart},
        Case{"--set trainer.trace=" + (dir.path() / "t.json").string() + " --summary-json " +
                 (dir.path() / "." / "t.json").string(),
             "--summary-json " + (dir.path() / "." / "t.json").string(),
             "trainer.trace " + (dir.path() / "t.json").string()}}) {
    CAPTURE(c.args);
    const CliResult r = bounded_cli(run + c.args);
    CHECK_MESSAGE(r.code == 2, r.output);
    CHECK_MESSAGE(r.output.find("error: " + c.output + ": is the same file as " + c.input) !=
                      std::string::npos,
                  r.output);
    CHECK(r.output.find("step 1") == std::string::npos);
  }
  CHECK(lockstep::test::read_text(data) == before);
  CHECK_FALSE(fs::exists(dir.path() / "t.json"));
}

// Note [A used checkpoint directory]: a new run leaves another run's checkpoints alone unless
// told to start over; --resume continues them.
TEST_CASE("cli: a new run refuses a checkpoint directory that holds another run's checkpoints") {
  lockstep::test::TempDir dir;
  const std::string quickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";
  const fs::path ckpt = dir.path() / "ckpt";
  const std::string run = "train " + quickstart + " --set trainer.checkpoint.dir=" + ckpt.string();
  REQUIRE(bounded_cli(run + " --set trainer.steps=4").code == 0);
  const fs::path first = ckpt / "step_00000004.safetensors";
  const std::string weights = lockstep::test::read_text(first);
  for (const std::string& extra : {std::string(), std::string(" --dry-run"),
                                   " --init-from " + first.string()}) {
    CAPTURE(extra);
    const CliResult again = bounded_cli(run + " --set trainer.steps=2" + extra);
    CHECK_MESSAGE(again.code == 2, again.output);
    CHECK_MESSAGE(again.output.find("error: trainer.checkpoint.dir " + ckpt.string() +
                                    ": holds the checkpoints of another run (step 4); a new run "
                                    "would replace them") != std::string::npos,
                  again.output);
    CHECK(again.output.find("--resume continues that run; --overwrite") != std::string::npos);
  }
  CHECK(lockstep::test::read_text(first) == weights);
  const CliResult resumed = bounded_cli(run + " --set trainer.steps=6 --resume");
  CHECK_MESSAGE(resumed.code == 0, resumed.output);
  CHECK(fs::exists(ckpt / "step_00000006.safetensors"));
  // Starting over removes them, as asked: none of the old run's is left to be taken for this one's.
  const CliResult over = bounded_cli(run + " --set trainer.steps=2 --overwrite");
  CHECK_MESSAGE(over.code == 0, over.output);
  CHECK(fs::exists(ckpt / "step_00000002.safetensors"));
  CHECK_FALSE(fs::exists(first));
  CHECK_FALSE(fs::exists(ckpt / "step_00000006.state"));
}

// Under a memory cap too small for the run, it ends with exit 1 naming what it was allocating:
// never a hang (OpenBLAS's threads retry their buffer forever, and the exit handler waited for
// them: Note [Leaving after a failure] in src/cli/main.cpp). The caps rise from where the binary
// cannot even load its libraries (127, the loader says so; or 130, OpenBLAS's constructor
// raising SIGINT when its threads cannot start, before main) to the first that leaves them
// loaded and the run too little; a thread of ours that cannot start for want of a stack fails
// as cleanly.
TEST_CASE("cli: out of memory ends the run with exit 1 naming the allocation, never a hang") {
  if (lockstep::test::kSanitized) return;  // ulimit -v: see bounded_cli
  lockstep::test::TempDir dir;
  const std::string gpt = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
  bool named = false;
  for (long kib = 300000; kib <= 4000000 && !named; kib += 50000) {
    CAPTURE(kib);
    const fs::path ckpt = dir.path() / std::to_string(kib);
    const CliResult r = lockstep::test::run_command(
        "(" + address_limit(kib) + lockstep::test::cli_path() + " train " + gpt +
        " --set trainer.steps=2 --set trainer.eval_every=0 --set trainer.checkpoint.dir=" +
        ckpt.string() + ")");
    // Before main: OpenBLAS's load-time constructor raises SIGINT when it cannot start its
    // threads (130), a window that opened once cuBLAS stopped being mapped at start (Note
    // [cuBLAS loaded on first use]); the loader's own refusal is 127.
    const bool openblas_at_load =
        r.code == 130 &&
        r.output.find("OpenBLAS blas_thread_init: pthread_create failed") != std::string::npos;
    REQUIRE_MESSAGE((r.code == 1 || r.code == 2 || r.code == 127 || openblas_at_load), r.output);
    if (r.code == 1)
      CHECK_MESSAGE((r.output.find("out of memory") != std::string::npos ||
                     r.output.find("cannot start") != std::string::npos),
                    r.output);
    named = r.code == 1 && r.output.find("out of memory allocating ") != std::string::npos;
  }
  CHECK(named);
}
