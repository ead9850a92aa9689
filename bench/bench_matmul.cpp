// The CPU's matrix products, oneDNN against OpenBLAS, on the products of the large MLP
// (1024-4096-4096-1024, batch 256), then of smaller ones (the quickstart's, the tiny GPT's):
// each product as one call on one thread, as ops/gemm.cpp
// issues its row blocks (Note [CPU matrix products]); GFLOP/s, medians. Each in fp32 and with
// bf16 inputs (issue 16): oneDNN's bf16 path (its bf16 kernel, or widened to its fp32 kernel
// where it has none), and the fallback of widening to fp32 for OpenBLAS's sgemm. Then, with
// --step, the median step time of that MLP trained by this process's library (set
// LOCKSTEP_CPU_GEMM=openblas for OpenBLAS's).
//
//   build/bench/bench_matmul [--reps 10] [--step] [--threads T]
#include <cblas.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "common/bf16.hpp"
#include "cpu/matmul.hpp"
#include "lockstep/lockstep.hpp"
#include "stats.hpp"

using namespace lockstep;

namespace {

constexpr int kBatch = 256;
const std::vector<int> kSizes{1024, 4096, 4096, 1024};

struct Product {
  std::string name;
  cpu::GemmCall call;
};

// Forward, weight gradient and input gradient of each layer (src/model/ops.hpp's calls).
std::vector<Product> mlp_products() {
  std::vector<Product> out;
  for (std::size_t l = 0; l + 1 < kSizes.size(); ++l) {
    const int in = kSizes[l], o = kSizes[l + 1];
    out.push_back({fmt::format("fwd {}x{}", in, o),
                   {.bt = true, .m = kBatch, .n = o, .k = in, .lda = in, .ldb = in, .ldc = o}});
    out.push_back({fmt::format("dW  {}x{}", in, o),
                   {.at = true, .m = o, .n = in, .k = kBatch, .lda = o, .ldb = in, .ldc = in,
                    .beta = 1.0f}});
    out.push_back({fmt::format("dX  {}x{}", in, o),
                   {.m = kBatch, .n = in, .k = o, .lda = o, .ldb = in, .ldc = in}});
  }
  return out;
}

// Small products, forward shapes (B, out, in): the quickstart's and the tiny GPT's (16 x 64
// tokens: qkv 1024x384x128, MLP 1024x512x128 and 1024x128x512).
std::vector<Product> small_products() {
  std::vector<Product> out;
  for (auto [m, n, k] : {std::array{32, 64, 64}, {32, 10, 64}, {64, 64, 64}, {128, 128, 128},
                         {256, 256, 256}, {1024, 384, 128}, {1024, 512, 128}, {1024, 128, 512}})
    out.push_back({fmt::format("{}x{}x{}", m, n, k),
                   {.bt = true, .m = m, .n = n, .k = k, .lda = k, .ldb = k, .ldc = n}});
  return out;
}

// `call` with inputs of type T (float, or std::uint16_t for bf16 bits), on `library`.
template <class T>
double gflops_of(cpu::GemmLibrary library, cpu::GemmCall c, int reps) {
  c.bf16 = std::is_same_v<T, std::uint16_t>;
  const auto value = [&](float x) {
    if constexpr (std::is_same_v<T, float>) return x;
    else return detail::float_to_bf16(x);
  };
  cpu::Matmul mm(library);
  mm.prepare(c);
  std::vector<T> a(std::size_t(c.at ? c.k : c.m) * c.lda, value(0.5f));
  std::vector<T> b(std::size_t(c.bt ? c.n : c.k) * c.ldb, value(0.25f));
  std::vector<float> out(std::size_t(c.m) * c.ldc, 0.0f);
  std::vector<double> t;
  for (int r = 0; r <= reps; ++r) {
    const double t0 = bench::now_s();
    mm.run(c, a.data(), b.data(), out.data());
    if (r > 0) t.push_back(bench::now_s() - t0);  // the first call warms the caches
  }
  return 2.0 * c.m * c.n * c.k / bench::median(t) / 1e9;
}

// One row of the table: fp32 on both libraries, then bf16 inputs on both.
struct Rates {
  double onednn, openblas, onednn_bf16, widened_bf16;
};

Rates rates_of(const cpu::GemmCall& c, int reps) {
  using cpu::GemmLibrary;
  return {gflops_of<float>(GemmLibrary::onednn, c, reps),
          gflops_of<float>(GemmLibrary::openblas, c, reps),
          gflops_of<std::uint16_t>(GemmLibrary::onednn, c, reps),
          gflops_of<std::uint16_t>(GemmLibrary::openblas, c, reps)};
}

double step_ms(int threads) {
  const std::int64_t steps = 12, warmup = 2;
  Config cfg = bench::cpu_sgd_config({kSizes[1], kSizes[2]}, kBatch, 1, steps);
  cfg.trainer.threads_per_device = threads;
  auto data = std::make_shared<InMemoryDataset>(make_synthetic(4096, kSizes[0], kSizes[3], 1));
  Trainer trainer(cfg, data, nullptr);
  std::vector<double> t;
  double last = 0.0;
  trainer.on_progress([&](const StepMetrics& m) {
    if (m.step > warmup) t.push_back(m.elapsed_s - last);
    last = m.elapsed_s;
  });
  trainer.run();
  return 1e3 * bench::median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10, threads = 0;
  bool step = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::stoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--step")) step = true;
  }
  openblas_set_num_threads(1);  // one thread each, as in lockstep (make_cpu_device sets it too)
  fmt::print("this process computes with: {}\n", cpu::gemm_path().description);
  fmt::print("GFLOP/s, one thread, median of {}; bf16: bf16 inputs, fp32 accumulation; widened: "
             "bf16 widened to fp32 for OpenBLAS's sgemm\n", reps);
  fmt::print("{:<16} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10}\n", "product",
             "oneDNN fp32", "OpenBLAS", "oneDNN bf16", "widened", "oneDNN/BL", "bf16/fp32",
             "wide/bf16");
  std::vector<Product> products = mlp_products();
  for (Product& p : small_products()) products.push_back(std::move(p));
  for (const Product& p : products) {
    const Rates r = rates_of(p.call, reps);
    fmt::print("{:<16} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>10.2f} {:>10.2f} {:>10.2f}\n",
               p.name, r.onednn, r.openblas, r.onednn_bf16, r.widened_bf16,
               r.onednn / r.openblas, r.onednn_bf16 / r.onednn, r.widened_bf16 / r.onednn_bf16);
  }
  if (step) fmt::print("large MLP step (1 worker): {:.1f} ms, median\n", step_ms(threads));
  return 0;
}
