// Two processes training as one job over SocketProcesses (two_process_run.cpp), on the CPU
// backend: the trainer's multi-process path with a ProcessGroup other than MPI's, and the
// launcher that scripts/gpu_check.sh uses to run NCCL with two real ranks on one GPU (issue 31).
//   - 2 processes x 1 worker end with the parameters of 1 process x 2 workers, with and without
//     ZeRO-1: each worker sums the same two gradients in the same order (hierarchical
//     all-reduce, Note [Hierarchical all-reduce]: with one worker per process it is the
//     processes' sum, rank 0's first);
//   - a fault in process 1 ends both processes within 10 s, with the job's status 1.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>

#include <fmt/format.h>

#include "../cli/cli_runner.hpp"

namespace fs = std::filesystem;
using lockstep::test::read_text;
using lockstep::test::run_cli;
using lockstep::test::run_command;

namespace {

const std::string kConfig = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/gpt_tiny.yaml";

// gpt_tiny cut to 2 layers of width 64, for 6 steps, evaluated on 2% of the play, with nothing
// written but the summary.
std::string tiny_run(int devices, int zero, const fs::path& summary) {
  return fmt::format(
      "\"{}\" --set trainer.devices={} --set trainer.zero={} --set trainer.steps=6 "
      "--set trainer.backend=cpu --set trainer.checkpoint.dir=null --set data.batch_size=4 "
      "--set model.n_layer=2 --set model.d_model=64 --set data.eval_fraction=0.02 "
      "--summary-json \"{}\"",
      kConfig, devices, zero, summary.string());
}

std::string param_hash(const fs::path& summary) {
  std::smatch m;
  const std::string json = read_text(summary);
  static const std::regex re("\"param_hash\": \"([0-9a-f]+)\"");
  REQUIRE_MESSAGE(std::regex_search(json, m, re), "no param_hash in " << json);
  return m[1];
}

}  // namespace

TEST_CASE("two processes over sockets: 2 x 1 CPU workers end as 1 x 2 workers, zero 0 and 1") {
  const fs::path dir = fs::temp_directory_path() / "lockstep_two_process";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (int zero : {0, 1}) {
    CAPTURE(zero);
    const auto two = run_command(std::string("\"") + LOCKSTEP_TWO_PROCESS_PATH + "\" " +
                                 tiny_run(1, zero, dir / "two.json"));
    REQUIRE_MESSAGE(two.code == 0, two.output);
    CHECK(two.output.find("replicas identical: true") != std::string::npos);
    const auto one = run_cli("train " + tiny_run(2, zero, dir / "one.json"));
    REQUIRE_MESSAGE(one.code == 0, one.output);
    CHECK(param_hash(dir / "two.json") == param_hash(dir / "one.json"));
  }
  fs::remove_all(dir);
}

TEST_CASE("two processes over sockets: a fault in process 1 ends both within 10 s, status 1") {
  const fs::path dir = fs::temp_directory_path() / "lockstep_two_process_fault";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_command(std::string("LOCKSTEP_FAULT=1:3:forward timeout -s KILL 60 \"") +
                             LOCKSTEP_TWO_PROCESS_PATH + "\" " + tiny_run(1, 0, dir / "s.json"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_MESSAGE(r.code == 1, r.output);
  CHECK(seconds < 10.0);
  CHECK(r.output.find("injected fault") != std::string::npos);
  CHECK(!fs::exists(dir / "s.json"));
  fs::remove_all(dir);
}
