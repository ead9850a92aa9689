// The CUDA side of bf16 (issue 16): the conversion kernels against the CPU device bit for bit;
// gemm_bf16 and gemm_batched_bf16 within fp32 accumulation of the exact product, as the CPU
// device's are (../cpu/bf16_gemm_reference.hpp); the bf16-storage overloads of add_bias, the
// activations, LayerNorm and the causal softmax against the CPU's; the optimiser steps' bf16
// copy of the parameters; the NCCL communicator's bf16 all-reduce against the CPU's rounding.
// Skip without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "../cpu/bf16_gemm_reference.hpp"
#include "common/bf16.hpp"
#include "gpu_vs_cpu.hpp"

using namespace lockstep;
using namespace lockstep::test;

namespace {

// Random floats, then every special case of Note [Rounding to bf16] at the front.
std::vector<float> bf16_inputs() {
  std::vector<float> x = random_floats(100003, 21, -3e4, 3e4);
  const std::uint32_t specials[] = {0x3F808000u, 0x3F818000u, 0x7F7F8000u, 0x7F800000u,
                                    0xFF800000u, 0x7FC00001u, 0xFFFFFFFFu, 0x00008000u,
                                    0x00018000u, 0x80000000u, 0x007FFFFFu, 0x7F7F7FFFu};
  for (std::size_t i = 0; i < std::size(specials); ++i)
    x[i] = detail::float_of_bits(specials[i]);
  return x;
}

// The bits of to_bf16 on `dev`, and the floats from_bf16 makes of them.
std::pair<std::vector<std::uint16_t>, std::vector<float>> round_trip(Device& dev,
                                                                     const std::vector<float>& x) {
  auto xd = on_device(dev, x);
  DeviceArray<std::uint16_t> h(dev, x.size());
  DeviceArray<float> back(dev, x.size());
  dev.to_bf16(xd.data(), h.data(), x.size());
  dev.from_bf16(h.data(), back.data(), x.size());
  return {h.download(), back.download()};
}

// A device buffer of n bf16 values: x rounded on the host.
DeviceArray<std::uint16_t> bf16_on_device(Device& dev, const std::vector<float>& x) {
  return on_device(dev, to_bits(x));
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("cuda: bf16-storage add_bias and activations against the CPU device") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    const int rows = 301, cols = 97;
    const std::size_t n = std::size_t(rows) * cols;
    const auto x = random_floats(n, 700, -6.0, 6.0), dy = random_floats(n, 701);
    const auto bias = random_floats(std::size_t(cols), 702);
    // add_bias with a bf16 bias: single additions on both sides, the same bits.
    compare(*gpu, [&](Device& d) {
      auto xd = on_device(d, x);
      DeviceArray<std::uint16_t> y = poisoned_bf16(d, n), bd = bf16_on_device(d, bias);
      d.add_bias(xd.data(), bd.data(), y.data(), rows, cols);
      return Outputs{widened(y.download())};
    }, kSameBits);
    // bias_grad of a bf16 dy: sums in double in another order, rounded once: the same float or
    // a neighbour.
    compare(*gpu, [&](Device& d) {
      DeviceArray<std::uint16_t> dyd = bf16_on_device(d, dy);
      auto bd = on_device(d, bias);
      d.bias_grad(bd.data(), dyd.data(), rows, cols);
      return Outputs{bd.download()};
    }, Tolerance{2 * kFp32Ulp, 2 * kFp32Ulp});
    for (Activation f : {Activation::relu, Activation::tanh, Activation::gelu}) {
      CAPTURE(to_string(f));
      compare(
          *gpu,
          [&](Device& d) {
            DeviceArray<std::uint16_t> xd = bf16_on_device(d, x);
            DeviceArray<float> dyd = on_device(d, dy);
            DeviceArray<std::uint16_t> y = poisoned_bf16(d, n), dx16 = poisoned_bf16(d, n);
            DeviceArray<float> dx = poisoned(d, n);
            d.activation_forward(f, xd.data(), y.data(), n);
            d.activation_backward(f, xd.data(), dyd.data(), dx.data(), dx16.data(), n);
            d.activation_backward(f, xd.data(), dyd.data(), dyd.data(), nullptr, n);
            return Outputs{widened(y.download()), dx.download(), widened(dx16.download()),
                           dyd.download()};
          },
          // tanh: each side's library, a few ulps apart (as in test_cuda.cpp), then rounded.
          f == Activation::tanh ? bf16_rounded(fp32_sums(4)) : kSameBits);
    }
  }

  TEST_CASE("cuda: softmax_cross_entropy into bf16 dlogits against the CPU device") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    // GPT-2's padded vocabulary too: the padding's -inf logits give dlogits of exactly 0.
    for (auto [rows, classes] : {std::pair{1, 1}, {300, 257}, {4, 50304}}) {
      CAPTURE(rows);
      CAPTURE(classes);
      const std::size_t n = std::size_t(rows) * classes;
      std::vector<float> logits = random_floats(n, 730 + n, -6.0, 6.0);
      if (classes == 50304)
        for (int r = 0; r < rows; ++r)
          std::fill_n(logits.begin() + std::size_t(r) * classes + 50257, 47, -INFINITY);
      std::vector<std::int32_t> labels(rows);
      for (int r = 0; r < rows; ++r) labels[r] = (r * 37) % std::min(classes, 50257);
      LossStats sums[2];
      int which = 0;
      compare(*gpu, [&](Device& d) {
        auto ld = on_device(d, logits);
        auto yd = on_device(d, labels);
        DeviceArray<std::uint16_t> dl = poisoned_bf16(d, n);
        DeviceArray<LossStats> acc(d, 1);
        d.softmax_cross_entropy(ld.data(), yd.data(), rows, classes, dl.data(), 0.5f, acc.data());
        sums[which++] = acc.download()[0];
        return Outputs{widened(dl.download())};
      }, bf16_rounded(fp32_sums(classes + 4, std::size_t(classes))));
      CHECK(sums[0].loss_sum == doctest::Approx(sums[1].loss_sum).epsilon(1e-6));
      CHECK(sums[0].correct == sums[1].correct);
    }
  }

  TEST_CASE("cuda: bf16-storage LayerNorm and causal softmax against the CPU device") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (auto [rows, C] : {std::pair{1, 1}, {37, 100}, {1030, 768}}) {
      CAPTURE(rows);
      CAPTURE(C);
      const std::size_t n = std::size_t(rows) * C;
      const auto x = random_floats(n, 710 + n, -2.0, 3.0);
      const auto w = random_floats(std::size_t(C), 711), b = random_floats(std::size_t(C), 712);
      compare(*gpu, [&](Device& d) {
        auto xd = on_device(d, x), wd = on_device(d, w), bd = on_device(d, b);
        auto mean = poisoned(d, rows), rstd = poisoned(d, rows);
        DeviceArray<std::uint16_t> y = poisoned_bf16(d, n);
        d.layernorm_forward(xd.data(), wd.data(), bd.data(), y.data(), mean.data(), rstd.data(),
                            rows, C);
        return Outputs{widened(y.download()), mean.download(), rstd.download()};
      }, bf16_rounded(fp32_sums(C + 4, std::size_t(C))));
    }
    for (auto [count, T] : {std::pair{1, 1}, {2, 37}, {3, 64}, {2, 1024}}) {
      CAPTURE(count);
      CAPTURE(T);
      const std::size_t n = std::size_t(count) * T * T;
      const auto s = random_floats(n, 720 + n, -8.0, 8.0), dp = random_floats(n, 721 + n);
      const SoftmaxTolerance tol = softmax_tolerance(T, /*bf16=*/true);
      compare_each(*gpu, [&](Device& d) {
        auto sd = on_device(d, s), dpd = on_device(d, dp);
        DeviceArray<std::uint16_t> p = poisoned_bf16(d, n), ds = poisoned_bf16(d, n);
        d.causal_softmax_forward(sd.data(), p.data(), count, T, 0.125f);
        d.causal_softmax_backward(p.data(), dpd.data(), ds.data(), count, T, 0.125f);
        return Outputs{widened(p.download()), widened(ds.download())};
      }, {tol.p, tol.ds});
    }
  }

  TEST_CASE("cuda: to_bf16 and from_bf16 give the CPU device's bits") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    auto cpu = make_cpu_device(0, 1);
    const std::vector<float> x = bf16_inputs();
    const auto [gpu_bits, gpu_back] = round_trip(*gpu, x);
    const auto [cpu_bits, cpu_back] = round_trip(*cpu, x);
    CHECK(gpu_bits == cpu_bits);
    CHECK(std::memcmp(gpu_back.data(), cpu_back.data(), x.size() * sizeof(float)) == 0);
  }

  TEST_CASE("cuda: gemm_bf16 and gemm_batched_bf16 sum in fp32, within the CPU device's bound") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    auto cpu = make_cpu_device(0, 1);
    namespace g16 = bf16_gemm;
    // Both devices within the bound of the exact product: within twice of each other. C holds
    // a marker in its padding and NaN where beta = 0, so an element cuBLAS skips or reads fails.
    const auto check = [&](const g16::Case& g, std::uint64_t seed) {
      const g16::Inputs x = g16::inputs_of(g, seed);
      const g16::Expected want = g16::expected_of(g, x);
      g16::check_within(g16::run_device(*gpu, g, x), want);
      g16::check_within(g16::run_device(*cpu, g, x), want);
    };
    std::uint64_t seed = 600;
    for (Transpose ta : {Transpose::no, Transpose::yes})
      for (Transpose tb : {Transpose::no, Transpose::yes}) {
        CAPTURE(int(ta));
        CAPTURE(int(tb));
        const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
        for (auto [m, n, k] : {std::tuple{1, 1, 1}, {7, 5, 3}, {13, 17, 11}, {3, 1, 9},
                               {300, 70, 90}, {64, 10, 0}})
          for (float beta : {-0.5f, 0.0f}) {
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(k);
            CAPTURE(beta);
            g16::Case g{ta, tb, m, n, k, std::max(1, (at ? m : k) + 2),
                        std::max(1, (bt ? k : n) + 3), n + 1};
            g.beta = beta;
            check(g, seed += 3);
          }
        // Strided batches with gaps between the matrices, as attention calls them.
        for (int count : {1, 3, 37}) {
          CAPTURE(count);
          const int m = 19, n = 13, k = 21;
          const int lda = (at ? m : k) + 1, ldb = (bt ? k : n) + 2, ldc = n + 3;
          g16::Case g{ta, tb, m, n, k, lda, ldb, ldc, count};
          g.stride_a = std::int64_t(at ? k : m) * lda + 5;
          g.stride_b = std::int64_t(bt ? n : k) * ldb + 7;
          g.stride_c = std::int64_t(m) * ldc + 11;
          g.batched = true;
          check(g, seed += 3);
        }
      }
  }

  TEST_CASE("cuda: sgd_step and adamw_step with params_bf16 write to_bf16 of the parameters") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    const std::size_t n = 70001;
    const auto p0 = random_floats(n, 60), g0 = random_floats(n, 61);
    constexpr std::uint16_t kMarker = 0x1234;  // what a skipped step leaves in the copy
    // 3 steps with the copy on `d`: its parameters and state, compared with the CPU's as the
    // plain optimiser test does; the copy must be to_bf16 of d's own parameters, bit for bit,
    // and the parameters those of the same steps without the copy.
    const auto steps = [&](Device& d, const StepControl& control, auto&& step) {
      auto with = on_device(d, p0), without = on_device(d, p0), g = on_device(d, g0);
      DeviceArray<float> state_with(d, 2 * n), state_without(d, 2 * n);
      auto copy = on_device(d, std::vector<std::uint16_t>(n, kMarker));
      DeviceArray<StepControl> c(d, 1);
      c.upload(std::vector{control});
      for (int t = 1; t <= 3; ++t) {
        step(d, t, with.data(), g.data(), state_with.data(), c.data(), copy.data());
        step(d, t, without.data(), g.data(), state_without.data(), c.data(), nullptr);
      }
      const auto params = with.download();
      std::vector<std::uint16_t> want(n, kMarker);
      if (!control.skip)
        for (std::size_t i = 0; i < n; ++i) want[i] = detail::float_to_bf16(params[i]);
      CHECK(copy.download() == want);
      CHECK(std::memcmp(params.data(), without.download().data(), n * sizeof(float)) == 0);
      return Outputs{params, state_with.download()};
    };
    const SgdParams sgd{.momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true};
    const StepControl plain{.grad_norm = 1.0, .clip_scale = 1.0f};
    const StepControl clipped{.grad_norm = 2.0, .clip_scale = 0.37f};
    const StepControl skipped{.grad_norm = NAN, .clip_scale = 1.0f, .skip = 1};
    for (const StepControl& control : {plain, clipped, skipped}) {
      CAPTURE(control.clip_scale);
      CAPTURE(control.skip);
      compare(*gpu, [&](Device& d) {
        return steps(d, control, [&](Device& dev, int, float* p, const float* g, float* state,
                                     const StepControl* c, std::uint16_t* copy) {
          dev.sgd_step(sgd, 0.1f, p, g, state, n, c, copy);
        });
      }, kOptimizerSteps);
      compare(*gpu, [&](Device& d) {
        return steps(d, control, [&](Device& dev, int t, float* p, const float* g, float* state,
                                     const StepControl* c, std::uint16_t* copy) {
          dev.adamw_step({.weight_decay = 0.01f}, 0.01f, t, p, g, state, state + n, n, c, copy);
        });
      }, kOptimizerSteps);
    }
  }

  TEST_CASE("cuda: the NCCL bf16 all-reduce averages bf16 values, and the peer communicator "
            "refuses") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    const int gpus = static_cast<int>(backend->devices().size());
    std::vector<int> ids(static_cast<std::size_t>(std::min(gpus, 2)));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
    // Rank r holds r + 1 (exact in bf16); the average of 1..n is (n + 1) / 2, a bf16 too. A rank
    // that fails aborts the others (on_ranks), so a failure on 2 GPUs is reported, not a hang.
    const int n = static_cast<int>(ids.size());
    std::vector<std::vector<std::uint16_t>> got(ids.size());
    on_ranks(*backend, ids, [&](int r, Device& dev, Communicator& comm) {
      const std::vector<std::uint16_t> x(1000, detail::float_to_bf16(float(r + 1)));
      auto xd = on_device(dev, x);
      comm.all_reduce_bf16(xd.data(), x.size(), ReduceOp::avg);
      got[r] = xd.download();
    });
    for (const auto& g : got)
      CHECK(g == std::vector<std::uint16_t>(1000, detail::float_to_bf16(0.5f * float(n + 1))));

    auto peer = make_backend(BackendKind::cuda, {}, {.comm = CommKind::peer});
    auto peers = peer->create_communicators(std::vector<int>{0});
    auto dev = peer->create_device(0, 1, 0);
    peers[0]->attach(*dev);
    DeviceArray<std::uint16_t> h(*dev, 4);
    CHECK_THROWS_AS(peers[0]->all_reduce_bf16(h.data(), 4, ReduceOp::avg), InputError);
  }
}
