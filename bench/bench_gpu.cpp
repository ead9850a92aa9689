// Training throughput of the CUDA backend, for scripts/gpu_check.sh (see bench/GPU.md):
//   (a) one MLP training step on GPU 0, fp32 with TF32 off and on: steady-state steps/s and
//       samples/s;
//   (b) N = 1, 2, 4 replicas on GPU 0 joined by the peer communicator (devices [0], [0, 0],
//       [0, 0, 0, 0]): steps/s, samples/s, and speedup and efficiency against N = 1.
// Each figure is the median over --runs runs of a fresh Trainer; in each run the first --warmup
// steps are excluded and the next --steps are timed with Trainer::on_progress's elapsed times.
// A step is what the trainer does: take a batch from the shard loader (assembled on the host),
// upload it, forward, softmax cross-entropy, backward, all-reduce, gradient norm, SGD with
// momentum 0.9.
//
//   build/bench/bench_gpu [--runs 3] [--warmup 10] [--steps 20] [--batch 256]
//                         [--sizes 1024,4096,4096,1024] [--csv FILE]
//   build/bench/bench_gpu --probe      # only says which GPU it would use, and which cuDNN
//   build/bench/bench_gpu --backend cpu --sizes 64,128,10 --batch 32
//                                      # the same measurements on the CPU backend, to check
//                                      # the benchmark itself on a machine without a GPU
//
// Without a usable GPU it prints "no usable GPU: <reason>" and exits 0.
#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"
#include "stats.hpp"

using namespace lockstep;

namespace {

struct Options {
  int runs = 3;
  std::int64_t warmup = 10;
  std::int64_t steps = 20;  // timed, after the warm-up
  int batch = 256;          // per replica
  std::vector<int> sizes{1024, 4096, 4096, 1024};  // inputs, hidden..., classes
  std::string csv;
  bool probe = false;
  BackendKind backend = BackendKind::cuda;
};

std::vector<int> parse_sizes(const std::string& text) {
  std::vector<int> sizes;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) sizes.push_back(std::stoi(item));
  if (sizes.size() < 2) throw std::invalid_argument("--sizes: expected IN,HIDDEN...,CLASSES");
  return sizes;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--probe") {
      o.probe = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{}: missing value", flag));
    const std::string value = argv[++i];
    if (flag == "--runs") o.runs = std::stoi(value);
    else if (flag == "--warmup") o.warmup = std::stoll(value);
    else if (flag == "--steps") o.steps = std::stoll(value);
    else if (flag == "--batch") o.batch = std::stoi(value);
    else if (flag == "--sizes") o.sizes = parse_sizes(value);
    else if (flag == "--csv") o.csv = value;
    else if (flag == "--backend") {
      if (value != "cuda" && value != "cpu")
        throw std::invalid_argument(
            fmt::format("--backend: expected cuda or cpu, got '{}'", value));
      o.backend = value == "cpu" ? BackendKind::cpu : BackendKind::cuda;
    } else throw std::invalid_argument(fmt::format("unknown flag '{}'", flag));
  }
  if (o.runs < 1 || o.warmup < 1 || o.steps < 1 || o.batch < 1)
    throw std::invalid_argument("--runs, --warmup, --steps and --batch must be at least 1");
  return o;
}

struct Run {
  double steps_per_s = 0.0;
  double final_loss = 0.0;
};

// One fresh Trainer on `devices` (device ids, repeats allowed); on the GPU with the peer
// communicator.
Run run_once(const Options& o, std::shared_ptr<const Dataset> data, std::vector<int> devices,
             bool tf32) {
  Config cfg;
  cfg.source = "bench_gpu";
  cfg.model.hidden.assign(o.sizes.begin() + 1, o.sizes.end() - 1);
  cfg.model.activation = Activation::relu;
  cfg.data.dataset = DatasetKind::synthetic;  // the dataset is passed in; this satisfies validate()
  cfg.data.batch_size = o.batch;
  cfg.data.prefetch = 4;
  cfg.optimizer.type = OptimizerKind::sgd;
  cfg.optimizer.lr = 0.01;
  cfg.optimizer.momentum = 0.9;
  cfg.trainer.backend = o.backend;
  cfg.trainer.devices = std::move(devices);
  // With one replica the peer communicator's all-reduce is the identity: no NCCL copy, so the
  // step is the same work as PyTorch's. With several it is the only choice on one GPU.
  if (o.backend == BackendKind::cuda) cfg.trainer.comm = CommKind::peer;
  cfg.trainer.precision = tf32 ? Precision::tf32 : Precision::fp32;
  const std::int64_t total = o.warmup + o.steps;
  cfg.trainer.steps = total;
  cfg.trainer.log_every = total;
  cfg.trainer.check_replicas_every = 0;  // only at the end, outside the timed steps
  cfg.validate();

  Trainer trainer(cfg, std::move(data), nullptr);
  double t_warm = 0.0, t_end = 0.0;
  trainer.on_progress([&](const StepMetrics& m) {
    if (m.step == o.warmup) t_warm = m.elapsed_s;
    if (m.step == total) t_end = m.elapsed_s;
  });
  const Summary s = trainer.run();
  if (s.backend != to_string(o.backend))
    throw std::runtime_error(fmt::format("the trainer ran on backend {}", s.backend));
  if (!s.replicas_identical) throw std::runtime_error("replicas diverged");
  return {.steps_per_s = static_cast<double>(o.steps) / (t_end - t_warm),
          .final_loss = s.final_train_loss};
}

struct Point {
  double steps_per_s;  // median over the runs
  double lo, hi;       // the slowest and fastest run
  double final_loss;   // of the last run, to show that training did something
};

Point measure(const Options& o, const std::shared_ptr<const Dataset>& data, int replicas,
              bool tf32) {
  std::vector<double> v;
  double loss = 0.0;
  for (int r = 0; r < o.runs; ++r) {
    const Run run = run_once(o, data, std::vector<int>(replicas, 0), tf32);
    v.push_back(run.steps_per_s);
    loss = run.final_loss;
  }
  return {bench::median(v), *std::min_element(v.begin(), v.end()),
          *std::max_element(v.begin(), v.end()), loss};
}

std::string join(const std::vector<int>& sizes) {
  std::string s;
  for (int v : sizes) {
    if (!s.empty()) s += '-';
    s += std::to_string(v);
  }
  return s;
}

int run_benchmarks(const Options& o) {
  std::unique_ptr<Backend> backend;
  try {
    backend = make_backend(o.backend);
  } catch (const InputError& e) {
    const std::string what = e.what();
    const std::string key = "no usable GPU: ";
    const std::size_t at = what.find(key);
    fmt::print("no usable GPU: {}\n",
               at == std::string::npos ? what : what.substr(at + key.size()));
    return 0;
  }
  const std::vector<DeviceInfo> gpus = backend->devices();
  if (gpus.empty()) {
    fmt::print("no usable GPU: the {} backend lists no device\n", to_string(o.backend));
    return 0;
  }
  backend.reset();
  const DeviceInfo& gpu = gpus.front();
  if (o.probe) {
    fmt::print("gpu: {}:0 {} ({}, {} MiB); {} device(s)\n", gpu.backend, gpu.name, gpu.detail,
               gpu.memory_bytes >> 20, gpus.size());
    const std::string cudnn = cuda_support().cudnn;
    fmt::print("cudnn: {}\n", cudnn.empty() ? "not built in" : cudnn);
    return 0;
  }
  const int inputs = o.sizes.front(), classes = o.sizes.back();
  // Enough samples for several distinct batches per replica at N = 4; the loader reshuffles them
  // every epoch.
  const std::size_t samples = static_cast<std::size_t>(o.batch) * 16;
  auto data = std::make_shared<InMemoryDataset>(make_synthetic(samples, inputs, classes, 1));

  fmt::print("bench_gpu: {}:0 {} ({}, {} MiB)\n", gpu.backend, gpu.name, gpu.detail,
             gpu.memory_bytes >> 20);
  fmt::print("MLP {} (ReLU), batch {} per replica, fp32, SGD momentum 0.9; median of {} runs, "
             "{} steps timed after {} warm-up\n\n",
             join(o.sizes), o.batch, o.runs, o.steps, o.warmup);

  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv);
    if (!csv) throw std::runtime_error("cannot write " + o.csv);
    csv << "section,tf32,replicas,batch,steps_per_s,samples_per_s,speedup,efficiency,"
           "min_steps_per_s,max_steps_per_s,final_loss\n";
  }
  const auto row = [&](const char* section, bool tf32, int n, const Point& p, double speedup) {
    const double samples_per_s = p.steps_per_s * o.batch * n;
    if (csv)
      csv << fmt::format("{},{},{},{},{:.3f},{:.1f},{:.4f},{:.4f},{:.3f},{:.3f},{:.6g}\n", section,
                         tf32 ? "on" : "off", n, o.batch, p.steps_per_s, samples_per_s, speedup,
                         speedup / n, p.lo, p.hi, p.final_loss);
    return samples_per_s;
  };

  fmt::print("(a) one replica on {}:0\n", to_string(o.backend));
  fmt::print("{:>6} {:>10} {:>12} {:>17} {:>11}\n", "tf32", "steps/s", "samples/s",
             "runs min..max", "final loss");
  for (bool tf32 : {false, true}) {
    const Point p = measure(o, data, 1, tf32);
    const double samples_per_s = row("single", tf32, 1, p, 1.0);
    fmt::print("{:>6} {:>10.1f} {:>12.0f} {:>8.1f}..{:<8.1f} {:>11.4f}\n", tf32 ? "on" : "off",
               p.steps_per_s, samples_per_s, p.lo, p.hi, p.final_loss);
  }

  fmt::print("\n(b) N replicas on {}:0, {} communicator, tf32 off\n", to_string(o.backend),
             o.backend == BackendKind::cuda ? "peer" : "shared-memory");
  fmt::print("{:>6} {:>10} {:>12} {:>8} {:>10}\n", "N", "steps/s", "samples/s", "speedup",
             "efficiency");
  double base = 0.0;
  for (int n : {1, 2, 4}) {
    const Point p = measure(o, data, n, false);
    const double samples_per_s = p.steps_per_s * o.batch * n;
    if (n == 1) base = samples_per_s;
    const double speedup = samples_per_s / base;
    row("peer", false, n, p, speedup);
    fmt::print("{:>6} {:>10.1f} {:>12.0f} {:>8.2f} {:>9.0f}%\n", n, p.steps_per_s, samples_per_s,
               speedup, 100.0 * speedup / n);
  }
  if (o.backend == BackendKind::cuda)
    fmt::print("\nThe N replicas of (b) share one GPU: speedup above 1 only comes from\n"
               "overlapping their kernels, and efficiency (speedup / N) is not expected to\n"
               "approach 100%.\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_benchmarks(parse(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu: error: {}\n", e.what());
    return 1;
  }
}
