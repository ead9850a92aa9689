// The ProcessGroup's all-reduce across real processes under mpirun (Note [Ring all-reduce] in
// src/comm/mpi/ring_all_reduce.hpp), through the program tests/mpi/ring_check.cpp: exact sums
// for sizes from empty to several chunks, with 2 and 3 processes, and an abort mid-collective.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "cli/cli_runner.hpp"

using lockstep::test::run_command;

namespace {

std::string mpirun(int processes, const std::string& mode) {
  return std::string(LOCKSTEP_MPIEXEC) + " --oversubscribe" +
         (geteuid() == 0 ? " --allow-run-as-root" : "") + " -np " + std::to_string(processes) +
         " " + LOCKSTEP_RING_CHECK_PATH + " " + mode;
}

}  // namespace

TEST_CASE("mpi ring: exact sums and identical bits, sizes 0 to 2^20 + 3, 2 and 3 processes") {
  for (const int p : {2, 3}) {
    CAPTURE(p);
    const auto r = run_command(mpirun(p, "sums"));
    CHECK_MESSAGE(r.code == 0, r.output);
    CHECK_MESSAGE(r.output.find("ring check: ok") != std::string::npos, r.output);
  }
}

TEST_CASE("mpi ring: a process aborted mid-collective returns at once, and so does its peer") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_command(mpirun(2, "abort"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(seconds < 15.0);
  CHECK_MESSAGE(r.output.find("process 0: aborted after") != std::string::npos, r.output);
  CHECK_MESSAGE(r.output.find("process 1: aborted after") != std::string::npos, r.output);
}
