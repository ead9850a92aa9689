// The `lockstep` binary end to end: exit codes, messages for bad input, and the quickstart.
#include <doctest/doctest.h>

#include "cli_runner.hpp"
#include "lockstep/device.hpp"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

namespace fs = std::filesystem;

namespace {

using Result = lockstep::test::CliResult;
using lockstep::test::run_cli;

fs::path temp_dir() {
  const fs::path dir = fs::temp_directory_path() / "lockstep_cli_test";
  fs::create_directories(dir);
  return dir;
}

fs::path write(const std::string& name, const std::string& text) {
  const fs::path p = temp_dir() / name;
  std::ofstream(p) << text;
  return p;
}

const std::string kQuickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";

using lockstep::test::json_number;
std::string read(const fs::path& p) { return lockstep::test::read_text(p); }

}  // namespace

TEST_CASE("cli: help, version and bad flags") {
  CHECK(run_cli("--help").code == 0);
  CHECK(run_cli("--version").output.find("lockstep ") != std::string::npos);
  Result none = run_cli("");
  CHECK(none.code == 2);
  Result unknown = run_cli("frobnicate");
  CHECK(unknown.code == 2);
  CHECK(unknown.output.find("unknown command 'frobnicate'") != std::string::npos);
  Result flag = run_cli("train " + kQuickstart + " --bogus");
  CHECK(flag.code == 2);
  CHECK(flag.output.find("unknown option '--bogus'") != std::string::npos);
  Result missing_value = run_cli("train " + kQuickstart + " --set");
  CHECK(missing_value.code == 2);
  CHECK(run_cli("devices").code == 0);
}

TEST_CASE("cli: devices names the MPI and CUDA support built in, and requests no backend") {
  const Result r = run_cli("devices");
  CHECK(r.code == 0);
  CHECK(r.output.starts_with("lockstep "));
  CHECK(r.output.find("\nmpi: ") != std::string::npos);
  CHECK(r.output.find("\ncpu:0  ") != std::string::npos);
  CHECK(r.output.find("requested") == std::string::npos);
  const lockstep::CudaSupport cuda = lockstep::cuda_support();
  if (cuda.built) {
    // e.g. "no NVIDIA driver found; CUDA runtime 13.0, cuBLAS 13.1, NCCL 2.28.9 linked"
    const std::regex line(R"(\ncuda: built in \(.+; CUDA runtime \d+\.\d+, cuBLAS \d+\.\d+, )"
                          R"(NCCL \d+\.\d+\.\d+ linked\)\n)");
    CHECK(std::regex_search(r.output, line));
    CHECK(r.output.find("cuda: built in (" + cuda.summary + ")") != std::string::npos);
    // What runs the fused attention (issue 40: the GPU machine's cuDNN is not the one built
    // against), e.g. "cudnn: cuDNN 9.19.0 loaded (headers 9.19.0), frontend 1.32.0, ..."
    if (!cuda.cudnn.empty()) {
      const std::regex versions(R"(\ncudnn: cuDNN \d+\.\d+\.\d+ loaded \(headers )"
                                R"(\d+\.\d+\.\d+\), frontend \d+\.\d+\.\d+, SDPA forward )"
                                R"(composite\n)");
      CHECK(std::regex_search(r.output, versions));
    } else {
      CHECK(r.output.find("\ncudnn: not built in") != std::string::npos);
    }
    if (cuda.gpus == 0) CHECK(r.output.find("\ncuda:0  ") == std::string::npos);
    else CHECK(r.output.find("\ncuda:0  ") != std::string::npos);
  } else {
    CHECK(r.output.find("\ncuda: not built in (CPU-only build)\n") != std::string::npos);
  }
}

TEST_CASE("cli: each class of bad config exits 2 and names the key and line") {
  struct Case {
    std::string yaml, expect;
  };
  const Case cases[] = {
      {"trainer:\n  steps: 10\n  devcies: 2\n", "3:3: trainer.devcies: unknown key; did you mean 'trainer.devices'"},
      {"trainer:\n  steps: ten\n", "2:10: trainer.steps: expected an integer"},
      {"trainer:\n  steps: -4\n", "2:10: trainer.steps"},
      {"trainer:\n  steps: 5\noptimizer:\n  type: adam\n", "4:9: optimizer.type: expected one of"},
      {"trainer:\n  steps: 5\noptimizer:\n  lr: [1, 2]\n", "4:7: optimizer.lr"},
      {"trainer: [\n", "bad.yaml:"},
      {"trainer:\n  steps: 5\n  epochs: 2\n", "trainer.epochs"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.yaml);
    const fs::path cfg = write("bad.yaml", c.yaml);
    const Result r = run_cli("train " + cfg.string());
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.output.find(c.expect) != std::string::npos, r.output);
  }
  const Result missing = run_cli("train " + (temp_dir() / "nope.yaml").string());
  CHECK(missing.code == 2);
  CHECK(missing.output.find("nope.yaml") != std::string::npos);
  const Result set = run_cli("train " + kQuickstart + " --set trainer.steps=abc");
  CHECK(set.code == 2);
  CHECK(set.output.find("--set trainer.steps=abc") != std::string::npos);
}

TEST_CASE("cli: a bad data file exits 2 and names the file and line") {
  const fs::path csv = write("bad.csv", "1,2,0\n3,4,1\n5,x,1\n");
  const fs::path cfg = write("data.yaml", "data:\n  dataset: csv\n  path: " + csv.string() +
                                              "\ntrainer:\n  steps: 2\n");
  const Result r = run_cli("train " + cfg.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.output.find("bad.csv:3") != std::string::npos, r.output);
}

TEST_CASE("cli: the quickstart reaches 90% eval accuracy within its step budget") {
  const fs::path json = temp_dir() / "quickstart.json";
  const Result r = run_cli("train " + kQuickstart + " --summary-json " + json.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string s = read(json);
  CHECK(s.find("\"replicas_identical\": true") != std::string::npos);
  CHECK(json_number(s, "eval_accuracy") >= 0.90);
  CHECK(json_number(s, "steps") == 300);
}

TEST_CASE("cli: 1 device x batch 64 and 4 devices x batch 16 give the same eval loss") {
  const std::string common = " --set trainer.seed=7 --set trainer.steps=20";
  const fs::path a = temp_dir() / "one.json", b = temp_dir() / "four.json";
  REQUIRE(run_cli("train " + kQuickstart + common +
                  " --set trainer.devices=1 --set data.batch_size=64 --summary-json " + a.string())
              .code == 0);
  REQUIRE(run_cli("train " + kQuickstart + common +
                  " --set trainer.devices=4 --set data.batch_size=16 --summary-json " + b.string())
              .code == 0);
  const double la = json_number(read(a), "eval_loss"), lb = json_number(read(b), "eval_loss");
  CHECK(std::abs(la - lb) <= 1e-4 * std::abs(la));
}

TEST_CASE("cli: SIGINT finishes the step, leaves a loadable checkpoint and exits 130") {
  const fs::path dir = temp_dir() / "sigint_ckpt";
  fs::remove_all(dir);
  const std::string set_dir = "trainer.checkpoint.dir=" + dir.string();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    freopen("/dev/null", "w", stdout);
    execl(LOCKSTEP_CLI_PATH, "lockstep", "train", kQuickstart.c_str(), "--set",
          "trainer.steps=10000000", "--set", set_dir.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  REQUIRE(kill(pid, SIGINT) == 0);
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
      kill(pid, SIGKILL);
      FAIL("lockstep did not stop within 20 s of SIGINT");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  // The checkpoint it left exports and evaluates.
  const fs::path out = temp_dir() / "sigint.safetensors";
  const Result exported = run_cli("export " + dir.string() + " --out " + out.string());
  CHECK_MESSAGE(exported.code == 0, exported.output);
  CHECK(fs::exists(out));
  const Result evaluated = run_cli("eval " + kQuickstart + " --checkpoint " + dir.string());
  CHECK_MESSAGE(evaluated.code == 0, evaluated.output);
  CHECK(evaluated.output.find("eval loss") != std::string::npos);
}

TEST_CASE("cli: an injected fault exits 1 and names the worker") {
  const Result r = run_cli("train " + kQuickstart + " --set trainer.devices=3",
                           "LOCKSTEP_FAULT=2:10:forward");
  CHECK(r.code == 1);
  const std::string& output = r.output;
  CHECK_MESSAGE(output.find("worker 2 (cpu:2): injected fault: throw in forward at step 10") !=
                    std::string::npos,
                output);
}

// Note [Shrink]: the run goes on with the survivors and exits 0; below trainer.min_workers it
// stops as any failure does, with exit 1 and the reason.
TEST_CASE("cli: with on_worker_failure shrink a lost device leaves the run going, or says why not") {
  const std::string train = "train " + kQuickstart +
                            " --set trainer.devices=3 --set trainer.steps=12 "
                            "--set trainer.on_worker_failure=shrink --set trainer.stop_grace_s=2";
  const fs::path json = temp_dir() / "shrink.json";
  const Result r = run_cli(train + " --summary-json " + json.string(),
                           "LOCKSTEP_FAULT=2:5:lost:backward");
  CHECK_MESSAGE(r.code == 0, r.output);
  std::ifstream in(json);
  const std::string summary((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* counter : {"\"workers_lost\": 1,", "\"recoveries\": 1,", "\"steps_redone\": 0,",
                              "\"recovery_s\": "})
    CHECK_MESSAGE(summary.find(counter) != std::string::npos, counter << " in " << summary);
  CHECK_MESSAGE(r.output.find("note: worker 2 (cpu:2): injected fault: the device was lost in "
                              "backward at step 5; going on with 2 workers (cpu:0,1, 64 "
                              "samples per step) from the start of step 5") != std::string::npos,
                r.output);
  CHECK_MESSAGE(r.output.find("workers lost        1 (1 recovery, 0 steps redone, ") !=
                    std::string::npos,
                r.output);
  const auto start = std::chrono::steady_clock::now();
  const Result below = run_cli(train + " --set trainer.min_workers=3", "LOCKSTEP_FAULT=2:5:lost");
  CHECK_MESSAGE(below.code == 1, below.output);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2 + 5));
  CHECK_MESSAGE(below.output.find("shrink cannot go on: 2 of 3 workers are left, fewer than "
                                  "trainer.min_workers = 3") != std::string::npos,
                below.output);
}

TEST_CASE("cli: export and eval reject what is not a checkpoint") {
  const fs::path junk = write("junk.safetensors", "not a safetensors file at all");
  const Result ex = run_cli("export " + junk.string() + " --out " + (temp_dir() / "x.safetensors").string());
  CHECK(ex.code == 2);
  CHECK(ex.output.find("junk") != std::string::npos);
  const Result ev = run_cli("eval " + kQuickstart + " --checkpoint " + (temp_dir() / "none").string());
  CHECK(ev.code == 2);
  CHECK(run_cli("export").code == 2);
}

TEST_CASE("cli: export --dtype bf16 writes half the data bytes, and a bad --dtype exits 2") {
  const fs::path ckpt = temp_dir() / "dtype_ckpt";
  fs::remove_all(ckpt);
  const Result trained = run_cli("train " + kQuickstart + " --set trainer.steps=5 --set trainer.checkpoint.dir=" + ckpt.string());
  REQUIRE_MESSAGE(trained.code == 0, trained.output);
  const fs::path f32 = temp_dir() / "dtype32.safetensors", b16 = temp_dir() / "dtype16.safetensors";
  REQUIRE(run_cli("export " + ckpt.string() + " --out " + f32.string() + " --dtype fp32").code == 0);
  const Result exported = run_cli("export " + ckpt.string() + " --out=" + b16.string() + " --dtype=bf16");
  REQUIRE_MESSAGE(exported.code == 0, exported.output);
  // Files are 8 bytes of size, the header, then the data: 4 bytes a value in F32, 2 in BF16.
  const auto data_bytes = [](const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    std::uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), 8);
    return fs::file_size(file) - 8 - header;
  };
  CHECK(data_bytes(b16) * 2 == data_bytes(f32));
  CHECK(data_bytes(b16) > 0);

  const Result bad = run_cli("export " + ckpt.string() + " --out " + b16.string() + " --dtype fp16");
  CHECK(bad.code == 2);
  CHECK_MESSAGE(bad.output.find("--dtype: expected fp32 or bf16, got 'fp16'") != std::string::npos, bad.output);
}

TEST_CASE("cli: an unknown option that names a config key is told the --set that was meant") {
  const auto steps = run_cli("train " + kQuickstart + " --steps 10");
  CHECK(steps.code == 2);
  CHECK_MESSAGE(steps.output.find("train: unknown option '--steps'; to set the config key "
                                  "trainer.steps, write --set trainer.steps=10") !=
                    std::string::npos, steps.output);
  // --key=value, and a key given in full.
  CHECK(run_cli("train " + kQuickstart + " --lr=0.5").output.find(
            "write --set optimizer.lr=0.5") != std::string::npos);
  CHECK(run_cli("train " + kQuickstart + " --trainer.devices 2").output.find(
            "write --set trainer.devices=2") != std::string::npos);
  // A last part several keys share: each is named.
  CHECK(run_cli("eval " + kQuickstart + " --type sgd").output.find(
            "with KEY one of model.type, model.rope_scaling.type, optimizer.type, schedule.type") != std::string::npos);
  // Dashes alone name no key, and are an unknown option like any other.
  for (const std::string dashes : {" --", " --=3", " -"}) {
    CAPTURE(dashes);
    const auto r = run_cli("train " + kQuickstart + dashes);
    CHECK(r.code == 2);
    CHECK(r.output.find("unknown option") != std::string::npos);
  }
  // A command without --set is not told to use it.
  const auto tokenize = run_cli("tokenize --steps 3");
  CHECK(tokenize.code == 2);
  CHECK(tokenize.output.find("--set") == std::string::npos);
}
