// The ProcessGroup's all-reduce across real processes under mpirun, through the program
// tests/mpi/ring_check.cpp, on both data planes: the shared-memory window, which processes on
// one node use (Note [Shared-memory all-reduce] in src/comm/mpi/shared_window_all_reduce.hpp),
// and the ring, which processes on several nodes use (Note [Ring all-reduce] in
// src/comm/mpi/ring_all_reduce.hpp), forced here with LOCKSTEP_MPI_SHARED_MEMORY=0. Exact sums
// for sizes from empty to several chunks and rounds, with 2 and 3 processes, and aborts
// mid-collective.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "cli/cli_runner.hpp"

using lockstep::test::run_command;

namespace {

enum class Plane { window, ring };

std::string mpirun(Plane plane, int processes, const std::string& mode) {
  return std::string(plane == Plane::ring ? "LOCKSTEP_MPI_SHARED_MEMORY=0 " : "") +
         LOCKSTEP_MPIEXEC + " --oversubscribe" +
         (geteuid() == 0 ? " --allow-run-as-root" : "") + " -np " + std::to_string(processes) +
         " " + LOCKSTEP_RING_CHECK_PATH + " " + mode;
}

void check_sums(Plane plane, const std::string& mode) {
  for (const int p : {2, 3}) {
    CAPTURE(p);
    const auto r = run_command(mpirun(plane, p, mode));
    CHECK_MESSAGE(r.code == 0, r.output);
    CHECK_MESSAGE(r.output.find("ring check: ok") != std::string::npos, r.output);
  }
}

// Runs `mode` with `p` processes: it must take under 15 s (a bounded stop: mpirun's start and
// the abort, with slack for a loaded machine), and every process must say that its collective
// ended with CommAborted in time and that its group is aborted.
void check_aborted(Plane plane, int p, const std::string& mode) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_command(mpirun(plane, p, mode));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(seconds < 15.0);
  for (int q = 0; q < p; ++q)
    CHECK_MESSAGE(r.output.find("process " + std::to_string(q) + ": aborted after") !=
                      std::string::npos,
                  r.output);
  CHECK_MESSAGE(r.output.find("not aborted") == std::string::npos, r.output);
  CHECK_MESSAGE(r.output.find("too late") == std::string::npos, r.output);
}

}  // namespace

TEST_CASE("mpi ring: exact sums and identical bits, sizes 0 to 3 x 2^20 + 1, 2 and 3 processes") {
  check_sums(Plane::ring, "sums");
}

TEST_CASE("mpi ring: a process aborted mid-collective returns at once, and so does its peer") {
  check_aborted(Plane::ring, 2, "abort");
}

TEST_CASE("mpi window: exact sums, and the bits of the sum in rank order, 2 and 3 processes") {
  check_sums(Plane::window, "rank-order");
}

TEST_CASE("mpi window: a process aborted mid-collective returns at once, and so does its peer") {
  check_aborted(Plane::window, 2, "abort");
}

TEST_CASE("mpi window: one process aborts mid-collective, and the others' collectives end") {
  for (const int p : {2, 3}) {
    CAPTURE(p);
    check_aborted(Plane::window, p, "peer-abort");
  }
}
