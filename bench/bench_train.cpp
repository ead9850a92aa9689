// Training throughput of the CPU backend at N = 1, 2, 4 workers, for the quickstart MLP and a
// larger synthetic MLP. Reports the median steady-state steps/s and samples/s over several runs
// (the first `warmup` steps of each run are excluded), and the speedup against N = 1.
//
//   build/bench/bench_train [--runs 5] [--steps 200] [--csv FILE]
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"
#include "stats.hpp"

using namespace lockstep;

namespace {

struct Workload {
  std::string name;
  std::shared_ptr<const Dataset> train;
  std::vector<int> hidden;
  int batch;  // per worker
};

// Steady-state steps/s of one run: the time from the end of step `warmup` to the last step.
double steps_per_s(const Workload& w, int workers, std::int64_t steps, std::int64_t warmup) {
  const Config cfg = bench::cpu_sgd_config(w.hidden, w.batch, workers, steps);
  Trainer trainer(cfg, w.train, nullptr);
  double t_warm = 0.0, t_end = 0.0;
  trainer.on_progress([&](const StepMetrics& m) {
    if (m.step == warmup) t_warm = m.elapsed_s;
    if (m.step == steps) t_end = m.elapsed_s;
  });
  trainer.run();
  return static_cast<double>(steps - warmup) / (t_end - t_warm);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  std::int64_t steps = 200;
  std::string csv;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--runs")) runs = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--csv")) csv = argv[i + 1];
  }
  const std::int64_t warmup = std::min<std::int64_t>(20, steps / 4);

  auto digits = std::make_shared<InMemoryDataset>(
      load_csv(std::string(LOCKSTEP_BENCH_SOURCE_DIR) + "/third_party/digits/digits.csv", -1, false));
  const std::vector<Workload> workloads = {
      {"quickstart MLP 64-64-10, batch 32/worker", digits, {64}, 32},
      {"synthetic MLP 256-1024-1024-10, batch 128/worker",
       std::make_shared<InMemoryDataset>(make_synthetic(20000, 256, 10, 1)), {1024, 1024}, 128},
  };

  std::ofstream out;
  if (!csv.empty()) {
    out.open(csv);
    out << "workload,workers,steps_per_s,samples_per_s,speedup,efficiency\n";
  }
  fmt::print("{:<52} {:>7} {:>10} {:>12} {:>8} {:>10}\n", "workload", "workers", "steps/s",
             "samples/s", "speedup", "efficiency");
  for (const Workload& w : workloads) {
    double base = 0.0;
    for (int n : {1, 2, 4}) {
      std::vector<double> v;
      for (int r = 0; r < runs; ++r) v.push_back(steps_per_s(w, n, steps, warmup));
      const double sps = bench::median(v);
      // Each worker takes a batch per step, so ideal scaling keeps steps/s constant and
      // multiplies samples/s by N.
      const double samples = sps * w.batch * n;
      if (n == 1) base = samples;
      const double speedup = samples / base;
      fmt::print("{:<52} {:>7} {:>10.1f} {:>12.0f} {:>8.2f} {:>9.0f}%\n", w.name, n, sps, samples,
                 speedup, 100.0 * speedup / n);
      if (out) out << fmt::format("\"{}\",{},{:.2f},{:.0f},{:.3f},{:.3f}\n", w.name, n, sps, samples,
                                  speedup, speedup / n);
    }
  }
  return 0;
}
