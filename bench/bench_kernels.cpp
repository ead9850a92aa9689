// The kernels issue 17 changed, timed one by one through the Device API at GPT-2 124M's shapes
// (batch 8 x 1024 positions, C 768, V 50257), for scripts/gpu_check.sh:
//   - bias_grad over 768, 2304 and 3072 columns, and add_bias: milliseconds and GB/s moved;
//   - softmax_cross_entropy over the padded vocabulary (50304, -inf past 50257) with dlogits
//     (each call also reads its loss back to the host);
//   - the LM head's three GEMMs with the vocabulary unpadded (leading dimension 50257, as before
//     the padding) and padded (50304, with the padding's rank-1 GEMM): the padding's effect.
// Each figure is the median of --runs timings of --reps back-to-back calls, the device
// synchronised around each timing.
//
//   build/bench/bench_kernels [--backend cuda|cpu] [--rows 8192] [--reps 20] [--runs 5] [--tf32]
//
// Without a usable GPU (backend cuda) it prints "no usable GPU: <reason>" and exits 0.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"
#include "stats.hpp"

using namespace lockstep;

namespace {

constexpr int kC = 768, kVocab = 50257, kPadded = 50304;

struct Options {
  BackendKind backend = BackendKind::cuda;
  int rows = 8192;
  int reps = 20;
  int runs = 5;
  bool tf32 = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(flag + ": expected a value");
      return std::string(argv[++i]);
    };
    if (flag == "--backend") o.backend = value() == "cpu" ? BackendKind::cpu : BackendKind::cuda;
    else if (flag == "--rows") o.rows = std::stoi(value());
    else if (flag == "--reps") o.reps = std::stoi(value());
    else if (flag == "--runs") o.runs = std::stoi(value());
    else if (flag == "--tf32") o.tf32 = true;
    else throw std::invalid_argument("unknown flag " + flag);
  }
  return o;
}

DeviceArray<float> random_array(Device& dev, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> host(n);
  for (float& x : host) x = u(rng);
  DeviceArray<float> a(dev, n);
  a.upload(host);
  return a;
}

// Milliseconds per call of op: the median over runs of reps calls.
double time_ms(Device& dev, const Options& o, const std::function<void()>& op) {
  op();  // warm-up
  std::vector<double> times;
  for (int r = 0; r < o.runs; ++r) {
    dev.synchronize();
    const double t0 = bench::now_s();
    for (int i = 0; i < o.reps; ++i) op();
    dev.synchronize();
    times.push_back((bench::now_s() - t0) / o.reps * 1e3);
  }
  return bench::median(times);
}

// bytes = 0: a GEMM, whose GB/s would mean nothing.
void row(const std::string& name, double ms, double bytes) {
  const std::string rate = bytes > 0 ? fmt::format("{:>8.0f} GB/s", bytes / ms / 1e6) : "";
  fmt::print("{:<44} {:>9.3f} ms {}\n", name, ms, rate);
}

// The LM head's forward and backward GEMMs for logits with leading dimension ld.
double lm_head_ms(Device& dev, const Options& o, int ld, const float* in, const float* wte,
                  float* logits, float* dwte, float* din) {
  const int n = o.rows;
  DeviceArray<float> ones(dev, static_cast<std::size_t>(n)), minus_inf(dev, kPadded - kVocab);
  dev.fill(ones.data(), 1.0f, ones.size());
  dev.fill(minus_inf.data(), -std::numeric_limits<float>::infinity(), minus_inf.size());
  return time_ms(dev, o, [&] {
    dev.gemm(Transpose::no, Transpose::yes, n, kVocab, kC, 1.0f, in, kC, wte, kC, 0.0f, logits,
             ld);
    if (ld > kVocab)
      dev.gemm(Transpose::no, Transpose::no, n, ld - kVocab, 1, 1.0f, ones.data(), 1,
               minus_inf.data(), ld - kVocab, 0.0f, logits + kVocab, ld);
    dev.gemm(Transpose::yes, Transpose::no, kVocab, kC, n, 1.0f, logits, ld, in, kC, 1.0f, dwte,
             kC);
    dev.gemm(Transpose::no, Transpose::no, n, kC, kVocab, 1.0f, logits, ld, wte, kC, 0.0f, din,
             kC);
  });
}

void run(const Options& o) {
  std::unique_ptr<Backend> backend;
  try {
    backend = make_backend(o.backend, {},
                           {.precision = o.tf32 ? Precision::tf32 : Precision::fp32});
  } catch (const InputError& e) {
    fmt::print("no usable GPU: {}\n", e.what());
    return;
  }
  auto dev = backend->create_device(0, 1, 0);
  const std::size_t n = static_cast<std::size_t>(o.rows);
  fmt::print("{} rows, {} reps x {} runs, TF32 {}\n", o.rows, o.reps, o.runs,
             o.tf32 ? "on" : "off");
  for (int cols : {kC, 3 * kC, 4 * kC}) {
    auto dy = random_array(*dev, n * cols, 1), db = random_array(*dev, cols, 2);
    row(fmt::format("bias_grad ({} x {})", o.rows, cols),
        time_ms(*dev, o, [&] { dev->bias_grad(db.data(), dy.data(), o.rows, cols); }),
        4.0 * n * cols);
  }
  {
    auto y = random_array(*dev, n * 4 * kC, 3), b = random_array(*dev, 4 * kC, 4);
    row(fmt::format("add_bias ({} x {})", o.rows, 4 * kC),
        time_ms(*dev, o, [&] { dev->add_bias(y.data(), b.data(), o.rows, 4 * kC); }),
        8.0 * n * 4 * kC);
  }
  auto logits = random_array(*dev, n * kPadded, 5);
  {
    std::vector<std::int32_t> labels(n);
    std::mt19937 rng(6);
    for (auto& l : labels) l = static_cast<std::int32_t>(rng() % kVocab);
    DeviceArray<std::int32_t> yd(*dev, n);
    yd.upload(labels);
    DeviceArray<float> dlogits(*dev, n * kPadded);
    row(fmt::format("softmax_cross_entropy ({} x {}), dlogits", o.rows, kPadded),
        time_ms(*dev, o,
                [&] {
                  dev->softmax_cross_entropy(logits.data(), yd.data(), o.rows, kPadded,
                                             dlogits.data(), 1.0f / static_cast<float>(o.rows));
                }),
        12.0 * n * kPadded);  // logits read twice, dlogits written and read back
  }
  auto in = random_array(*dev, n * kC, 7), wte = random_array(*dev, std::size_t(kVocab) * kC, 8);
  auto dwte = random_array(*dev, std::size_t(kVocab) * kC, 9), din = random_array(*dev, n * kC, 10);
  const double unpadded = lm_head_ms(*dev, o, kVocab, in.data(), wte.data(), logits.data(),
                                     dwte.data(), din.data());
  const double padded = lm_head_ms(*dev, o, kPadded, in.data(), wte.data(), logits.data(),
                                   dwte.data(), din.data());
  row(fmt::format("LM head GEMMs, logits ld {} (unpadded)", kVocab), unpadded, 0.0);
  row(fmt::format("LM head GEMMs, logits ld {} (padded)", kPadded), padded, 0.0);
  fmt::print("LM head padded / unpadded: {:.3f}\n", padded / unpadded);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    run(parse(argc, argv));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_kernels: {}\n", e.what());
    return 1;
  }
}
