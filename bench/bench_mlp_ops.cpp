// The MLP step of bench_gpu, op by op (issue 25 item 8: where lockstep's MLP step loses to
// PyTorch's with TF32 off). Each op of one training step of the MLP (sizes 1024-4096-4096-1024,
// ReLU, batch 256, fp32, SGD with momentum 0.9), called through the Device API as the trainer's
// layers call it, is timed alone: --repeat calls between two step marks (CUDA events on a GPU,
// Note [Device step time]), the median of --runs such timings, divided by --repeat. The ops:
//   layer i forward   linear_forward (the product and its bias: cuBLASLt's BIAS epilogue),
//                     then the ReLU (activation_forward) on the hidden layers;
//   loss              softmax_cross_entropy (loss, correct count and dlogits);
//   layer i backward  the ReLU's backward, then linear_backward (dweight with its BGRADB bias
//                     gradient, and dx but for layer 0);
//   zero grads        fill of the gradient buffer (PyTorch sets its gradients to None);
//   grad norm         sum_squares_grains + step_control (what the trainer's step record makes);
//   sgd               sgd_step over every parameter.
// One JSON line per op ({"op", "ms", "gflops"}) and the sum, which bench/mlp_breakdown.py sets
// beside the same ops in PyTorch (bench/gpu_mlp_torch.py --breakdown).
//
//   build/bench/bench_mlp_ops [--backend cuda|cpu] [--batch 256] [--sizes 1024,4096,4096,1024]
//                             [--repeat 20] [--runs 5] [--tf32]
//
// Without a usable GPU (--backend cuda) it prints "no usable GPU: <reason>" and exits 0.
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/random.hpp"
#include "lockstep/lockstep.hpp"
#include "stats.hpp"

using namespace lockstep;

namespace {

struct Options {
  BackendKind backend = BackendKind::cuda;
  int batch = 256;
  std::vector<int> sizes{1024, 4096, 4096, 1024};
  int repeat = 20;
  int runs = 5;
  bool tf32 = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--tf32") {
      o.tf32 = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{}: missing value", flag));
    const std::string value = argv[++i];
    if (flag == "--batch") o.batch = std::stoi(value);
    else if (flag == "--repeat") o.repeat = std::stoi(value);
    else if (flag == "--runs") o.runs = std::stoi(value);
    else if (flag == "--sizes") {
      o.sizes.clear();
      std::stringstream in(value);
      for (std::string item; std::getline(in, item, ',');) o.sizes.push_back(std::stoi(item));
    } else if (flag == "--backend") {
      if (value != "cuda" && value != "cpu")
        throw std::invalid_argument(fmt::format("--backend: expected cuda or cpu, got '{}'", value));
      o.backend = value == "cpu" ? BackendKind::cpu : BackendKind::cuda;
    } else throw std::invalid_argument(fmt::format("unknown flag '{}'", flag));
  }
  if (o.sizes.size() < 2 || o.batch < 1 || o.repeat < 1 || o.runs < 1)
    throw std::invalid_argument("--sizes needs IN,...,CLASSES; --batch, --repeat, --runs >= 1");
  return o;
}

// Seconds per call of `op`: `repeat` calls between two step marks (the device's time on a GPU,
// the wall time on the CPU, whose ops run on the calling thread), the median of `runs`.
double time_op(Device& dev, const Options& o, const std::function<void()>& op) {
  op();  // its first call makes what it caches (cuBLASLt's plan)
  dev.synchronize();
  std::vector<double> v;
  for (int r = 0; r < o.runs; ++r) {
    const double t0 = bench::now_s();
    dev.mark_step(false);
    for (int i = 0; i < o.repeat; ++i) op();
    dev.mark_step(true);
    dev.synchronize();
    v.push_back(dev.device_step_seconds().value_or(bench::now_s() - t0) / o.repeat);
  }
  return bench::median(v);
}

// n values uniform in [-scale, scale) from `seed` (the project's generator, common/random.hpp).
std::vector<float> uniform(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (float& x : v) x = scale * static_cast<float>(2.0 * detail::uniform01(seed) - 1.0);
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  BackendOptions backend_options;
  backend_options.precision = o.tf32 ? Precision::tf32 : Precision::fp32;
  std::unique_ptr<Backend> backend;
  try {
    const int ids[] = {0};
    backend = make_backend(o.backend, ids, backend_options);
  } catch (const InputError& e) {
    fmt::print("no usable GPU: {}\n", e.what());
    return 0;
  }
  std::unique_ptr<Device> dev = backend->create_device(0, 1, 0);
  const int B = o.batch, layers = static_cast<int>(o.sizes.size()) - 1;
  const int classes = o.sizes.back();

  // Parameters and gradients, one buffer each, laid out as the trainer's: weight (out, in),
  // then bias (out), per layer.
  std::vector<std::size_t> offset(layers + 1, 0);
  for (int l = 0; l < layers; ++l)
    offset[l + 1] = offset[l] + std::size_t(o.sizes[l + 1]) * (o.sizes[l] + 1);
  const std::size_t n = offset[layers];
  DeviceArray<float> params(*dev, n), grads(*dev, n), momentum(*dev, n);
  params.upload(uniform(n, 1, 0.02f));
  std::vector<DeviceArray<float>> act, pre, dact;  // act[l]: layer l's input; pre: its output
  for (int l = 0; l <= layers; ++l) act.emplace_back(*dev, std::size_t(B) * o.sizes[l]);
  for (int l = 0; l < layers; ++l) {
    pre.emplace_back(*dev, std::size_t(B) * o.sizes[l + 1]);
    dact.emplace_back(*dev, std::size_t(B) * o.sizes[l + 1]);
  }
  act[0].upload(uniform(std::size_t(B) * o.sizes[0], 2, 1.0f));
  DeviceArray<std::int32_t> labels(*dev, B);
  std::vector<std::int32_t> host_labels(B);
  for (int i = 0; i < B; ++i) host_labels[i] = (i * 7) % classes;
  labels.upload(host_labels);
  DeviceArray<LossStats> stats(*dev, 1);
  constexpr std::size_t kGrain = 16384;
  const std::size_t grains = (n + kGrain - 1) / kGrain;
  DeviceArray<double> grain_sums(*dev, grains);
  DeviceArray<StepControl> control(*dev, 1);

  const auto weight = [&](int l) { return params.data() + offset[l]; };
  const auto bias = [&](int l) { return weight(l) + std::size_t(o.sizes[l + 1]) * o.sizes[l]; };
  const auto dweight = [&](int l) { return grads.data() + offset[l]; };
  const auto dbias = [&](int l) { return dweight(l) + std::size_t(o.sizes[l + 1]) * o.sizes[l]; };
  // The layer's output: pre-activation for a hidden layer, whose ReLU writes act[l + 1].
  const auto out = [&](int l) { return l + 1 < layers ? pre[l].data() : act[l + 1].data(); };

  struct Row {
    std::string op;
    double s;
    double flops;
  };
  std::vector<Row> rows;
  const auto add = [&](std::string op, double flops, const std::function<void()>& f) {
    rows.push_back({std::move(op), time_op(*dev, o, f), flops});
  };
  // Every op once in step order first, so that each reads what the step before it wrote.
  for (int l = 0; l < layers; ++l) {
    const int in = o.sizes[l], outs = o.sizes[l + 1];
    add(fmt::format("layer {} forward linear {}x{}->{}", l, B, in, outs), 2.0 * B * in * outs,
        [&, l, in, outs] {
          dev->linear_forward({.rows = B, .in = in, .out = outs, .x = {act[l].data()},
                               .weight = {weight(l)}, .bias = {bias(l)}, .y = {out(l)}});
        });
    if (l + 1 < layers)
      add(fmt::format("layer {} forward relu", l), 0.0, [&, l] {
        dev->activation_forward(Activation::relu, pre[l].data(), act[l + 1].data(), pre[l].size());
      });
  }
  add(fmt::format("loss softmax cross-entropy {}x{}", B, classes), 0.0, [&] {
    dev->softmax_cross_entropy(act[layers].data(), labels.data(), B, classes,
                               dact[layers - 1].data(), 1.0f / B, stats.data());
  });
  add("zero grads", 0.0, [&] { dev->fill(grads.data(), 0.0f, n); });
  for (int l = layers - 1; l >= 0; --l) {
    const int in = o.sizes[l], outs = o.sizes[l + 1];
    if (l + 1 < layers)
      add(fmt::format("layer {} backward relu", l), 0.0, [&, l] {
        dev->activation_backward(Activation::relu, pre[l].data(), dact[l].data(), dact[l].data(),
                                 pre[l].size());
      });
    // dx of layer l is the gradient of layer l - 1's output.
    float* din = l > 0 ? dact[l - 1].data() : nullptr;
    add(fmt::format("layer {} backward linear {}x{}<-{}{}", l, B, in, outs,
                    din ? " (dweight, dbias, dx)" : " (dweight, dbias)"),
        (din ? 4.0 : 2.0) * B * in * outs, [&, l, in, outs, din] {
          dev->linear_backward({.rows = B, .in = in, .out = outs, .x = {act[l].data()},
                                .weight = {weight(l)}, .dy = dact[l].data(),
                                .g = {dact[l].data()}, .dweight = dweight(l),
                                .dbias = dbias(l), .dx = din});
        });
  }
  add("grad norm (sum_squares_grains, step_control)", 0.0, [&] {
    dev->sum_squares_grains(grads.data(), n, kGrain, grain_sums.data());
    dev->step_control(grain_sums.data(), grains, 0.0, control.data());
  });
  add("sgd momentum 0.9", 0.0, [&] {
    dev->sgd_step({.momentum = 0.9f}, 0.01f, params.data(), grads.data(), momentum.data(), n,
                  control.data(), nullptr);
  });

  double total = 0.0;
  for (const Row& r : rows) {
    total += r.s;
    fmt::print("{{\"framework\": \"lockstep\", \"op\": \"{}\", \"ms\": {:.5f}, \"tflops\": {}}}\n",
               r.op, 1e3 * r.s, r.flops > 0 ? fmt::format("{:.2f}", r.flops / r.s / 1e12) : "null");
  }
  fmt::print("{{\"framework\": \"lockstep\", \"op\": \"sum\", \"ms\": {:.5f}, \"tflops\": null}}\n",
             1e3 * total);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_mlp_ops: {}\n", e.what());
  return 2;
}
