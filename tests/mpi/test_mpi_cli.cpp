// Multi-process runs end to end on localhost: `mpirun -np 2 lockstep train`, each process with
// 2 CPU workers, against one process with 4; a fault in one process; a config that differs
// between processes; a checkpoint resumed with another process count. Built and registered by
// CMake only when MPI is found (label "mpi"). mpirun runs with --oversubscribe (CI has 2 cores),
// and with --allow-run-as-root as root (CI).
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>

#include "cli/cli_runner.hpp"

namespace fs = std::filesystem;
using lockstep::test::cli_path;
using lockstep::test::json_number;
using lockstep::test::read_text;
using lockstep::test::run_cli;
using lockstep::test::run_command;

namespace {

const std::string kQuickstart = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/quickstart.yaml";

std::string mpirun() {
  return std::string(LOCKSTEP_MPIEXEC) + " --oversubscribe" +
         (geteuid() == 0 ? " --allow-run-as-root" : "");
}
// Two processes of `lockstep train CONFIG` plus `args`.
std::string mpirun_train(const std::string& args) {
  return mpirun() + " -np 2 " + cli_path() + " train " + kQuickstart + " " + args;
}

fs::path temp_dir() {
  const fs::path dir = fs::temp_directory_path() / "lockstep_mpi_test";
  fs::create_directories(dir);
  return dir;
}

const std::string kCommon = " --set trainer.seed=7 --set trainer.steps=40 --set trainer.eval_every=0";

}  // namespace

TEST_CASE("mpi: 2 processes x 2 devices give the eval loss of 1 process x 4 devices") {
  const fs::path one = temp_dir() / "one_x4.json", two = temp_dir() / "two_x2.json";
  fs::remove(two);
  const auto a = run_cli("train " + kQuickstart + kCommon + " --set trainer.devices=4 --summary-json " +
                         one.string());
  REQUIRE_MESSAGE(a.code == 0, a.output);
  const auto b = run_command(mpirun_train(kCommon + " --set trainer.devices=2 --summary-json " +
                                          two.string()));
  REQUIRE_MESSAGE(b.code == 0, b.output);
  // Process 0 alone prints and writes.
  CHECK(b.output.find("4 worker(s) (2 processes x 2)") != std::string::npos);
  const std::string s = read_text(two);
  CHECK(json_number(s, "processes") == 2);
  CHECK(json_number(s, "workers") == 4);
  // The replica check all-gathers every worker's parameter hash, over both processes.
  CHECK(s.find("\"replicas_identical\": true") != std::string::npos);
  const double la = json_number(read_text(one), "eval_loss"), lb = json_number(s, "eval_loss");
  CHECK(std::abs(la - lb) <= 1e-4 * std::abs(la));
}

TEST_CASE("mpi: a fault in one process ends every process non-zero within 15 s") {
  // Global rank 3 is process 1's second worker.
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_command("LOCKSTEP_FAULT=3:20:forward " +
                             mpirun_train("--set trainer.devices=2 --set trainer.steps=1000000"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(r.code != 0);
  CHECK(seconds < 15.0);  // a bounded stop: mpirun's start and the abort, with slack for load
  CHECK_MESSAGE(r.output.find("process 1 of 2: failed: worker 3 (cpu:1): injected fault: throw in "
                              "forward at step 20") != std::string::npos,
                r.output);
}

TEST_CASE("mpi: a config that differs between processes is refused at start-up") {
  // One process each, the second with another model.
  const std::string cmd = mpirun() + " -np 1 " + cli_path() +
                          " train " + kQuickstart + " : -np 1 " + cli_path() + " train " +
                          kQuickstart + " --set model.hidden=[32]";
  const auto r = run_command(cmd);
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.output.find("process 1 of 2 differs from process 0 in the config hash") !=
                    std::string::npos,
                r.output);
}

TEST_CASE("mpi: a checkpoint of 2 processes x 2 devices resumes in 1 process x 4 devices") {
  const fs::path dir = temp_dir() / "ckpt", resumed = temp_dir() / "resumed.json",
                 straight = temp_dir() / "straight.json";
  fs::remove_all(dir);
  // A constant schedule: a cosine one would depend on trainer.steps, which differs here.
  const std::string steps =
      " --set trainer.seed=7 --set trainer.eval_every=0 --set schedule.type=constant";
  const auto a = run_command(mpirun_train(steps + " --set trainer.steps=20 --set trainer.devices=2"
                                          " --set trainer.checkpoint.dir=" + dir.string()));
  REQUIRE_MESSAGE(a.code == 0, a.output);
  CHECK(fs::exists(dir / "step_00000020.state"));
  const auto b = run_cli("train " + kQuickstart + steps + " --set trainer.steps=40 --set "
                         "trainer.devices=4 --resume " + dir.string() + " --summary-json " +
                         resumed.string());
  REQUIRE_MESSAGE(b.code == 0, b.output);
  CHECK(b.output.find("resuming from") != std::string::npos);
  const auto c = run_cli("train " + kQuickstart + steps + " --set trainer.steps=40 --set "
                         "trainer.devices=4 --summary-json " + straight.string());
  REQUIRE_MESSAGE(c.code == 0, c.output);
  // The same world size: the same samples in the same steps, up to the order of the sums.
  const double lr = json_number(read_text(resumed), "eval_loss"),
               ls = json_number(read_text(straight), "eval_loss");
  CHECK(std::abs(lr - ls) <= 1e-4 * std::abs(ls));
}
