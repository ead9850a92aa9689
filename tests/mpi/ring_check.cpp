// Run under mpirun by tests/mpi/test_mpi_ring.cpp: the ProcessGroup's all-reduce across real
// processes, through the shared-memory window when they share a node (Note [Shared-memory
// all-reduce] in src/comm/mpi/shared_window_all_reduce.hpp), through the ring with
// LOCKSTEP_MPI_SHARED_MEMORY=0, as between nodes (Note [Ring all-reduce] in
// src/comm/mpi/ring_all_reduce.hpp).
//
//   mpirun -np P lockstep_mpi_ring_check sums        every size class, exact sums, identical bits
//   mpirun -np P lockstep_mpi_ring_check rank-order  the bits of the sum in rank order (window)
//   mpirun -np 2 lockstep_mpi_ring_check abort       each process aborts itself mid-collective
//   mpirun -np P lockstep_mpi_ring_check peer-abort  the last process aborts mid-collective, the
//                                                    others only learn it from the window
//
// Prints "ring check: ok" (process 0) or what failed, and exits 0 or 1.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm.hpp"

using namespace lockstep;

namespace {

// A value every process can compute for any process, so each knows the exact sum.
float small_integer(int rank, std::size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 1000 + 1));
}
// A value whose sums round: for the check that every process ends with the same bits.
float fraction(int rank, std::size_t i) {
  return 1.0f / static_cast<float>(3 + rank) + 1e-3f * static_cast<float>(i % 977);
}

std::uint64_t hash_bits(const std::vector<float>& v) {
  std::uint64_t h = 1469598103934665603ull;
  for (float x : v) {
    std::uint32_t b = 0;
    std::memcpy(&b, &x, sizeof b);
    h = (h ^ b) * 1099511628211ull;
  }
  return h;
}

// Sizes around the ring's chunk (65536 floats) and its segments, and the window's round (2^18
// floats: the two largest take 5 and 13 rounds), from empty to several chunks per segment,
// none a multiple of the process count but some.
constexpr std::size_t kSizes[] = {0,     1,     2,     3,         5,
                                  1000,  65535, 65536, 65537,     3 * 65536 + 7,
                                  (std::size_t{1} << 20) + 3, (std::size_t{3} << 20) + 1};

// The sum of fraction(0, i), fraction(1, i), ... in rank order, as the window adds them.
float rank_order_sum(int processes, std::size_t i) {
  float acc = fraction(0, i) + fraction(1, i);
  for (int q = 2; q < processes; ++q) acc += fraction(q, i);
  return acc;
}

// Exact sums of small integers; sums that round: the same bits in every process, and the bits
// of a + b with two processes (either order: ring and window alike) or, with `rank_order`, of
// the sum in rank order for any count (the window's; the ring's order differs from three on).
bool check_sums(ProcessGroup& g, bool rank_order) {
  const int p = g.size(), r = g.rank();
  bool ok = true;
  for (const std::size_t n : kSizes) {
    std::vector<float> a(n), b(n);
    for (std::size_t i = 0; i < n; ++i) (a[i] = small_integer(r, i), b[i] = fraction(r, i));
    g.all_reduce(a.data(), n);
    g.all_reduce(b.data(), n);
    for (std::size_t i = 0; i < n && ok; ++i) {
      const float want = static_cast<float>(p * (p + 1) / 2) * static_cast<float>(i % 1000 + 1);
      if (a[i] != want) {
        std::printf("process %d: size %zu: element %zu is %g, expected %g\n", r, n, i, a[i], want);
        ok = false;
      }
      if ((p == 2 || rank_order) && b[i] != rank_order_sum(p, i)) {
        std::printf("process %d: size %zu: element %zu is not the sum in rank order\n", r, n, i);
        ok = false;
      }
    }
    const std::uint64_t mine = hash_bits(b);
    for (const std::uint64_t h : g.all_gather(std::span<const std::uint64_t>(&mine, 1))) {
      if (h != mine) {
        std::printf("process %d: size %zu: processes differ in their bits\n", r, n);
        ok = false;
      }
    }
  }
  return ok;
}

// Every process finishes one large all-reduce and then runs more, one after another, until
// one ends with CommAborted: the last process aborts itself after 2 ms, so some collective is
// in flight when it does however late the aborter thread gets a core (one collective took 6 ms
// on the window, and on a busy machine the aborter once woke only after it had ended). With
// `all_abort` the others abort themselves too, after 300 ms (left waiting for a peer that is
// gone, where the ring cannot tell them); without it they never do, and must learn it from the
// window. Each caller must get CommAborted and may free its buffer at once: nothing touches it
// any more.
bool check_abort(ProcessGroup& g, bool all_abort) {
  const int r = g.rank();
  const bool last = r == g.size() - 1;
  std::vector<float> data(std::size_t{16} << 20, 1.0f);  // 64 MB: some ms on either path
  g.all_reduce(data.data(), data.size());
  std::thread aborter([&] {
    if (!last && !all_abort) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(last ? 2 : 300));
    g.abort();
  });
  const auto t0 = std::chrono::steady_clock::now();
  bool aborted = false;
  try {
    for (int i = 0; i < 1000; ++i) g.all_reduce(data.data(), data.size());
  } catch (const CommAborted&) {
    aborted = true;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  data = {};  // freed while the ring's calls may still be pending
  aborter.join();
  // A bounded stop is a time by contract: idle, the abort lands within milliseconds of the
  // aborter's (2 ms, or 300 ms when every process aborts itself); 2 s and 5 s are the slack for
  // a loaded 2-core machine running two processes.
  const bool late = s > (all_abort ? 5.0 : 2.0);
  std::printf("process %d: %s after %.3f s%s%s\n", r, aborted ? "aborted" : "not aborted", s,
              late ? ", too late" : "", g.aborted() ? "" : ", but the group is not aborted");
  return aborted && !late && g.aborted();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const auto g = make_mpi_processes();
  if (!g) {
    std::puts("ring check: not started by an MPI launcher");
    return 1;
  }
  if (mode == "abort" || mode == "peer-abort") {
    const bool ok = check_abort(*g, mode == "abort");
    std::fflush(stdout);
    // Leave once the others have printed too: the launcher ends the job at the first exit.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    // An aborted group leaves without MPI_Finalize (a call may still be pending): end the job.
    std::_Exit(ok ? 0 : 1);
  }
  const bool ok = check_sums(*g, mode == "rank-order");
  if (g->rank() == 0 && ok) std::puts("ring check: ok");
  return ok ? 0 : 1;
}
