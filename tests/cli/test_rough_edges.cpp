// What a new user met on a first run (issues 14, 26 and 27), each once: --help on a command
// (train's lists the config keys), the train loss's label, resuming a finished run, output
// directories, a batch larger than a shard, sgd's keys under adamw, the log lines on a terminal,
// backend cuda without a GPU, more CPU workers than cores, every config error at once, --set
// without '=', a config copied away from its data, lockstep config --print and what lockstep
// devices says a device is.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "../data/temp_files.hpp"
#include "../skip.hpp"
#include "cli_runner.hpp"
#include "lockstep/lockstep.hpp"
#include "train/settings_effect.hpp"

namespace fs = std::filesystem;

namespace {

using lockstep::test::run_cli;
using lockstep::test::run_command;

const std::string kQuickstart = "\"" + std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml\"";

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("cli: --help on a command prints the usage and exits 0") {
  for (const char* command : {"train --help", "train configs/x.yaml -h", "eval --help", "export --help",
                              "sample --help", "config --help"}) {
    CAPTURE(command);
    const auto r = run_cli(command);
    CHECK(r.code == 0);
    CHECK(r.output.rfind("usage: lockstep", 0) == 0);
  }
  // train's lists the config keys with their type, default and line; the general usage does not.
  const auto train = run_cli("train --help");
  CHECK(train.output.rfind("usage: lockstep train CONFIG", 0) == 0);
  CHECK(train.output.find("--dry-run") != std::string::npos);
  CHECK(train.output.find("\n  optimizer.lr: a number > 0; default 0.01\n      peak learning rate\n") !=
        std::string::npos);
  CHECK(train.output.find("\n  trainer.checkpoint.dir: a path; default unset\n") != std::string::npos);
  const auto general = run_cli("--help");
  CHECK(general.output.find("optimizer.lr:") == std::string::npos);
  CHECK(general.output.find("  config --print CONFIG [--set KEY=VALUE]...") != std::string::npos);
}

TEST_CASE("cli: the summary's train loss says it is the last log window's, and a finished run "
          "has nothing to resume") {
  const lockstep::test::TempDir dir;
  const std::string ckpt = " --set trainer.checkpoint.dir=" + (dir.path() / "c").string();
  const auto r = run_cli("train " + kQuickstart + " --set trainer.steps=20" + ckpt);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(r.output.find("  train loss          ") != std::string::npos);
  CHECK(r.output.find(", over the last log window\n") != std::string::npos);

  const auto again = run_cli("train " + kQuickstart + " --set trainer.steps=20 --resume" + ckpt);
  CHECK(again.code == 0);
  CHECK(again.output.find("nothing to do: the checkpoint is at step 20 and the run has 20 steps") !=
        std::string::npos);
  CHECK(again.output.find("summary") == std::string::npos);  // no summary of zeros
}

TEST_CASE("cli: output directories: --summary-json makes its own, export --out names a missing one") {
  const lockstep::test::TempDir dir;
  const std::string summary = (dir.path() / "new" / "deeper" / "s.json").string();
  const auto r = run_cli("train " + kQuickstart + " --set trainer.steps=2 --summary-json " + summary +
                         " --set trainer.checkpoint.dir=" + (dir.path() / "c").string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(lockstep::test::read_text(summary).find("\"steps\": 2") != std::string::npos);

  const std::string missing = (dir.path() / "absent").string();
  const auto ex = run_cli("export " + (dir.path() / "c").string() + " --out " + missing + "/m.safetensors");
  CHECK(ex.code == 2);
  CHECK(ex.output.find("directory '" + missing + "' does not exist") != std::string::npos);
  CHECK(ex.output.find(".tmp") == std::string::npos);
}

TEST_CASE("cli: a batch larger than a worker's shard warns once") {
  // 1438 training samples over 2 workers: shards of 719.
  const auto big = run_cli("train " + kQuickstart + " --set trainer.steps=3 --set data.batch_size=720");
  REQUIRE_MESSAGE(big.code == 0, big.output);
  CHECK(count(big.output, "warning: data.batch_size 720 is larger than each worker's shard of 719 "
                          "samples") == 1);
  const auto fits = run_cli("train " + kQuickstart + " --set trainer.steps=3 --set data.batch_size=719");
  CHECK(fits.output.find("warning: data.batch_size") == std::string::npos);
}

TEST_CASE("cli: sgd's momentum and nesterov under adamw are refused") {
  const auto r = run_cli("train " + kQuickstart + " --set optimizer.type=adamw");  // momentum: 0.9
  CHECK(r.code == 2);
  CHECK(r.output.find("quickstart.yaml:20:3: optimizer.momentum: not a key of adamw") != std::string::npos);
  const auto n = run_cli("train " + kQuickstart + " --set optimizer.type=adamw --set optimizer.momentum=0 "
                         "--set optimizer.nesterov=true");
  CHECK(n.code == 2);
  CHECK(n.output.find("optimizer.nesterov: not a key of adamw") != std::string::npos);
}

TEST_CASE("cli: on a terminal the log lines stay in the scrollback between live lines") {
  if (run_command("command -v script").code != 0)
    return lockstep::test::skip(lockstep::test::Skip::missing,
                                "no `script` (util-linux) to run the command on a terminal");
  const auto r = run_command("script -qec '" + std::string(LOCKSTEP_CLI_PATH) + " train " + kQuickstart +
                             " --set trainer.steps=100' /dev/null");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(r.output.find("| ETA ") != std::string::npos);  // the live line
  CHECK(r.output.find("\033[2Kstep 50/100 epoch 2 loss ") != std::string::npos);
  CHECK(r.output.find("\033[2Kstep 100/100 epoch 4 loss ") != std::string::npos);
}

// Note [A fix in the spelling used]: each command is told the fix as it would type it, and the
// driver's state as `lockstep devices` says it; train says nothing of training first.
TEST_CASE("cli: backend cuda without a usable GPU names the fix in the spelling of the command") {
  const lockstep::test::TempDir dir;
  const auto devices = run_cli("devices");
  REQUIRE(devices.code == 0);
  const std::string cuda_line = devices.output.substr(devices.output.find("\ncuda: ") + 1);
  if (cuda_line.find("GPU(s)") != std::string::npos || cuda_line.starts_with("cuda: not built"))
    return lockstep::test::skip(lockstep::test::Skip::setup,
                                "a GPU is here (or no CUDA build): the run without one cannot be seen");
  // "cuda: built in (STATE; linked versions)"
  const std::size_t open = cuda_line.find('(') + 1;
  const std::string state = cuda_line.substr(open, cuda_line.find("; ") - open);
  CHECK(state.find("insufficient") == std::string::npos);

  const auto set = run_cli("train " + kQuickstart + " --set trainer.backend=cuda --set trainer.steps=1 "
                           "--set trainer.devices=1 --set trainer.checkpoint.dir=null");
  CHECK(set.code == 2);
  CHECK_MESSAGE(set.output.find("--set trainer.backend=cuda: trainer.backend: cuda, but no usable GPU "
                                "here (" + state + "); to train on the CPU, --set "
                                "trainer.backend=cpu") != std::string::npos, set.output);
  CHECK(set.output.find("training ") == std::string::npos);

  // Set in the YAML: its file, line and column.
  std::string yaml = lockstep::test::read_text(std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml");
  const std::size_t at = yaml.find("  backend: auto\n");
  REQUIRE(at != std::string::npos);
  yaml.replace(at, 16, "  backend: cuda\n");
  const fs::path file = dir.write("cuda.yaml", yaml);
  const long line = std::count(yaml.begin(), yaml.begin() + static_cast<long>(at), '\n') + 1;
  const auto in_file = run_cli("train \"" + file.string() + "\" --set data.path=\"" LOCKSTEP_SOURCE_DIR
                               "/third_party/digits/digits.csv\" --set trainer.checkpoint.dir=null");
  CHECK(in_file.code == 2);
  CHECK_MESSAGE(in_file.output.find(file.string() + ":" + std::to_string(line) + ":3: trainer.backend: "
                                    "cuda, but no usable GPU here (" + state + "); to train on the "
                                    "CPU, set it to cpu there, or add --set trainer.backend=cpu") !=
                    std::string::npos, in_file.output);
  CHECK(in_file.output.find("training ") == std::string::npos);

  // sample takes --backend, not --set.
  const auto sample = run_cli("sample \"" + (dir.path() / "none").string() + "\" --backend cuda");
  CHECK(sample.code == 2);
  CHECK_MESSAGE(sample.output.find("--backend cuda: no usable GPU (" + state + "): give --backend cpu") !=
                    std::string::npos, sample.output);
  CHECK(sample.output.find("--set") == std::string::npos);
}

TEST_CASE("cli: more CPU workers than hardware threads warn, naming the count that fits") {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const auto r = run_cli("train " + kQuickstart + " --set trainer.backend=cpu --set trainer.steps=1 "
                         "--set trainer.devices=" + std::to_string(cores + 1));
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(count(r.output, "warning: trainer.devices: " + std::to_string(cores + 1) +
                                    " CPU workers on " + std::to_string(cores) +
                                    " hardware threads share the cores") == 1, r.output);
  CHECK(r.output.find("--set trainer.devices=" + std::to_string(cores) + " gives each worker") !=
        std::string::npos);
  const auto fits = run_cli("train " + kQuickstart + " --set trainer.backend=cpu --set trainer.steps=1 "
                            "--set trainer.devices=" + std::to_string(cores));
  CHECK(fits.output.find("warning: trainer.devices") == std::string::npos);
}

TEST_CASE("cli: every config error at once, each with its place, the hints and the leaves") {
  const lockstep::test::TempDir dir;
  const auto config = dir.write("c.yaml", "model:\n  hiden: [32]\n"
                                          "trainer:\n  steps: 5\n  checkpoint_dir: runs\n"
                                          "data: {dataset: synthetic}\n");
  const auto r = run_cli("train " + config.string() + " --set trainer.devices=two");
  CHECK(r.code == 2);
  CHECK(r.output.find("lockstep: error: " + config.string() + ":2:3: model.hiden: unknown key; did you "
                      "mean 'model.hidden'?\n" + config.string() + ":5:3: trainer.checkpoint_dir: unknown "
                      "key; did you mean 'trainer.checkpoint.dir'?\n--set trainer.devices=two: "
                      "trainer.devices: expected an integer or a list of device ids, got 'two'\n") !=
        std::string::npos);

  const auto list = run_cli("train " + config.string() + " --set model.hidden=128,64");
  CHECK(list.output.find("got '128,64'; a list is written [128,64]") != std::string::npos);
}

TEST_CASE("cli: --set KEY VALUE is told KEY=VALUE") {
  const auto train = run_cli("train " + kQuickstart + " --set optimizer.lr 0.1");
  CHECK(train.code == 2);
  CHECK(train.output.find("lockstep: error: --set optimizer.lr: expected KEY=VALUE, one argument: "
                          "--set optimizer.lr=0.1\n") != std::string::npos);
  const auto eval = run_cli("eval " + kQuickstart + " --checkpoint x --set trainer.devices 2");
  CHECK(eval.code == 2);
  CHECK(eval.output.find("--set trainer.devices=2") != std::string::npos);
}

TEST_CASE("cli: a config copied away from its data names the key and how the path was resolved") {
  const lockstep::test::TempDir dir;
  const auto config =
      dir.write("q.yaml", lockstep::test::read_text(std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml"));
  const auto r = run_cli("train " + config.string());
  CHECK(r.code == 2);
  CHECK(r.output.find("data.path: no such file: " + (dir.path().parent_path() / "third_party" / "digits" /
                                                      "digits.csv").string() +
                      " (the config says '../third_party/digits/digits.csv': relative to the config's "
                      "directory, " + dir.path().string() + ")") != std::string::npos);
}

// A config named without a directory ("lockstep train my.yaml") is in the working directory:
// its relative paths resolve there, in the error that names them and in a run that trains.
TEST_CASE("cli: a config named by its bare file name, from its own directory") {
  const lockstep::test::TempDir dir;
  const std::string text =
      lockstep::test::read_text(std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml");
  dir.write("away.yaml", text);
  const std::string cd = "cd \"" + dir.path().string() + "\" && ";
  const auto missing = run_command(cd + lockstep::test::cli_path() + " train away.yaml");
  CHECK_MESSAGE(missing.code == 2, missing.output);
  CHECK_MESSAGE(missing.output.find("(the config says '../third_party/digits/digits.csv': "
                                    "relative to the config's directory, " +
                                    dir.path().string() + ")") != std::string::npos,
                missing.output);
  const std::string digits = std::string(LOCKSTEP_SOURCE_DIR) + "/third_party/digits/digits.csv";
  dir.write("digits.csv", lockstep::test::read_text(digits));
  dir.write("here.yaml", std::regex_replace(text, std::regex("\\.\\./third_party/digits/digits\\.csv"),
                                            "digits.csv"));
  const auto trained = run_command(cd + lockstep::test::cli_path() +
                                   " train here.yaml --set trainer.steps=2 "
                                   "--summary-json s.json");
  CHECK_MESSAGE(trained.code == 0, trained.output);
  CHECK(fs::exists(dir.path() / "s.json"));
  const auto printed = run_command(cd + lockstep::test::cli_path() + " config --print here.yaml");
  CHECK_MESSAGE(printed.code == 0, printed.output);
  CHECK(printed.output.find("path: \"" + (dir.path() / "digits.csv").string() + "\"") != std::string::npos);
}

// Note [A setting that cannot take effect]: an error where it contradicts the run, else a
// warning naming the key and why.
TEST_CASE("cli: a setting that can never take effect is an error or a warning, never silence") {
  const std::string run = "train " + kQuickstart + " --set trainer.backend=cpu --set trainer.devices=2 "
                          "--set trainer.steps=2 ";
  const auto above = run_cli(run + "--set trainer.on_worker_failure=shrink --set trainer.min_workers=3");
  CHECK_MESSAGE(above.code == 2, above.output);
  CHECK_MESSAGE(above.output.find("trainer.min_workers 3 is above the run's 2 worker(s): it could "
                                  "never be met") != std::string::npos, above.output);
  CHECK(above.output.find("step 1") == std::string::npos);
  struct Case {
    std::string set, warning;
  };
  for (const Case& c :
       {Case{"trainer.cuda_graphs=on", "trainer.cuda_graphs: on: CUDA graphs run on the cuda "
                                       "backend only, and this run is on the cpu; the run goes on "
                                       "without it"},
        Case{"trainer.comm=nccl", "trainer.comm: nccl: a CUDA communicator"},
        Case{"trainer.snapshot_every=5", "trainer.snapshot_every: 5: applies to "
                                         "trainer.on_worker_failure: shrink"}}) {
    CAPTURE(c.set);
    const auto r = run_cli(run + "--set " + c.set);
    CHECK_MESSAGE(r.code == 0, r.output);
    CHECK_MESSAGE(count(r.output, "lockstep: warning: " + c.warning) == 1, r.output);
  }
  // The defaults, and what does take effect, say nothing.
  const auto quiet = run_cli(run + "--set trainer.cuda_graphs=off --set trainer.on_worker_failure=shrink "
                             "--set trainer.min_workers=2");
  CHECK_MESSAGE(quiet.code == 0, quiet.output);
  CHECK_MESSAGE(quiet.output.find("warning") == std::string::npos, quiet.output);
}

TEST_CASE("cli: config --print prints the resolved config, which reads back to itself") {
  const lockstep::test::TempDir dir;
  const auto r = run_cli("config --print " + kQuickstart + " --set trainer.steps=7 --set model.hidden=[8]");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(r.output.find("\n  hidden: [8]\n") != std::string::npos);
  CHECK(r.output.find("\n  steps: 7\n") != std::string::npos);
  CHECK(r.output.find("\n  path: \"" + std::string(LOCKSTEP_SOURCE_DIR) + "/third_party/digits/digits.csv\"\n") !=
        std::string::npos);
  const auto printed = dir.write("printed.yaml", r.output);
  const auto again = run_cli("config --print " + printed.string());
  REQUIRE_MESSAGE(again.code == 0, again.output);
  // The same text but for the first line, the comment that names the source.
  CHECK(again.output.substr(again.output.find('\n')) == r.output.substr(r.output.find('\n')));
  CHECK(run_cli("config " + kQuickstart).code == 2);
}

TEST_CASE("cli: devices says what a device is on each backend and how many workers suit this machine") {
  const auto r = run_cli("devices");
  REQUIRE(r.code == 0);
  CHECK(r.output.find("cpu backend: a device is a worker thread with its own replica and data shard\n") !=
        std::string::npos);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  CHECK(r.output.find("cpu: " + std::to_string(threads) + " hardware threads here; suggested "
                      "trainer.devices: " + std::to_string(threads) + ", one worker per hardware thread\n") !=
        std::string::npos);
  CHECK(r.output.find("cpu:0  host CPU  ") != std::string::npos);  // the device line stays
}

// The same rule where no CPU-only run can show it: threads_per_device on cuda, comm there.
TEST_CASE("settings_without_effect: each backend's settings, and the shrink keys under stop") {
  lockstep::Config cfg;
  cfg.source = "c.yaml";
  cfg.trainer.threads_per_device = 4;
  cfg.trainer.comm = lockstep::CommKind::peer;
  const std::vector<std::string> cuda = lockstep::detail::settings_without_effect(cfg, "cuda", 2);
  REQUIRE(cuda.size() == 1);
  CHECK(cuda[0] == "trainer.threads_per_device: 4: sizes the cpu backend's thread pools; this run "
                   "is on cuda; the run goes on without it");
  const std::vector<std::string> cpu = lockstep::detail::settings_without_effect(cfg, "cpu", 2);
  REQUIRE(cpu.size() == 1);
  CHECK(cpu[0].starts_with("trainer.comm: peer: a CUDA communicator"));
  cfg.trainer.keep_global_batch = true;
  CHECK(lockstep::detail::settings_without_effect(cfg, "cpu", 2).size() == 2);
  cfg.trainer.on_worker_failure = lockstep::WorkerFailurePolicy::shrink;
  CHECK(lockstep::detail::settings_without_effect(cfg, "cpu", 2).size() == 1);
  cfg.trainer.min_workers = 3;
  CHECK_THROWS_WITH_AS(lockstep::detail::settings_without_effect(cfg, "cpu", 2),
                       "c.yaml: trainer.min_workers 3 is above the run's 2 worker(s): it could "
                       "never be met (set it to at most 2, or train on more devices)",
                       lockstep::InputError);
}
