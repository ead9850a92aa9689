// The CPU step's elementwise and row kernels, timed under each ISA this CPU supports (Note [Wide
// vectors for the CPU kernels] in src/cpu/ops/isa_dispatch.hpp): GELU forward and backward on
// fp32 and bf16 storage, add_bias and its gradient, LayerNorm forward (bf16 out) and backward, the
// causal softmax on bf16 probabilities, to_bf16 and the AdamW step. Shapes of a GPT layer:
// --rows positions (batch x context) of width --C, the MLP's hidden 4 C, --heads x --T x --T
// attention scores. Each figure is the median of --runs timings of --reps calls; the ISAs
// alternate within each run, so all see the same machine load. One device of --threads threads.
//
//   build/bench/bench_cpu_kernels [--rows 1024] [--C 768] [--heads 48] [--T 128] [--reps 20]
//                                 [--runs 7] [--threads 1]
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpu/ops/isa_dispatch.hpp"
#include "lockstep/lockstep.hpp"
#include "stats.hpp"

using namespace lockstep;

namespace {

struct Options {
  int rows = 1024, C = 768, heads = 48, T = 128;
  int reps = 20, runs = 7, threads = 1;
};

Options parse(int argc, char** argv) {
  Options o;
  const std::map<std::string, int*> flags = {
      {"--rows", &o.rows}, {"--C", &o.C},       {"--heads", &o.heads},    {"--T", &o.T},
      {"--reps", &o.reps}, {"--runs", &o.runs}, {"--threads", &o.threads}};
  for (int i = 1; i < argc; ++i) {
    const auto flag = flags.find(argv[i]);
    if (flag == flags.end() || i + 1 >= argc)
      throw std::invalid_argument(std::string("bad flag ") + argv[i]);
    *flag->second = std::stoi(argv[++i]);
  }
  return o;
}

template <class T>
DeviceArray<T> random_array(Device& dev, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> host(n);
  for (float& x : host) x = u(rng);
  DeviceArray<float> a(dev, n);
  a.upload(host);
  if constexpr (std::is_same_v<T, float>) {
    return a;
  } else {
    DeviceArray<std::uint16_t> h(dev, n);
    dev.to_bf16(a.data(), h.data(), n);
    return h;
  }
}

struct Kernel {
  std::string name;
  double bytes;  // moved per call
  std::function<void()> call;
};

// Kernels on arrays that live as long as the device.
struct Workload {
  explicit Workload(Device& d, const Options& o)
      : dev(d),
        n(std::size_t(o.rows) * o.C),
        hidden(4 * n),
        scores(std::size_t(o.heads) * o.T * o.T),
        x(random_array<float>(d, hidden, 1)),
        dy(random_array<float>(d, hidden, 2)),
        dx(random_array<float>(d, hidden, 3)),
        h(random_array<std::uint16_t>(d, hidden, 4)),
        h_out(random_array<std::uint16_t>(d, hidden, 5)),
        w(random_array<float>(d, std::size_t(4) * o.C, 6)),
        b(random_array<float>(d, std::size_t(4) * o.C, 7)),
        stats(random_array<float>(d, std::size_t(2) * o.rows, 8)),
        dwb(random_array<float>(d, std::size_t(2) * o.C, 11)),
        m(random_array<float>(d, hidden, 9)),
        v(random_array<float>(d, hidden, 10)) {}

  std::vector<Kernel> kernels(const Options& o) {
    const int rows = o.rows, C = o.C, wide = 4 * o.C, heads = o.heads, T = o.T;
    float *mean = stats.data(), *rstd = stats.data() + rows;
    const double f = 4.0, e = 2.0;  // bytes of an fp32 and a bf16 element
    v.upload(std::vector<float>(hidden, 0.01f));  // AdamW's sqrt(v) wants v >= 0
    return {
        {"gelu forward fp32", hidden * 2 * f,
         [=, this] { dev.activation_forward(Activation::gelu, x.data(), dx.data(), hidden); }},
        {"gelu backward fp32", hidden * 3 * f,
         [=, this] {
           dev.activation_backward(Activation::gelu, x.data(), dy.data(), dx.data(), hidden);
         }},
        {"gelu forward bf16", hidden * 2 * e,
         [=, this] { dev.activation_forward(Activation::gelu, h.data(), h_out.data(), hidden); }},
        {"gelu backward bf16, dx fp32 + bf16", hidden * (e + 2 * f + e),
         [=, this] {
           dev.activation_backward(Activation::gelu, h.data(), dy.data(), dx.data(),
                                   h_out.data(), hidden);
         }},
        {"add_bias fp32, in place (rows x 4C)", hidden * 2 * f,
         [=, this] { dev.add_bias(dx.data(), b.data(), rows, wide); }},
        {"bias_grad (rows x 4C)", hidden * f,
         [=, this] { dev.bias_grad(b.data(), dy.data(), rows, wide); }},
        {"bias_grad, bf16 dy (rows x 4C)", hidden * e,
         [=, this] { dev.bias_grad(b.data(), h.data(), rows, wide); }},
        {"add_bias into bf16, bf16 bias (rows x 4C)", hidden * (f + e),
         [=, this] { dev.add_bias(x.data(), h.data(), h_out.data(), rows, wide); }},
        {"layernorm forward, bf16 out", n * (f + e),
         [=, this] {
           dev.layernorm_forward(x.data(), w.data(), b.data(), h_out.data(), mean, rstd, rows, C);
         }},
        {"layernorm backward", n * 3 * f,
         [=, this] {
           dev.layernorm_backward(x.data(), w.data(), mean, rstd, dy.data(), dx.data(),
                                  dwb.data(), dwb.data() + C, rows, C);
         }},
        {"causal softmax forward, bf16 p", scores * (f + e),
         [=, this] { dev.causal_softmax_forward(x.data(), h_out.data(), heads, T, 0.125f); }},
        {"causal softmax backward, bf16", scores * (e + f + e),
         [=, this] {
           dev.causal_softmax_backward(h.data(), dy.data(), h_out.data(), heads, T, 0.125f);
         }},
        {"to_bf16", hidden * (f + e),
         [=, this] { dev.to_bf16(x.data(), h_out.data(), hidden); }},
        {"adamw step with the bf16 copy", hidden * (7 * f + e),
         [=, this] {
           dev.adamw_step({.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f},
                          1e-9f, 10, dx.data(), dy.data(), m.data(), v.data(), hidden, nullptr,
                          h_out.data());
         }},
    };
  }

  Device& dev;
  std::size_t n, hidden, scores;
  DeviceArray<float> x, dy, dx;
  DeviceArray<std::uint16_t> h, h_out;
  DeviceArray<float> w, b, stats, dwb, m, v;
};

void run(const Options& o) {
  if (std::size_t(o.heads) * o.T * o.T > std::size_t(4) * o.rows * o.C)
    throw std::invalid_argument("--heads x --T x --T must not exceed 4 x --rows x --C");
  const std::vector<cpu::Isa> isas = cpu::supported_isas();
  auto backend = make_backend(BackendKind::cpu, {}, {});
  auto dev = backend->create_device(0, o.threads, 0);
  Workload work(*dev, o);
  const std::vector<Kernel> kernels = work.kernels(o);
  // times[kernel][isa]: one timing of reps calls per run
  std::vector<std::vector<std::vector<double>>> times(
      kernels.size(), std::vector<std::vector<double>>(isas.size()));
  for (int r = 0; r < o.runs; ++r)
    for (std::size_t k = 0; k < kernels.size(); ++k)
      for (std::size_t i = 0; i < isas.size(); ++i) {
        cpu::force_isa(isas[i]);
        kernels[k].call();  // warm-up
        const double t0 = bench::now_s();
        for (int rep = 0; rep < o.reps; ++rep) kernels[k].call();
        times[k][i].push_back((bench::now_s() - t0) / o.reps * 1e3);
      }
  cpu::force_isa(std::nullopt);
  fmt::print("rows {} x C {}, hidden {}, {} x {} x {} scores, {} thread(s), {} reps x {} runs "
             "(medians)\n",
             o.rows, o.C, 4 * o.C, o.heads, o.T, o.T, o.threads, o.reps, o.runs);
  fmt::print("{:<36}", "kernel, ms per call (GB/s)");
  for (cpu::Isa isa : isas) fmt::print(" {:>18}", cpu::isa_name(isa));
  fmt::print(" {:>10}\n", "widest/base");
  for (std::size_t k = 0; k < kernels.size(); ++k) {
    fmt::print("{:<36}", kernels[k].name);
    std::vector<double> ms;
    for (const auto& t : times[k]) ms.push_back(bench::median(t));
    for (double t : ms)
      fmt::print(" {:>18}", fmt::format("{:.3f} ({:.0f})", t, kernels[k].bytes / t / 1e6));
    fmt::print(" {:>9.2f}x\n", ms.front() / ms.back());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    run(parse(argc, argv));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_cpu_kernels: {}\n", e.what());
    return 1;
  }
}
