// How much all-reduce time the reducer hides behind backward, on the CPU backend.
//
// A deep MLP of equal layers gets one bucket per layer. The interconnect is emulated (see
// LOCKSTEP_EMULATE_INTERCONNECT in include/lockstep/comm.hpp) with a bandwidth calibrated so
// that one step's all-reduce at N = 2 costs two thirds of a one-worker step, as on a slow link:
// that is about twice the backward pass (bench/RESULTS.md timed backward at a third of the step,
// the per-bucket updates at two fifths), so part of the all-reduce can hide only behind the
// updates. Runs
// alternate overlap off / on; the table gives median steps/s and the hidden fraction, which the
// trainer derives from the same per-bucket timestamps its trace shows.
//
//   build/bench/bench_overlap [--runs 3] [--steps 60] [--alpha-us 20] [--gbps G] [--csv FILE]
//                             [--trace PREFIX]
//
// --trace instead runs overlap on once for each N and writes PREFIX.nN.json: the timeline of
// backward's layers, each bucket's all-reduce and each wait for one (see src/train/trace.hpp).
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"
#include "stats.hpp"

using namespace lockstep;

namespace {

constexpr int kWidth = 512, kLayers = 8, kBatch = 64;

Config make_config(int workers, bool overlap, std::int64_t steps) {
  Config cfg = bench::cpu_sgd_config(std::vector<int>(kLayers, kWidth), kBatch, workers, steps);
  cfg.trainer.threads_per_device = 1;
  cfg.trainer.bucket_cap_mb = 1.0;  // one bucket per 512x512 layer
  cfg.trainer.overlap = overlap;
  return cfg;
}

struct Result {
  double steps_per_s;
  Summary summary;
};

// Steady-state steps/s: the first fifth of the steps is warm-up.
Result run(const Config& cfg, const std::shared_ptr<const Dataset>& data) {
  Trainer trainer(cfg, data, nullptr);
  const std::int64_t steps = cfg.trainer.steps, warmup = steps / 5;
  double t0 = 0.0, t1 = 0.0;
  trainer.on_progress([&](const StepMetrics& m) {
    if (m.step == warmup) t0 = m.elapsed_s;
    if (m.step == steps) t1 = m.elapsed_s;
  });
  Summary s = trainer.run();
  return {static_cast<double>(steps - warmup) / (t1 - t0), s};
}

void emulate(double alpha_us, double gbps) {
  if (gbps > 0)
    setenv("LOCKSTEP_EMULATE_INTERCONNECT", fmt::format("{},{}", alpha_us, gbps).c_str(), 1);
  else
    unsetenv("LOCKSTEP_EMULATE_INTERCONNECT");
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 3;
  std::int64_t steps = 60;
  double alpha_us = 20.0, gbps = 0.0;
  std::string csv, trace;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--runs")) runs = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--alpha-us")) alpha_us = std::stod(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--gbps")) gbps = std::stod(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--csv")) csv = argv[i + 1];
    else if (!std::strcmp(argv[i], "--trace")) trace = argv[i + 1];
  }
  auto data = std::make_shared<InMemoryDataset>(make_synthetic(8192, kWidth, 10, 1));
  const std::size_t bytes = Model::mlp({.inputs = kWidth,
                                        .hidden = std::vector<int>(kLayers, kWidth),
                                        .classes = 10})
                                .param_count() *
                            sizeof(float);

  if (gbps <= 0.0) {
    // One worker, no communication: two thirds of its step (see the top of the file).
    emulate(0, 0);
    std::vector<double> v;
    for (int r = 0; r < runs; ++r) v.push_back(run(make_config(1, false, steps), data).steps_per_s);
    const double wire_s = (2.0 / 3.0) / bench::median(v);
    gbps = static_cast<double>(bytes) / wire_s / 1e9;  // 2(n-1)/n = 1 at n = 2
    fmt::print("calibrated: step {:.2f} ms at N=1, two thirds of it {:.2f} ms for {:.1f} MB of "
               "gradients -> emulated link {:.3f} GB/s, alpha {} us\n",
               1e3 / bench::median(v), 1e3 * wire_s, bytes / 1e6, gbps, alpha_us);
  }
  emulate(alpha_us, gbps);
  if (!trace.empty()) {  // one traced run per worker count, overlap on
    for (int n : {1, 2, 4}) {
      Config cfg = make_config(n, true, steps);
      cfg.trainer.trace = fmt::format("{}.n{}.json", trace, n);
      const Result res = run(cfg, data);
      fmt::print("N={} traced: {:.2f} steps/s, hidden {:.0f}% -> {}\n", n, res.steps_per_s,
                 100.0 * res.summary.comm_hidden_fraction, cfg.trainer.trace);
    }
    return 0;
  }

  std::ofstream out;
  if (!csv.empty()) {
    out.open(csv);
    out << "workers,overlap,steps_per_s,samples_per_s,comm_s,exposed_s,hidden_fraction,speedup,efficiency\n";
  }
  fmt::print("{:>7} {:>8} {:>9} {:>11} {:>8} {:>10} {:>8} {:>10}\n", "workers", "overlap",
             "steps/s", "samples/s", "hidden", "exposed_s", "speedup", "efficiency");
  double one = 0.0;
  for (int n : {1, 2, 4}) {
    std::vector<double> sps[2], hidden[2], exposed[2], comm[2];
    for (int r = 0; r < runs; ++r)
      for (int overlap : {0, 1}) {  // alternate, so drift in machine load hits both alike
        const Result res = run(make_config(n, overlap, steps), data);
        sps[overlap].push_back(res.steps_per_s);
        hidden[overlap].push_back(res.summary.comm_hidden_fraction);
        exposed[overlap].push_back(res.summary.comm_exposed_s);
        comm[overlap].push_back(res.summary.comm_s);
      }
    // The baseline is one worker with overlap on; set before either N = 1 row is printed.
    if (n == 1) one = bench::median(sps[1]) * kBatch;
    for (int overlap : {0, 1}) {
      const double s = bench::median(sps[overlap]);
      const double samples = s * kBatch * n;
      const double speedup = samples / one;
      fmt::print("{:>7} {:>8} {:>9.2f} {:>11.0f} {:>7.0f}% {:>10.3f} {:>8.2f} {:>9.0f}%\n", n,
                 overlap ? "on" : "off", s, samples, 100.0 * bench::median(hidden[overlap]),
                 bench::median(exposed[overlap]), speedup, 100.0 * speedup / n);
      if (out)
        out << fmt::format("{},{},{:.3f},{:.1f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f}\n", n,
                           overlap ? "on" : "off", s, samples, bench::median(comm[overlap]),
                           bench::median(exposed[overlap]),
                           bench::median(hidden[overlap]), speedup, speedup / n);
    }
  }
  return 0;
}
