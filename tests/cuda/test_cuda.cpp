// The CUDA backend against the CPU device and closed-form expectations:
//   - every Device kernel on fresh random inputs, against the CPU device (outputs poisoned with
//     NaN first, so an element the GPU never writes fails); the transformer kernels are in
//     test_cuda_transformer.cpp;
//   - the parameter hash: the same bits hash equal on the CPU and the GPU;
//   - NCCL and peer all-reduce, broadcast, reduce-scatter and all-gather: rank r contributes
//     r + 1, check the sum;
//   - the trainer on backend cuda: N replicas on one GPU equal one worker with N times the
//     batch, replicas stay bit-identical, and a failing worker stops the run.
// Each test goes through the public API only (make_backend(BackendKind::cuda)), so this file
// builds without CUDA too. Without a CUDA build or a usable GPU every test says "skipping", and
// CTest reports it skipped (tests/skip.hpp): CI has nvcc but no GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../train/trainer_fixtures.hpp"
#include "common/elementwise_math.hpp"
#include "common/random.hpp"
#include "gpu_vs_cpu.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;
using namespace lockstep::test;


TEST_SUITE("cuda") {
  TEST_CASE("without a usable GPU, cuda is an input error and auto picks the CPU") {
    std::unique_ptr<Backend> cuda;
    try {
      cuda = make_backend(BackendKind::cuda);
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).starts_with("trainer.backend: cuda was requested, but "));
      CHECK(make_backend(BackendKind::automatic)->name() == "cpu");
      return;
    }
    CHECK(cuda->name() == "cuda");
    CHECK(make_backend(BackendKind::automatic)->name() == "cuda");
    const std::vector<DeviceInfo> devices = cuda->devices();
    REQUIRE(!devices.empty());
    for (const DeviceInfo& d : devices) {
      MESSAGE("cuda:" << d.id << ": " << d.name << ", " << d.memory_bytes / (1 << 20) << " MiB, "
                      << d.detail);
      CHECK(d.backend == "cuda");
      CHECK(d.detail.find("sm_") == 0);
    }
    const int count = static_cast<int>(devices.size());
    CHECK_THROWS_AS(cuda->create_device(count, 1, 0), InputError);
    CHECK_THROWS_AS(cuda->create_communicators(std::vector<int>{0, count}), InputError);
  }

  TEST_CASE("memory: zeroed allocations and copies that round-trip") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto dev = backend->create_device(0, 1, 0);
    CHECK(dev->label() == "cuda:0");
    for (std::size_t bytes : {1u, 63u, 4096u, 100001u}) {
      void* p = dev->allocate(bytes);
      std::vector<unsigned char> host(bytes, 0xff);
      dev->copy_to_host(host.data(), p, bytes);
      CHECK(std::all_of(host.begin(), host.end(), [](unsigned char b) { return b == 0; }));
      dev->deallocate(p);
    }
    const auto host = random_floats(1000, 1);
    auto a = on_device(*dev, host);
    auto b = poisoned(*dev, host.size());
    dev->copy(b.data(), a.data(), host.size() * sizeof(float));
    dev->synchronize();
    const auto back = b.download();
    CHECK(std::memcmp(back.data(), host.data(), host.size() * sizeof(float)) == 0);
  }

  TEST_CASE("staged buffers: two in flight, each waited for before use") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto dev = backend->create_device(0, 1, 0);
    constexpr std::size_t n = 70000;
    std::unique_ptr<StagedBuffer> buffers[2] = {dev->make_staged_buffer(n * sizeof(float)),
                                                dev->make_staged_buffer(n * sizeof(float))};
    DeviceArray<float> out = poisoned(*dev, n);
    for (int round = 0; round < 6; ++round) {
      StagedBuffer& buffer = *buffers[round % 2];
      const auto host = random_floats(n, 100 + round);
      buffer.stage(std::as_bytes(std::span(host)));
      buffer.wait();
      // Kernels ordered after the copy; the next round's stage into the other buffer overlaps
      // them, and the one after that must wait for them.
      dev->copy(out.data(), buffer.data<float>(), n * sizeof(float));
      dev->scale(out.data(), 2.0f, n);
      const auto back = out.download();
      for (std::size_t i = 0; i < n; ++i) REQUIRE(back[i] == 2.0f * host[i]);
    }
  }

  // Note [Deferred reads]: the copy is taken where start() was queued; kernels queued after it
  // (here, ones that overwrite the source) neither change it nor are waited for by wait(), which
  // is the one host sync.
  TEST_CASE("host readback: the copy is taken at start(), and wait() is one host sync") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto dev = backend->create_device(0, 1, 0);
    constexpr std::size_t n = 40;
    std::unique_ptr<HostReadback> readback = dev->make_host_readback(n * sizeof(float));
    DeviceArray<float> x(*dev, n);
    DeviceArray<float> big(*dev, std::size_t{1} << 26);  // work queued after start()
    for (int round = 0; round < 3; ++round) {
      const float value = 1.5f + static_cast<float>(round);
      dev->fill(x.data(), value, n);
      readback->start(x.data());
      dev->fill(x.data(), -1.0f, n);
      for (int k = 0; k < 20; ++k) dev->scale(big.data(), 0.5f, big.size());
      const std::uint64_t syncs = dev->host_syncs();
      const std::span<const std::byte> bytes = readback->wait();
      CHECK(dev->host_syncs() == syncs + 1);
      REQUIRE(bytes.size() == n * sizeof(float));
      std::vector<float> back(n);
      std::memcpy(back.data(), bytes.data(), bytes.size());
      for (float v : back) REQUIRE(v == value);
    }
    CHECK(x.download() == std::vector<float>(n, -1.0f));
  }

  TEST_CASE("fill and scale") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (std::size_t n : {1u, 1000u, 1048583u}) {
      CAPTURE(n);
      compare(*gpu, [&](Device& d) {
        auto x = poisoned(d, n);
        d.fill(x.data(), 1.25f, n);
        const auto filled = x.download();
        auto y = on_device(d, random_floats(n, n));
        d.scale(y.data(), -0.375f, n);
        return Outputs{filled, y.download()};
      }, fp32_sums(1));
    }
  }

  TEST_CASE("gemm for every transpose, padded leading dimensions, alpha and beta") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    std::uint64_t seed = 10;
    for (Transpose ta : {Transpose::no, Transpose::yes})
      for (Transpose tb : {Transpose::no, Transpose::yes})
        for (auto [m, n, k] : {std::tuple{1, 1, 1}, {7, 5, 3}, {13, 17, 11}, {3, 1, 9},
                               {300, 70, 90}, {64, 10, 0}}) {
          CAPTURE(int(ta));
          CAPTURE(int(tb));
          CAPTURE(m);
          CAPTURE(n);
          CAPTURE(k);
          const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
          const int lda = std::max(1, (at ? m : k) + 2), ldb = std::max(1, (bt ? k : n) + 3);
          const int ldc = n + 1;
          const auto a = random_floats(std::size_t(at ? k : m) * lda, seed += 3);
          const auto b = random_floats(std::size_t(bt ? n : k) * ldb, seed += 3);
          auto c0 = random_floats(std::size_t(m) * ldc, seed += 3);
          for (int i = 0; i < m; ++i) c0[std::size_t(i) * ldc + n] = kNaN;  // padding: untouched
          compare(*gpu, [&](Device& d) {
            auto ad = on_device(d, a), bd = on_device(d, b), cd = on_device(d, c0);
            d.gemm(ta, tb, m, n, k, 0.75f, ad.data(), lda, bd.data(), ldb, -0.5f, cd.data(), ldc);
            // beta = 0 must not read C: NaN in C on the GPU, zeros on the CPU (whose BLAS we do
            // not test here).
            std::vector<float> fresh(c0.size(), d.backend() == "cuda" ? kNaN : 0.0f);
            for (int i = 0; i < m; ++i) fresh[std::size_t(i) * ldc + n] = kNaN;
            auto zd = on_device(d, fresh);
            d.gemm(ta, tb, m, n, k, 1.0f, ad.data(), lda, bd.data(), ldb, 0.0f, zd.data(), ldc);
            return Outputs{cd.download(), zd.download()};
          }, fp32_sums(k + 1, std::size_t(ldc)), NaNs::where_cpu_has_them);  // the padding
        }
  }

  TEST_CASE("cuda: add_bias to the bit, and bias_grad deterministic, the CPU's float or next "
            "to it") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    auto cpu = make_cpu_device(0, 1);
    // Rows and columns on and off the kernels' multiples (32 columns, 32 row groups, 8 loads),
    // and GPT-2 124M's shapes.
    for (auto [rows, cols] : {std::pair{5, 7}, {300, 130}, {1, 1}, {64, 1000}, {0, 3},
                              {255, 33}, {257, 31}, {2049, 769}, {8192, 768}, {1024, 3072}}) {
      CAPTURE(rows);
      CAPTURE(cols);
      const auto y = random_floats(std::size_t(rows) * cols, 20);
      const auto bias = random_floats(cols, 21);
      compare(
          *gpu,
          [&](Device& d) {
            auto yd = on_device(d, y), bd = on_device(d, bias);
            d.add_bias(yd.data(), bd.data(), rows, cols);
            return Outputs{yd.download()};
          },
          kSameBits);
      const auto run = [&](Device& d) {
        auto yd = on_device(d, y), bd = on_device(d, bias);
        d.bias_grad(bd.data(), yd.data(), rows, cols);  // accumulates into the bias
        return bd.download();
      };
      const auto want = run(*cpu), got = run(*gpu);
      REQUIRE(got.size() == want.size());
      for (int c = 0; c < cols; ++c) {
        CAPTURE(c);
        const std::int64_t ulps = std::int64_t{std::bit_cast<std::int32_t>(got[c])} -
                                 std::bit_cast<std::int32_t>(want[c]);
        CHECK(std::abs(ulps) <= 1);
      }
      CHECK(run(*gpu) == got);  // the same bits run to run
    }
  }

  TEST_CASE("cuda: activations and their derivatives") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    const std::size_t n = 100003;
    auto x = random_floats(n, 30, -6.0, 6.0);
    x[0] = 0.0f;  // relu'(0) = 0 on both
    const auto dy = random_floats(n, 31);
    for (Activation f : {Activation::relu, Activation::tanh, Activation::gelu}) {
      CAPTURE(to_string(f));
      // ReLU and GELU to the bit (no fused multiply-adds on either side, the same exp_poly);
      // tanh is each side's library (Note [Numerics of the CUDA kernels]), a few ulps apart, and
      // 1 - tanh^2 cancels near |tanh| = 1, which the floor (of the largest |dx|) covers.
      compare(
          *gpu,
          [&](Device& d) {
            auto xd = on_device(d, x), dyd = on_device(d, dy);
            auto yd = poisoned(d, n), dxd = poisoned(d, n);
            d.activation_forward(f, xd.data(), yd.data(), n);
            d.activation_backward(f, xd.data(), dyd.data(), dxd.data(), n);
            return Outputs{yd.download(), dxd.download()};
          },
          f == Activation::tanh ? fp32_sums(4) : kSameBits);
    }
  }

  TEST_CASE("cuda: softmax_cross_entropy: loss, correct count, dlogits, bad labels") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    std::uint64_t seed = 40;
    for (auto [rows, classes] : {std::pair{1, 1}, {37, 6}, {64, 10}, {5, 300}, {3, 1000}}) {
      CAPTURE(rows);
      CAPTURE(classes);
      const auto logits = random_floats(std::size_t(rows) * classes, seed += 2, -30.0, 30.0);
      std::vector<std::int32_t> labels(rows);
      for (auto& l : labels) l = static_cast<std::int32_t>(detail::uniform_below(seed, classes));
      const float scale = 1.0f / static_cast<float>(rows);
      LossStats stats[2], summed[2];
      int which = 0;
      compare(*gpu, [&](Device& d) {
        auto ld = on_device(d, logits);
        auto yd = on_device(d, labels);
        auto dd = poisoned(d, logits.size());
        const LossStats s = d.softmax_cross_entropy(ld.data(), yd.data(), rows, classes,
                                                    dd.data(), scale);
        const LossStats without = d.softmax_cross_entropy(ld.data(), yd.data(), rows, classes,
                                                          nullptr, 0.0f);
        CHECK(without.loss_sum == s.loss_sum);
        CHECK(without.correct == s.correct);
        // Accumulated on the device over calls, as a training step does.
        DeviceArray<LossStats> acc(d, 1);
        for (int call = 0; call < 3; ++call)
          d.softmax_cross_entropy(ld.data(), yd.data(), rows, classes, static_cast<float*>(nullptr),
                                  0.0f, acc.data());
        summed[which] = acc.download()[0];
        CHECK(summed[which].loss_sum == s.loss_sum + s.loss_sum + s.loss_sum);
        CHECK(summed[which].correct == 3 * s.correct);
        CHECK(summed[which].label_error == 0);
        stats[which++] = s;
        return Outputs{dd.download()};
      }, [&] {
        // A label's p - 1 for p within ulps of 1 is a difference of nearly equal terms: the
        // GPU's p rounds to float before 1 is taken, the CPU's once from double, an ulp of 1
        // apart; the row's other values are as small, so the bound takes the array's largest.
        Tolerance t = fp32_sums(classes + 4, std::size_t(classes));
        t.whole = 4 * kFp32Ulp;
        return t;
      }());
      // exp in float on the GPU, in double on the CPU: each e^z within a few 1e-7 relative.
      CHECK(stats[1].loss_sum == doctest::Approx(stats[0].loss_sum).epsilon(1e-6));
      CHECK(stats[1].correct == stats[0].correct);
    }
    // A label outside [0, classes) is recorded on the device, the lowest bad row as on the CPU,
    // and read back as bad input.
    auto cpu = make_cpu_device(0, 1);
    std::uint64_t keys[2] = {};
    int which = 0;
    for (Device* d : {gpu.get(), cpu.get()}) {
      auto lx = on_device(*d, random_floats(16, 5));
      auto yx = on_device(*d, std::vector<std::int32_t>{0, 2, -3, 7});
      DeviceArray<LossStats> acc(*d, 1);
      d->softmax_cross_entropy(lx.data(), yx.data(), 4, 4, static_cast<float*>(nullptr), 0.0f,
                               acc.data());
      keys[which++] = acc.download()[0].label_error;
    }
    CHECK(keys[0] == keys[1]);
    CHECK(detail::label_error_row(keys[0]) == 2);
    CHECK(detail::label_error_label(keys[0]) == -3);
    // A chunk of a batch (first_row 300: the chunked LM head's second chunk of 256 rows and
    // more) names its rows in the batch, fp32 and bf16 logits: rows 301 and 303 bad, 301 named.
    std::uint64_t chunk_keys[2][2] = {};
    which = 0;
    for (Device* d : {gpu.get(), cpu.get()}) {
      const std::vector<float> logits = random_floats(16, 6);
      auto lx = on_device(*d, logits);
      auto lx16 = on_device(*d, to_bits(logits));
      auto yx = on_device(*d, std::vector<std::int32_t>{0, 8, 1, -5});
      DeviceArray<LossStats> acc(*d, 2);
      d->softmax_cross_entropy(lx.data(), yx.data(), 4, 4, static_cast<float*>(nullptr), 0.0f,
                               acc.data(), 300);
      d->softmax_cross_entropy(lx16.data(), yx.data(), 4, 4, nullptr, 0.0f, acc.data() + 1, 300);
      const std::vector<LossStats> got = acc.download();
      chunk_keys[which][0] = got[0].label_error;
      chunk_keys[which++][1] = got[1].label_error;
    }
    for (int k = 0; k < 2; ++k) {
      CHECK(chunk_keys[0][k] == chunk_keys[1][k]);
      CHECK(detail::label_error_row(chunk_keys[0][k]) == 301);
      CHECK(detail::label_error_label(chunk_keys[0][k]) == 8);
    }
    auto ld = on_device(*gpu, random_floats(12, 5));
    auto yd = on_device(*gpu, std::vector<std::int32_t>{0, 4, 1});
    CHECK_THROWS_WITH_AS(gpu->softmax_cross_entropy(ld.data(), yd.data(), 3, 4, nullptr, 1.0f),
                         doctest::Contains("label 4 of row 1"), InputError);
    // The device is still usable afterwards; zero rows give zero stats.
    auto ok = on_device(*gpu, std::vector<std::int32_t>{0, 2, 1});
    const LossStats after = gpu->softmax_cross_entropy(ld.data(), ok.data(), 3, 4, nullptr, 1.0f);
    CHECK(std::isfinite(after.loss_sum));
    CHECK(gpu->softmax_cross_entropy(ld.data(), ok.data(), 0, 4, nullptr, 1.0f).loss_sum == 0.0);
  }

  TEST_CASE("cuda: softmax_cross_entropy over a GPT-2 vocabulary padded with -inf logits") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    // 50257 real logits padded to 50304 with -inf (as the GPT's LM head pads them): the padding
    // gets exactly zero gradient and changes neither the loss nor the argmax.
    constexpr int kRows = 6, kVocab = 50257, kPadded = 50304;
    auto logits = random_floats(std::size_t(kRows) * kPadded, 45, -8.0, 8.0);
    for (int r = 0; r < kRows; ++r)
      for (int j = kVocab; j < kPadded; ++j)
        logits[std::size_t(r) * kPadded + j] = -std::numeric_limits<float>::infinity();
    const auto labels = random_labels(kRows, kVocab, 46);
    std::vector<LossStats> stats;
    compare(*gpu, [&](Device& d) {
      auto ld = on_device(d, logits);
      auto yd = on_device(d, labels);
      auto dd = poisoned(d, logits.size());
      stats.push_back(d.softmax_cross_entropy(ld.data(), yd.data(), kRows, kPadded, dd.data(),
                                              0.5f));
      const auto dlogits = dd.download();
      for (int r = 0; r < kRows; ++r)
        for (int j = kVocab; j < kPadded; ++j)
          REQUIRE(dlogits[std::size_t(r) * kPadded + j] == 0.0f);
      return Outputs{dlogits};
    }, fp32_sums(kPadded + 4, kPadded));
    CHECK(stats[1].loss_sum == doctest::Approx(stats[0].loss_sum).epsilon(1e-6));
    CHECK(stats[1].correct == stats[0].correct);
  }

  TEST_CASE("cuda: softmax_cross_entropy in place, dlogits over the logits, against the CPU") {
    // The chunked LM head's fp32 path (Note [Chunked classifier] in src/model/lm_head.cpp)
    // writes each row's gradient over its logits. The kernel parks e_j = exp(z_j - z_max) in
    // dlogits in its first pass: every thread must have read z[argmax] and z[label] before the
    // first warp's e_j lands on them. Both sit in the first warp's columns here, which that warp
    // overwrites first; a GPT-2 row (50304 columns, padded) keeps the other warps busy longest.
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (auto [rows, classes] : {std::pair{64, 1000}, {48, 50304}}) {
      CAPTURE(rows);
      CAPTURE(classes);
      auto logits = random_floats(std::size_t(rows) * classes, 48 + classes, -8.0, 8.0);
      std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
      for (int r = 0; r < rows; ++r) {
        logits[std::size_t(r) * classes + std::size_t(r % 32)] = 12.0f;  // the argmax
        labels[std::size_t(r)] = r % 3 == 0 ? r % 32 : (r * 7 + 1) % 32;
      }
      std::vector<LossStats> stats;
      compare(*gpu, [&](Device& d) {
        auto ld = on_device(d, logits);
        auto yd = on_device(d, labels);
        stats.push_back(d.softmax_cross_entropy(ld.data(), yd.data(), rows, classes, ld.data(),
                                                0.5f));
        return Outputs{ld.download()};
      }, fp32_sums(classes + 4, std::size_t(classes)));
      CHECK(stats[1].loss_sum == doctest::Approx(stats[0].loss_sum).epsilon(1e-6));
      CHECK(stats[1].correct == stats[0].correct);
      CHECK(stats[0].correct == (rows + 2) / 3);
    }
  }

  TEST_CASE("cuda: softmax_cross_entropy checks every label before it writes a dlogit") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    // Row 2's label is bad; rows 0 and 1 (and 3) must not be written either, as on the CPU.
    auto ld = on_device(*gpu, random_floats(4 * 5, 47));
    // (-1 is kIgnoreLabel, a row that does not count; -2 is outside.)
    auto yd = on_device(*gpu, std::vector<std::int32_t>{0, 1, -2, 4});
    auto dd = on_device(*gpu, std::vector<float>(4 * 5, 7.0f));
    CHECK_THROWS_WITH(gpu->softmax_cross_entropy(ld.data(), yd.data(), 4, 5, dd.data(), 1.0f),
                      doctest::Contains("label -2 of row 2"));
    const auto d = dd.download();
    CHECK(std::all_of(d.begin(), d.end(), [](float v) { return v == 7.0f; }));
  }

  TEST_CASE("sum_squares is close to the CPU's and identical run to run") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    auto cpu = make_cpu_device(0, 1);
    for (std::size_t n : {0u, 1u, 1000u, 1048579u}) {
      CAPTURE(n);
      const auto x = random_floats(n, n + 7, -3.0, 3.0);
      auto xg = on_device(*gpu, x);
      auto xc = on_device(*cpu, x);
      const double got = gpu->sum_squares(xg.data(), n);
      CHECK(got == doctest::Approx(cpu->sum_squares(xc.data(), n)).epsilon(1e-10));
      CHECK(gpu->sum_squares(xg.data(), n) == got);
    }
  }

  TEST_CASE("sum_squares_grains is close to the CPU's, and the same from any grain-aligned start") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    auto cpu = make_cpu_device(0, 1);
    const std::size_t n = 5 * 16384 + 99, grain = 16384, grains = 6;
    const auto x = random_floats(n, 17, -3.0, 3.0);
    auto xg = on_device(*gpu, x);
    auto xc = on_device(*cpu, x);
    DeviceArray<double> got_g(*gpu, grains), want_c(*cpu, grains), tail_g(*gpu, grains - 3);
    gpu->sum_squares_grains(xg.data(), n, grain, got_g.data());
    cpu->sum_squares_grains(xc.data(), n, grain, want_c.data());
    gpu->sum_squares_grains(xg.data() + 3 * grain, n - 3 * grain, grain, tail_g.data());
    const std::vector<double> got = got_g.download(), want = want_c.download(),
                              tail = tail_g.download();
    for (std::size_t g = 0; g < grains; ++g) {
      CAPTURE(g);
      CHECK(got[g] == doctest::Approx(want[g]).epsilon(1e-10));
      if (g >= 3) CHECK(tail[g - 3] == got[g]);
    }
  }

  TEST_CASE("step_control: the CPU's bits for the norm, the clip factor and the skip flag") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    auto cpu = make_cpu_device(0, 1);
    std::uint64_t seed = 70;
    // Around the kernel's chunk of 1024 sums, and GPT-2 124M's count.
    for (std::size_t grains : {1u, 7u, 1023u, 1024u, 1025u, 2049u, 7600u}) {
      std::vector<double> sums(grains);
      for (double& x : sums) x = 1e-3 * static_cast<double>(detail::uniform_below(seed, 100000));
      for (double clip : {0.0, 0.5, 1e9}) {
        CAPTURE(grains);
        CAPTURE(clip);
        StepControl got[2];
        int which = 0;
        for (Device* d : {gpu.get(), cpu.get()}) {
          auto sd = on_device(*d, sums);
          DeviceArray<StepControl> c(*d, 1);
          d->step_control(sd.data(), grains, clip, c.data());
          got[which++] = c.download()[0];
        }
        CHECK(std::bit_cast<std::uint64_t>(got[0].grad_norm) ==
              std::bit_cast<std::uint64_t>(got[1].grad_norm));
        CHECK(std::bit_cast<std::uint32_t>(got[0].clip_scale) ==
              std::bit_cast<std::uint32_t>(got[1].clip_scale));
        CHECK(got[0].skip == 0);
        CHECK(got[1].skip == 0);
      }
    }
    auto bad = on_device(*gpu, std::vector<double>{1.0, std::numeric_limits<double>::quiet_NaN()});
    DeviceArray<StepControl> c(*gpu, 1);
    gpu->step_control(bad.data(), 2, 1.0, c.data());
    CHECK(c.download()[0].skip == 1);
  }

  TEST_CASE("hash: the same bits hash equal on the CPU and the GPU") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    auto cpu = make_cpu_device(0, 1);
    for (std::size_t n : {0u, 1u, 12345u, 1048577u}) {
      CAPTURE(n);
      auto x = random_floats(n, n + 3);
      if (n > 2) {
        x[0] = -0.0f;
        x[1] = std::bit_cast<float>(0x7fc01234u);  // a NaN with a payload
      }
      auto xg = on_device(*gpu, x);
      auto xc = on_device(*cpu, x);
      const std::uint64_t h = gpu->hash(xg.data(), n);
      CHECK(h == cpu->hash(xc.data(), n));
      if (n > 0) {  // one flipped bit changes it
        x[n / 2] = std::nextafter(x[n / 2], 2.0f);
        auto yg = on_device(*gpu, x);
        CHECK(gpu->hash(yg.data(), n) != h);
      }
    }
  }

  TEST_CASE("sgd_step and adamw_step, plain and with the step's control") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    const std::size_t n = 70001;
    const auto p0 = random_floats(n, 50), g0 = random_floats(n, 51);
    for (auto [momentum, nesterov, wd] : {std::tuple{0.0f, false, 0.0f},
                                         {0.9f, false, 0.01f},
                                         {0.9f, true, 0.0f}}) {
      CAPTURE(momentum);
      CAPTURE(nesterov);
      compare(*gpu, [&](Device& d) {
        auto p = on_device(d, p0), g = on_device(d, g0);
        DeviceArray<float> buf(d, n);
        const SgdParams opt{.momentum = momentum, .weight_decay = wd, .nesterov = nesterov};
        for (int step = 0; step < 3; ++step)
          d.sgd_step(opt, 0.1f, p.data(), g.data(), momentum != 0.0f ? buf.data() : nullptr, n,
                     nullptr, nullptr);
        return Outputs{p.download(), buf.download()};
      }, kOptimizerSteps);
    }
    compare(*gpu, [&](Device& d) {
      auto p = on_device(d, p0), g = on_device(d, g0);
      DeviceArray<float> m(d, n), v(d, n);
      const AdamWParams opt{.weight_decay = 0.01f};
      for (std::int64_t t = 1; t <= 3; ++t)
        d.adamw_step(opt, 0.01f, t, p.data(), g.data(), m.data(), v.data(), n, nullptr,
                     nullptr);
      return Outputs{p.download(), m.download(), v.download()};
    }, kOptimizerSteps);
    // The clip factor and the skip flag, read from the device.
    for (const StepControl control : {StepControl{.grad_norm = 2.0, .clip_scale = 0.37f},
                                      StepControl{.grad_norm = NAN, .clip_scale = 1.0f, .skip = 1}}) {
      CAPTURE(control.skip);
      compare(*gpu, [&](Device& d) {
        auto p = on_device(d, p0), g = on_device(d, g0);
        DeviceArray<StepControl> c(d, 1);
        c.upload(std::vector{control});
        DeviceArray<float> buf(d, n), m(d, n), v(d, n);
        const SgdParams sgd{.momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true};
        d.sgd_step(sgd, 0.1f, p.data(), g.data(), buf.data(), n, c.data(), nullptr);
        d.adamw_step({.weight_decay = 0.01f}, 0.01f, 1, p.data(), g.data(), m.data(), v.data(), n,
                     c.data(), nullptr);
        return Outputs{p.download(), buf.download(), m.download(), v.download(), g.download()};
      }, kOptimizerSteps);
    }
  }

  TEST_CASE("NCCL: all_reduce and broadcast, rank r contributing r + 1") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    const int gpus = static_cast<int>(backend->devices().size());
    std::vector<std::vector<int>> groups{{0}};  // NCCL with one rank: still a real NCCL call
    if (gpus > 1) {
      groups.emplace_back(gpus);
      std::iota(groups.back().begin(), groups.back().end(), 0);
    }
    for (const auto& ids : groups) {
      const int n = static_cast<int>(ids.size());
      for (std::size_t count : {0u, 1u, 3u, 1000u, 1048583u}) {
        CAPTURE(n);
        CAPTURE(count);
        on_ranks(*backend, ids, [&](int r, Device& d, Communicator& c) {
          DeviceArray<float> sum(d, count), avg(d, count), bc(d, count);
          d.fill(sum.data(), float(r + 1), count);
          d.fill(avg.data(), float(r + 1), count);
          d.fill(bc.data(), float(r + 1), count);
          c.all_reduce(sum.data(), count, ReduceOp::sum);
          c.all_reduce(avg.data(), count, ReduceOp::avg);
          c.broadcast(bc.data(), count, n - 1);
          const float total = float(n * (n + 1) / 2);
          const auto s = sum.download(), a = avg.download(), b = bc.download();
          CHECK(std::all_of(s.begin(), s.end(), [&](float v) { return v == total; }));
          CHECK(std::all_of(a.begin(), a.end(), [&](float v) {
            return std::abs(v - total / float(n)) <= 1e-6f * total;
          }));
          CHECK(std::all_of(b.begin(), b.end(), [&](float v) { return v == float(n); }));
        });
      }
    }
  }

  TEST_CASE("NCCL and peer: reduce_scatter and all_gather, equal and uneven shards") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    const int gpus = static_cast<int>(backend->devices().size());
    std::vector<std::vector<int>> groups{{0}, {0, 0, 0}};  // NCCL of one; peer of three
    if (gpus > 1) {
      groups.emplace_back(gpus);
      std::iota(groups.back().begin(), groups.back().end(), 0);
    }
    for (const auto& ids : groups) {
      const int n = static_cast<int>(ids.size());
      // 64 n x 101 divides into equal shards (ncclReduceScatter); the others do not.
      for (std::size_t count : {std::size_t{1}, std::size_t{1000},
                                static_cast<std::size_t>(64 * n * 101), std::size_t{1048583}}) {
        CAPTURE(n);
        CAPTURE(count);
        on_ranks(*backend, ids, [&](int r, Device& d, Communicator& c) {
          const ShardRange s = shard_range(count, n, r, 64);
          std::vector<float> mine(count), gather(count, -1.0f);
          for (std::size_t i = 0; i < count; ++i) mine[i] = float((r + 1) * int(i % 13 + 1));
          for (std::size_t i = s.begin; i < s.end; ++i) gather[i] = mine[i];
          auto sum = on_device(d, mine), all = on_device(d, gather);
          c.reduce_scatter(sum.data(), count, 64, ReduceOp::sum);
          c.all_gather(all.data(), count, 64);
          const auto got = sum.download(), gathered = all.download();
          for (std::size_t i = s.begin; i < s.end; ++i)
            REQUIRE(got[i] == float(n * (n + 1) / 2 * int(i % 13 + 1)));
          for (int owner = 0; owner < n; ++owner) {
            const ShardRange o = shard_range(count, n, owner, 64);
            for (std::size_t i = o.begin; i < o.end; ++i)
              REQUIRE(gathered[i] == float((owner + 1) * int(i % 13 + 1)));
          }
        });
      }
    }
  }

  TEST_CASE("peer: all_reduce and broadcast of 2 to 4 ranks on GPU 0, any count") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    for (int n = 2; n <= 4; ++n) {
      const std::vector<int> ids(n, 0);  // repeated ids: the peer communicator
      for (std::size_t count : {0u, 1u, 3u, 1000u, 1048583u}) {
        CAPTURE(n);
        CAPTURE(count);
        std::vector<std::uint64_t> hashes(n);
        on_ranks(*backend, ids, [&](int r, Device& d, Communicator& c) {
          // rank r holds (r + 1) * (i % 13 + 1): small integers, so every sum is exact.
          std::vector<float> mine(count);
          for (std::size_t i = 0; i < count; ++i) mine[i] = float((r + 1) * int(i % 13 + 1));
          auto sum = on_device(d, mine), avg = on_device(d, mine);
          DeviceArray<float> bc(d, count);
          // Several rounds on the same buffers: the events are reused safely.
          for (int round = 0; round < 3; ++round) {
            sum.upload(mine);
            d.fill(bc.data(), float(r + 1), count);
            c.all_reduce(sum.data(), count, ReduceOp::sum);
            c.broadcast(bc.data(), count, round % n);
            const auto s = sum.download(), b = bc.download();
            for (std::size_t i = 0; i < count; ++i) {
              REQUIRE(s[i] == float(n * (n + 1) / 2 * int(i % 13 + 1)));
              REQUIRE(b[i] == float(round % n + 1));
            }
          }
          c.all_reduce(avg.data(), count, ReduceOp::avg);
          const auto a = avg.download();
          for (std::size_t i = 0; i < count; ++i)
            REQUIRE(a[i] == float(n * (n + 1) / 2 * int(i % 13 + 1)) * (1.0f / float(n)));
          hashes[r] = d.hash(avg.data(), count);
        });
        for (int r = 1; r < n; ++r) CHECK(hashes[r] == hashes[0]);
      }
    }
  }
}

// ---- The trainer on backend cuda (see tests/train/test_trainer.cpp for the CPU) ----------------

namespace {

std::shared_ptr<const Dataset> synthetic(std::size_t n, std::uint64_t seed) {
  return std::make_shared<InMemoryDataset>(make_synthetic(n, 12, 4, seed));
}

// tests/train/test_trainer.cpp's problem, on the given GPUs.
Config gpu_config(std::vector<int> devices, int batch, OptimizerKind opt) {
  Config cfg = test::small_mlp_config(static_cast<int>(devices.size()), batch, opt);
  cfg.data.dataset = DatasetKind::synthetic;  // datasets are passed in; this satisfies validate()
  cfg.trainer.backend = BackendKind::cuda;
  cfg.trainer.devices = std::move(devices);
  return cfg;
}

using test::relative_difference;

}  // namespace

TEST_SUITE("cuda trainer") {
  // cuBLAS may pick another kernel for another batch size, and the sums over the batch are split
  // differently, so the runs agree to rounding, not to the bit.
  constexpr double kTolerance = 1e-4;

  TEST_CASE("N replicas on one GPU x batch B equal 1 worker x batch N*B, and the CPU's run") {
    if (!cuda_or_skip()) return;
    auto train = synthetic(240, 1);
    auto eval = synthetic(40, 2);
    for (OptimizerKind opt : {OptimizerKind::sgd, OptimizerKind::adamw}) {
      for (int n : {2, 4}) {
        CAPTURE(to_string(opt));
        CAPTURE(n);
        const int b = 5;
        Trainer many(gpu_config(std::vector<int>(n, 0), b, opt), train, eval);
        Trainer one(gpu_config({0}, n * b, opt), train, eval);
        Config on_cpu = gpu_config(std::vector<int>(n, 0), b, opt);
        on_cpu.trainer.backend = BackendKind::cpu;
        Trainer cpu(on_cpu, train, eval);
        const Summary sm = many.run();
        const Summary so = one.run();
        cpu.run();
        CHECK(sm.backend == "cuda");
        // What runs the fused attention, in the summary (empty without cuDNN in the build).
        CHECK(sm.cudnn == cuda_support().cudnn);
        CHECK(sm.replicas_identical);
        CHECK(relative_difference(many.final_parameters(), one.final_parameters()) <= kTolerance);
        CHECK(relative_difference(many.final_parameters(), cpu.final_parameters()) <= kTolerance);
        CHECK(sm.eval_loss == doctest::Approx(so.eval_loss).epsilon(kTolerance));
        const std::vector<float> init = one.model().initial_parameters(5);
        CHECK(relative_difference(one.final_parameters(), init) > 1e-3);
      }
    }
  }

  TEST_CASE("cuda trainer: the summary's device memory holds the plan, and grows with it") {
    // Note [Device memory measured]: what the run added to GPU 0 (peak - baseline) holds at
    // least the plan's bytes, and what a batch 64 times larger adds is what its plan adds,
    // within 10% and cudaMalloc's rounding (a 3-2048-2048-4 MLP, activations about 200 MB at
    // batch 4096). The first run loads the libraries' kernels into the context (lazily, at
    // their first launch): the two compared come after it.
    if (!cuda_or_skip()) return;
    auto train = synthetic(4096, 5);
    std::size_t added[3] = {}, planned[3] = {};
    int which = 0;
    for (const int batch : {64, 64, 4096}) {
      CAPTURE(batch);
      Config cfg = gpu_config({0}, batch, OptimizerKind::adamw);
      cfg.model.hidden = {2048, 2048};
      cfg.trainer.steps = 2;
      const Summary s = Trainer(cfg, train, nullptr).run();
      REQUIRE(s.device_memory.size() == 1);
      const Summary::DeviceMemory& g = s.device_memory[0];
      CHECK(g.device == 0);
      CHECK(g.baseline_bytes > 0);  // the CUDA context at least
      REQUIRE(g.peak_bytes >= g.baseline_bytes);
      CHECK(g.peak_bytes <= g.total_bytes);
      added[which] = g.peak_bytes - g.baseline_bytes;
      planned[which] = s.planned_worker_bytes;
      CHECK(added[which] >= planned[which]);  // the plan is a lower bound
      ++which;
    }
    const double grown = double(added[2]) - double(added[1]);
    const double plan_grown = double(planned[2]) - double(planned[1]);
    REQUIRE(plan_grown > 100e6);
    CHECK(std::abs(grown - plan_grown) <= 0.1 * plan_grown + 16.0 * (1 << 20));
  }

  TEST_CASE("cuda trainer: one worker alone makes no NCCL communicator (trainer.comm auto)") {
    // A one-rank NCCL communicator held 1.06 GiB of the H200's memory that the plan leaves out
    // (bench/GPU.md, 2026-12-04) for collectives that move nothing: auto gives one worker the
    // peer group of one rank, so it adds what comm peer adds, not what comm nccl adds. The
    // parameters end bit-identical either way (one rank's collectives are identities), and so
    // do they with the bf16 reduction, which the peer group refuses for several ranks.
    if (!cuda_or_skip()) return;
    auto train = synthetic(256, 5);
    const auto run = [&](CommKind comm, ReduceDtype dtype) {
      Config cfg = gpu_config({0}, 64, OptimizerKind::adamw);
      cfg.model.hidden = {512, 512};
      cfg.trainer.steps = 3;
      cfg.trainer.comm = comm;
      cfg.trainer.grad_reduce_dtype = dtype;
      Trainer t(cfg, train, nullptr);
      const Summary s = t.run();
      CHECK(s.communicator == (comm == CommKind::nccl ? "nccl: 1 rank, a GPU each"
                                                      : "peer: 1 worker of one process, over device memory"));
      REQUIRE(s.device_memory.size() == 1);
      const Summary::DeviceMemory& g = s.device_memory[0];
      REQUIRE(g.peak_bytes >= g.baseline_bytes);
      return std::pair{double(g.peak_bytes - g.baseline_bytes), t.final_parameters()};
    };
    run(CommKind::peer, ReduceDtype::fp32);  // loads the libraries' kernels into the context
    const auto [peer, peer_params] = run(CommKind::peer, ReduceDtype::fp32);
    const auto [automatic, auto_params] = run(CommKind::automatic, ReduceDtype::fp32);
    const auto [nccl, nccl_params] = run(CommKind::nccl, ReduceDtype::fp32);
    MESSAGE("one worker adds " << peer / (1 << 20) << " MiB with comm peer, "
            << automatic / (1 << 20) << " MiB with auto, " << nccl / (1 << 20)
            << " MiB with nccl");
    CHECK(std::abs(automatic - peer) <= 16.0 * (1 << 20));
    CHECK(auto_params == peer_params);
    CHECK(nccl_params == peer_params);
    // One rank's bf16 reduction rounds the gradients to bf16 and back, on either group.
    const std::vector<float> bf16_params = run(CommKind::automatic, ReduceDtype::bf16).second;
    CHECK(bf16_params == run(CommKind::nccl, ReduceDtype::bf16).second);
    CHECK(bf16_params != peer_params);
  }

  TEST_CASE("NCCL across GPUs equals one GPU with the whole batch") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    const int gpus = static_cast<int>(backend->devices().size());
    if (gpus < 2) {
      skip(Skip::gpu, "needs 2 GPUs, this machine has " + std::to_string(gpus));
      return;
    }
    auto train = synthetic(240, 1);
    auto eval = synthetic(40, 2);
    Trainer many(gpu_config({0, 1}, 5, OptimizerKind::adamw), train, eval);
    Trainer one(gpu_config({0}, 10, OptimizerKind::adamw), train, eval);
    CHECK(many.run().replicas_identical);
    one.run();
    CHECK(relative_difference(many.final_parameters(), one.final_parameters()) <= kTolerance);
  }

  TEST_CASE("replicas on one GPU are bit-identical after every step") {
    if (!cuda_or_skip()) return;
    const int n = 3;
    Config cfg = gpu_config(std::vector<int>(n, 0), 8, OptimizerKind::adamw);
    Trainer trainer(cfg, synthetic(200, 3), synthetic(30, 4));
    std::mutex mutex;
    std::vector<std::vector<std::vector<float>>> params(cfg.trainer.steps + 1,
                                                        std::vector<std::vector<float>>(n));
    TrainerHooks hooks;
    hooks.after_update = [&](int rank, std::int64_t step, Replica& replica) {
      std::vector<float> p = replica.parameters();
      std::lock_guard lock(mutex);
      params[step][rank] = std::move(p);
    };
    trainer.set_hooks(hooks);
    const Summary s = trainer.run();
    CHECK(s.replicas_identical);
    CHECK(s.replica_checks == cfg.trainer.steps + 1);
    for (std::int64_t step = 1; step <= cfg.trainer.steps; ++step)
      for (int r = 1; r < n; ++r) REQUIRE(params[step][r] == params[step][0]);
    CHECK(params[cfg.trainer.steps][0] == trainer.final_parameters());
  }

  TEST_CASE("a worker that throws stops every GPU worker, and run() reports it") {
    if (!cuda_or_skip()) return;
    for (int failing : {0, 1}) {
      CAPTURE(failing);
      Config cfg = gpu_config({0, 0}, 4, OptimizerKind::sgd);
      cfg.trainer.steps = 30;
      Trainer trainer(cfg, synthetic(200, 3), synthetic(30, 4));
      TrainerHooks hooks;
      hooks.before_forward = [failing](int rank, std::int64_t step) {
        if (rank == failing && step == 7) throw std::runtime_error("injected fault");
      };
      trainer.set_hooks(hooks);
      try {
        trainer.run();
        FAIL("run() should have thrown");
      } catch (const WorkerError& e) {
        CHECK(e.rank() == failing);
        CHECK(e.device() == "cuda:0");
        CHECK(std::string(e.what()).find("injected fault") != std::string::npos);
      }
    }
  }
}
