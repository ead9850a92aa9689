// The reference for the across-process all-reduce: the MPI library's own blocking
// MPI_Allreduce of floats, timed as bench_allreduce times lockstep's path through MPI.
//
//   mpirun -np 2 build/bench/bench_mpi_allreduce [--reps 20] [--max-mb 64] [--csv FILE]
//
// algbw = bytes / time, busbw = algbw * 2(n-1)/n; median of the repetitions (a quarter of them,
// at least 3, from 64 MB), each between two barriers, after 2 warm-ups. Process 0 prints.
// lockstep itself never blocks inside MPI (Note [One MPI thread]); this program does, as a
// plain MPI application would.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "stats.hpp"

using namespace lockstep;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int reps = 20, rank = 0, size = 1;
  std::size_t max_mb = 64;
  std::string csv;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--max-mb")) max_mb = std::stoul(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--csv")) csv = argv[i + 1];
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::ofstream out;
  if (rank == 0) {
    if (!csv.empty()) (out.open(csv), out << "ranks,bytes,time_us,algbw_gbs,busbw_gbs\n");
    fmt::print("{:>5} {:>12} {:>10} {:>10} {:>10}  (blocking MPI_Allreduce)\n", "ranks", "bytes",
               "time_us", "algbw GB/s", "busbw GB/s");
  }
  for (std::size_t bytes = 4096; bytes <= max_mb << 20; bytes *= 4) {
    const int r = bytes >= (64u << 20) ? std::max(3, reps / 4) : reps;
    std::vector<float> buf(bytes / sizeof(float), 1.0f + static_cast<float>(rank));
    std::vector<double> times;
    for (int i = 0; i < r + 2; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = bench::now_s();
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      MPI_Barrier(MPI_COMM_WORLD);  // the slowest process ends the collective
      if (i >= 2) times.push_back(bench::now_s() - t0);
    }
    if (rank != 0) continue;
    const double t = bench::median(times), algbw = static_cast<double>(bytes) / t / 1e9;
    const double busbw = algbw * 2.0 * (size - 1) / size;
    fmt::print("{:>5} {:>12} {:>10.1f} {:>10.2f} {:>10.2f}\n", size, bytes, t * 1e6, algbw, busbw);
    if (out) out << fmt::format("{},{},{:.2f},{:.3f},{:.3f}\n", size, bytes, t * 1e6, algbw, busbw);
  }
  MPI_Finalize();
  return 0;
}
