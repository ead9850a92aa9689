// Bandwidth of the shared-memory all-reduce against a plain memcpy of the same bytes.
//
// algbw = bytes / time and busbw = algbw * 2(n-1)/n, as nccl-tests define them. The memcpy
// column is one thread copying the same buffer size; "bus/memcpy" is the ratio of the two.
//
//   build/bench/bench_allreduce [--reps 20] [--max-mb 256] [--csv FILE]
//
// Under mpirun (mpirun -np 2 build/bench/bench_allreduce ...) it measures instead the all-reduce
// across processes, one worker per process: the hierarchical communicator's path through the
// MPI process group (see comm.hpp; on one node its shared-memory window, with
// LOCKSTEP_MPI_SHARED_MEMORY=0 the ring), the ranks being the processes. Each repetition ends
// with a barrier through the MPI thread, which the time includes. Process 0 prints and writes
// the CSV.
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/comm.hpp"
#include "stats.hpp"

using namespace lockstep;

namespace {

double memcpy_seconds(std::size_t bytes, int reps) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    const double t0 = bench::now_s();
    std::memcpy(b.data(), a.data(), bytes);
    const double dt = bench::now_s() - t0;
    if (r >= 2) t.push_back(dt);
    a[r % bytes] = b[(r * 7) % bytes];  // keep the copies observable
  }
  return bench::median(t);
}

// Median seconds of one all-reduce of `count` floats on every communicator of `comms` (this
// process's workers, one thread each), timed by local worker 0 between two barriers.
double all_reduce_seconds(std::vector<std::unique_ptr<Communicator>> comms, std::size_t count,
                          int reps) {
  const int n = static_cast<int>(comms.size());
  std::vector<double> times;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      Communicator& c = *comms[rank];
      std::vector<float> buf(count, 1.0f + rank);
      for (int r = 0; r < reps + 2; ++r) {
        c.barrier();
        const double t0 = bench::now_s();
        c.all_reduce(buf.data(), count, ReduceOp::sum);
        c.barrier();  // the slowest rank ends the collective
        if (rank == 0 && r >= 2) times.push_back(bench::now_s() - t0);
      }
    });
  }
  for (auto& t : threads) t.join();
  return bench::median(times);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  std::size_t max_mb = 256;
  std::string csv;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--max-mb")) max_mb = std::stoul(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--csv")) csv = argv[i + 1];
  }
  std::ofstream out;
  const std::shared_ptr<ProcessGroup> processes = make_mpi_processes();
  const bool across = processes && processes->size() > 1;
  const bool leader = !processes || processes->rank() == 0;
  if (!csv.empty() && leader) {
    out.open(csv);
    out << "ranks,bytes,time_us,algbw_gbs,busbw_gbs,memcpy_gbs,bus_over_memcpy\n";
  }
  if (leader)
    fmt::print("{:>5} {:>12} {:>10} {:>10} {:>10} {:>11} {:>11}\n", "ranks", "bytes", "time_us",
             "algbw GB/s", "busbw GB/s", "memcpy GB/s", "bus/memcpy");
  const std::vector<int> groups = across ? std::vector<int>{processes->size()} : std::vector<int>{2, 4};
  for (int n : groups) {
    for (std::size_t bytes = 4096; bytes <= max_mb << 20; bytes *= 4) {
      const int r = bytes >= (64u << 20) ? std::max(3, reps / 4) : reps;
      auto comms = across ? make_hierarchical_group(make_shared_memory_group(1), processes)
                          : make_shared_memory_group(n);
      const double t = all_reduce_seconds(std::move(comms), bytes / sizeof(float), r);
      if (!leader) continue;
      const double algbw = static_cast<double>(bytes) / t / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      const double mem = static_cast<double>(bytes) / memcpy_seconds(bytes, r) / 1e9;
      fmt::print("{:>5} {:>12} {:>10.1f} {:>10.2f} {:>10.2f} {:>11.2f} {:>11.2f}\n", n, bytes,
                 t * 1e6, algbw, busbw, mem, busbw / mem);
      if (out) out << fmt::format("{},{},{:.2f},{:.3f},{:.3f},{:.3f},{:.3f}\n", n, bytes, t * 1e6,
                                  algbw, busbw, mem, busbw / mem);
    }
  }
  return 0;
}
