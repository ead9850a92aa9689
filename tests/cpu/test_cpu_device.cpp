// The CPU device's kernels against naive double-precision loops on random inputs, and its
// determinism: devices with 1 and 2 threads must produce bit-identical results.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../random_data.hpp"
#include "common/elementwise_math.hpp"
#include "common/random.hpp"
#include "lockstep/device.hpp"
#include "lockstep/error.hpp"

namespace {

using lockstep::Activation;
using lockstep::Device;
using lockstep::DeviceArray;
using lockstep::Transpose;

using lockstep::test::on_device;
using lockstep::test::random_floats;

// Every got[i] within abs_tol + rel_tol * |want[i]|; reports the first miss only.
void check_close(const std::vector<float>& got, const std::vector<double>& want,
                 double rel_tol = 1e-5, double abs_tol = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= abs_tol + rel_tol * std::abs(want[i]))) {
      FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
      return;
    }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct GemmCase {
  Transpose ta, tb;
  int m, n, k, lda, ldb, ldc;
};

// C (m, n) = alpha * op(A) * op(B) + beta * C on `dev`; returns C (m, ldc) including padding.
std::vector<float> run_gemm(Device& dev, const GemmCase& g, const std::vector<float>& a,
                            const std::vector<float>& b, const std::vector<float>& c0,
                            float alpha, float beta) {
  auto ad = on_device(dev, a), bd = on_device(dev, b), cd = on_device(dev, c0);
  dev.gemm(g.ta, g.tb, g.m, g.n, g.k, alpha, ad.data(), g.lda, bd.data(), g.ldb, beta, cd.data(),
           g.ldc);
  return cd.download();
}

void check_gemm(const GemmCase& g, std::uint64_t seed) {
  const bool at = g.ta == Transpose::yes, bt = g.tb == Transpose::yes;
  const auto a = random_floats(static_cast<std::size_t>(at ? g.k : g.m) * g.lda, seed);
  const auto b = random_floats(static_cast<std::size_t>(bt ? g.n : g.k) * g.ldb, seed + 1);
  const auto c0 = random_floats(static_cast<std::size_t>(g.m) * g.ldc, seed + 2);
  const float alpha = 0.75f, beta = -0.5f;
  std::vector<double> want(c0.begin(), c0.end());
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      double s = 0.0;
      for (int p = 0; p < g.k; ++p)
        s += double(at ? a[p * g.lda + i] : a[i * g.lda + p]) *
             double(bt ? b[j * g.ldb + p] : b[p * g.ldb + j]);
      want[i * g.ldc + j] = alpha * s + beta * double(c0[i * g.ldc + j]);
    }
  auto one = lockstep::make_cpu_device(0, 1), two = lockstep::make_cpu_device(1, 2);
  const auto c1 = run_gemm(*one, g, a, b, c0, alpha, beta);
  check_close(c1, want, 1e-4, 1e-4 * std::sqrt(double(g.k)));
  CHECK(same_bits(c1, run_gemm(*two, g, a, b, c0, alpha, beta)));
}

}  // namespace

TEST_SUITE("cpu device") {
  TEST_CASE("allocate returns zeroed, 64-byte aligned memory - copies round-trip") {
    auto dev = lockstep::make_cpu_device(3, 1);
    CHECK(dev->backend() == "cpu");
    CHECK(dev->label() == "cpu:3");
    for (std::size_t bytes : {1u, 63u, 4096u, 100001u}) {
      auto* p = static_cast<unsigned char*>(dev->allocate(bytes));
      CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
      bool zero = true;
      for (std::size_t i = 0; i < bytes; ++i) zero = zero && p[i] == 0;
      CHECK(zero);
      dev->deallocate(p);
    }
    const auto host = random_floats(1000, 1);
    auto a = on_device(*dev, host);
    DeviceArray<float> b(*dev, host.size());
    dev->copy(b.data(), a.data(), host.size() * sizeof(float));
    dev->synchronize();
    CHECK(same_bits(b.download(), host));
    CHECK_THROWS_AS(lockstep::make_cpu_device(0, 0), std::invalid_argument);
  }

  TEST_CASE("gemm matches a naive product for every transpose and odd shapes") {
    std::uint64_t seed = 10;
    for (Transpose ta : {Transpose::no, Transpose::yes})
      for (Transpose tb : {Transpose::no, Transpose::yes}) {
        CAPTURE(int(ta));
        CAPTURE(int(tb));
        const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
        for (auto [m, n, k] : {std::tuple{1, 1, 1}, {7, 5, 3}, {13, 17, 11}, {3, 1, 9}}) {
          // Leading dimensions wider than the matrices.
          check_gemm({ta, tb, m, n, k, (at ? m : k) + 2, (bt ? k : n) + 3, n + 1}, seed += 3);
        }
        // m * n * k > 2^20: row-blocked, with a partial last block.
        const int m = 300, n = 70, k = 90;
        check_gemm({ta, tb, m, n, k, at ? m : k, bt ? k : n, n}, seed += 3);
      }
  }

  TEST_CASE("gemm and gemm_batched with k = 0 give beta C, and beta = 0 never reads C") {
    auto dev = lockstep::make_cpu_device(0, 2);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const int m = 70, n = 9, ldc = n + 1, count = 3;
    const std::int64_t stride_c = std::int64_t(m) * ldc + 2;
    for (Transpose ta : {Transpose::no, Transpose::yes})
      for (Transpose tb : {Transpose::no, Transpose::yes}) {
        CAPTURE(int(ta));
        CAPTURE(int(tb));
        // count matrices (m, n) with leading dimension ldc; the padding column and the gaps
        // between matrices hold a marker that must survive.
        std::vector<float> c0 = random_floats(std::size_t(stride_c) * count, 5);
        const auto padding = [&](std::size_t i) {
          return i % std::size_t(stride_c) >= std::size_t(m) * ldc ||
                 i % std::size_t(stride_c) % ldc == std::size_t(n);
        };
        for (std::size_t i = 0; i < c0.size(); ++i)
          if (padding(i)) c0[i] = 7.0f;
        std::vector<float> nans(c0.size(), nan);
        for (std::size_t i = 0; i < c0.size(); ++i)
          if (padding(i)) nans[i] = 7.0f;
        const std::vector<float> a(1, nan), b(1, nan);  // k = 0: A and B are never read
        auto ad = on_device(*dev, a), bd = on_device(*dev, b);
        auto single = on_device(*dev, c0), batched = on_device(*dev, c0);
        auto zeroed = on_device(*dev, nans), zeroed_batched = on_device(*dev, nans);
        dev->gemm(ta, tb, m, n, 0, 0.75f, ad.data(), m, bd.data(), n, -0.5f, single.data(), ldc);
        dev->gemm(ta, tb, m, n, 0, 0.75f, ad.data(), m, bd.data(), n, 0.0f, zeroed.data(), ldc);
        dev->gemm_batched(ta, tb, m, n, 0, 0.75f, ad.data(), m, 0, bd.data(), n, 0, -0.5f,
                          batched.data(), ldc, stride_c, count);
        dev->gemm_batched(ta, tb, m, n, 0, 0.75f, ad.data(), m, 0, bd.data(), n, 0, 0.0f,
                          zeroed_batched.data(), ldc, stride_c, count);
        const auto got = single.download(), got_zero = zeroed.download();
        const auto got_batched = batched.download(), got_zero_batched = zeroed_batched.download();
        for (std::size_t i = 0; i < c0.size(); ++i) {
          CAPTURE(i);
          const bool first = i < std::size_t(stride_c);  // gemm writes the first matrix only
          const float scaled = padding(i) ? 7.0f : -0.5f * c0[i];  // exact: a power of two
          const float zero = padding(i) ? 7.0f : 0.0f;
          REQUIRE(got_batched[i] == scaled);
          REQUIRE(got_zero_batched[i] == zero);
          REQUIRE(got[i] == (first ? scaled : c0[i]));
          if (first) REQUIRE(got_zero[i] == zero);
        }
      }
  }

  TEST_CASE("add_bias and bias_grad") {
    auto dev = lockstep::make_cpu_device(0, 2);
    for (auto [rows, cols] : {std::pair{5, 7}, {300, 130}, {1, 1}}) {
      const auto y = random_floats(std::size_t(rows) * cols, 20);
      const auto bias = random_floats(cols, 21);
      std::vector<double> want(y.size());
      std::vector<double> dbias(bias.begin(), bias.end());
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          want[r * cols + c] = double(y[r * cols + c]) + bias[c];
          dbias[c] += y[r * cols + c];
        }
      auto yd = on_device(*dev, y), bd = on_device(*dev, bias);
      dev->add_bias(yd.data(), bd.data(), rows, cols);
      check_close(yd.download(), want, 1e-6, 1e-6);
      auto dyd = on_device(*dev, y);
      dev->bias_grad(bd.data(), dyd.data(), rows, cols);
      check_close(bd.download(), dbias, 1e-6, 1e-5);
    }
  }

  TEST_CASE("activations and their derivatives") {
    auto dev = lockstep::make_cpu_device(0, 2);
    const std::size_t n = 40000;  // several blocks
    const auto x = random_floats(n, 30, -4.0, 4.0), dy = random_floats(n, 31);
    const double c = std::sqrt(2.0 / 3.141592653589793), a = 0.044715;
    for (Activation f : {Activation::relu, Activation::tanh, Activation::gelu}) {
      CAPTURE(int(f));
      std::vector<double> y(n), dx(n);
      for (std::size_t i = 0; i < n; ++i) {
        const double v = x[i];
        double fv = 0.0, fp = 0.0;
        if (f == Activation::relu) {
          fv = v > 0 ? v : 0.0;
          fp = v > 0 ? 1.0 : 0.0;
        } else if (f == Activation::tanh) {
          fv = std::tanh(v);
          fp = 1.0 - fv * fv;
        } else {
          const double t = std::tanh(c * (v + a * v * v * v));
          fv = 0.5 * v * (1.0 + t);
          fp = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * a * v * v);
        }
        y[i] = fv;
        dx[i] = dy[i] * fp;
      }
      auto xd = on_device(*dev, x), dyd = on_device(*dev, dy);
      DeviceArray<float> yd(*dev, n), dxd(*dev, n);
      dev->activation_forward(f, xd.data(), yd.data(), n);
      dev->activation_backward(f, xd.data(), dyd.data(), dxd.data(), n);
      check_close(yd.download(), y, 1e-5, 1e-6);
      check_close(dxd.download(), dx, 1e-5, 1e-6);
    }
    // relu'(0) = 0
    auto zero = on_device(*dev, std::vector<float>{0.0f});
    auto one = on_device(*dev, std::vector<float>{1.0f});
    DeviceArray<float> out(*dev, 1);
    dev->activation_backward(Activation::relu, zero.data(), one.data(), out.data(), 1);
    CHECK(out.download()[0] == 0.0f);
  }

  TEST_CASE("softmax_cross_entropy: loss, correct count, dlogits, bad labels") {
    auto dev = lockstep::make_cpu_device(0, 2);
    const int rows = 37, classes = 6;
    auto logits = random_floats(std::size_t(rows) * classes, 40, -30.0, 30.0);
    logits[0] = logits[1] = 100.0f;  // a tie in row 0 (argmax 0) and a large logit
    std::vector<std::int32_t> labels(rows);
    std::uint64_t s = 41;
    for (auto& l : labels)
      l = static_cast<std::int32_t>(lockstep::detail::uniform_below(s, classes));
    labels[0] = 1;  // the second of two tied maxima: not correct
    const float scale = 0.25f;
    double loss = 0.0;
    std::int64_t correct = 0;
    std::vector<double> dlogits(logits.size());
    for (int r = 0; r < rows; ++r) {
      const float* z = &logits[r * classes];
      int arg = 0;
      for (int j = 1; j < classes; ++j)
        if (z[j] > z[arg]) arg = j;
      double sum = 0.0;
      for (int j = 0; j < classes; ++j) sum += std::exp(double(z[j]) - z[arg]);
      loss += std::log(sum) + z[arg] - z[labels[r]];
      correct += arg == labels[r];
      for (int j = 0; j < classes; ++j)
        dlogits[r * classes + j] =
            (std::exp(double(z[j]) - z[arg]) / sum - (j == labels[r])) * scale;
    }
    auto ld = on_device(*dev, logits);
    auto yd = on_device(*dev, labels);
    DeviceArray<float> dd(*dev, logits.size());
    const auto stats = dev->softmax_cross_entropy(ld.data(), yd.data(), rows, classes, dd.data(),
                                                  scale);
    CHECK(stats.loss_sum == doctest::Approx(loss).epsilon(1e-12));
    CHECK(stats.correct == correct);
    check_close(dd.download(), dlogits, 1e-5, 1e-7);
    const auto no_grad =
        dev->softmax_cross_entropy(ld.data(), yd.data(), rows, classes, nullptr, 0.0f);
    CHECK(no_grad.loss_sum == stats.loss_sum);

    // On the device: calls add to one LossStats; a bad label adds nothing and records its row.
    DeviceArray<lockstep::LossStats> acc(*dev, 1);
    dev->softmax_cross_entropy(ld.data(), yd.data(), rows, classes, static_cast<float*>(nullptr),
                               0.0f, acc.data());
    dev->softmax_cross_entropy(ld.data(), yd.data(), rows, classes, static_cast<float*>(nullptr),
                               0.0f, acc.data());
    CHECK(acc.download()[0].loss_sum == stats.loss_sum + stats.loss_sum);
    CHECK(acc.download()[0].correct == 2 * correct);
    CHECK(acc.download()[0].label_error == 0);
    for (std::int32_t bad : {-2, classes}) {  // -1 is kIgnoreLabel: a row that does not count
      labels[5] = bad;
      labels[9] = bad;
      yd.upload(labels);
      CHECK_THROWS_WITH_AS(
          dev->softmax_cross_entropy(ld.data(), yd.data(), rows, classes, nullptr, 1),
          doctest::Contains(fmt::format("label {} of row 5 is outside", bad).c_str()),
          lockstep::InputError);
      DeviceArray<lockstep::LossStats> one(*dev, 1);
      dev->softmax_cross_entropy(ld.data(), yd.data(), rows, classes, static_cast<float*>(nullptr),
                                 0.0f, one.data());
      const lockstep::LossStats got = one.download()[0];
      CHECK(got.loss_sum == 0.0);
      CHECK(got.correct == 0);
      CHECK(lockstep::detail::label_error_row(got.label_error) == 5);
      CHECK(lockstep::detail::label_error_label(got.label_error) == bad);
      labels[9] = 0;
    }
  }

  TEST_CASE("fill, scale, sum_squares") {
    auto dev = lockstep::make_cpu_device(0, 2);
    const std::size_t n = 50001;
    const auto x = random_floats(n, 50);
    auto xd = on_device(*dev, x);
    double want = 0.0;
    for (float v : x) want += double(v) * v;
    CHECK(dev->sum_squares(xd.data(), n) == doctest::Approx(want).epsilon(1e-12));
    dev->scale(xd.data(), -2.0f, n);
    std::vector<double> scaled(x.begin(), x.end());
    for (double& v : scaled) v *= -2.0;
    check_close(xd.download(), scaled, 0.0, 0.0);
    dev->fill(xd.data(), 1.5f, n);
    CHECK(dev->sum_squares(xd.data(), n) == 2.25 * n);
  }

  TEST_CASE("sum_squares_grains: one sum per grain, the same from any grain-aligned start") {
    auto dev = lockstep::make_cpu_device(0, 2);
    // x[i] = i % 4: a grain of 8 holds 0 1 2 3 0 1 2 3, whose squares sum to 28.
    const std::size_t n = 8 * 5 + 3, grain = 8;
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 4);
    auto xd = on_device(*dev, x);
    DeviceArray<double> sums(*dev, 6);
    dev->sum_squares_grains(xd.data(), n, grain, sums.data());
    CHECK(sums.download() == std::vector<double>{28, 28, 28, 28, 28, 0 + 1 + 4});
    // Random values: each grain is the sum in eight lanes (element i of the grain into lane
    // i % 8, the lanes added pairwise; Note [Eight lanes for the gradient norm]), whether the
    // call starts at 0 or at a later grain.
    const std::size_t m = 3 * 16384 + 77;
    const auto r = random_floats(m, 51);
    auto rd = on_device(*dev, r);
    DeviceArray<double> all_d(*dev, 4), tail_d(*dev, 2);
    dev->sum_squares_grains(rd.data(), m, 16384, all_d.data());
    dev->sum_squares_grains(rd.data() + 2 * 16384, m - 2 * 16384, 16384, tail_d.data());
    const std::vector<double> all = all_d.download(), tail = tail_d.download();
    for (std::size_t g = 0; g < 4; ++g) {
      double lane[8] = {};
      for (std::size_t i = g * 16384; i < std::min(m, (g + 1) * 16384); ++i)
        lane[(i - g * 16384) % 8] += double(r[i]) * double(r[i]);
      const double want = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                          ((lane[4] + lane[5]) + (lane[6] + lane[7]));
      CHECK(std::memcmp(&all[g], &want, sizeof(double)) == 0);
    }
    CHECK(std::memcmp(&tail[0], &all[2], 2 * sizeof(double)) == 0);
    CHECK_THROWS_AS(dev->sum_squares_grains(rd.data(), m, 0, all_d.data()), std::invalid_argument);
  }

  TEST_CASE("step_control: the norm of the grain sums in order, the clip factor, the skip flag") {
    auto dev = lockstep::make_cpu_device(0, 2);
    using lockstep::StepControl;
    DeviceArray<StepControl> control(*dev, 1);
    // Squares summing to 25: norm 5.
    auto grains = on_device(*dev, std::vector<double>{9.0, 16.0, 0.0});
    dev->step_control(grains.data(), 3, 0.0, control.data());  // no clipping
    StepControl c = control.download()[0];
    CHECK(c.grad_norm == 5.0);
    CHECK(c.clip_scale == 1.0f);
    CHECK(c.skip == 0);
    dev->step_control(grains.data(), 3, 2.0, control.data());
    c = control.download()[0];
    CHECK(c.clip_scale == static_cast<float>(2.0 / (5.0 + 1e-6)));
    dev->step_control(grains.data(), 3, 5.0, control.data());  // at the limit: not clipped
    CHECK(control.download()[0].clip_scale == 1.0f);
    for (double bad : {std::nan(""), double(INFINITY)}) {
      auto nonfinite = on_device(*dev, std::vector<double>{1.0, bad});
      dev->step_control(nonfinite.data(), 2, 1.0, control.data());
      CHECK(control.download()[0].skip == 1);
    }
  }

  TEST_CASE("sgd_step and adamw_step read the clip factor and the skip flag") {
    auto dev = lockstep::make_cpu_device(0, 2);
    const std::size_t n = 3000;
    const auto p0 = random_floats(n, 95), g = random_floats(n, 96);
    std::vector<float> half(g);
    for (float& x : half) x *= 0.5f;
    auto gd = on_device(*dev, g), halfd = on_device(*dev, half);
    DeviceArray<lockstep::StepControl> clip(*dev, 1), skip(*dev, 1);
    clip.upload(std::vector{lockstep::StepControl{.grad_norm = 1.0, .clip_scale = 0.5f}});
    skip.upload(std::vector{lockstep::StepControl{.grad_norm = NAN, .skip = 1}});
    const lockstep::SgdParams sgd{0.9f, 0.01f, true};
    const lockstep::AdamWParams adamw{0.9f, 0.99f, 1e-8f, 0.1f};
    // (scaled by the control, plain update of the halved gradient, skipped)
    auto run = [&](auto&& step) {
      auto a = on_device(*dev, p0), b = on_device(*dev, p0), c = on_device(*dev, p0);
      DeviceArray<float> sa(*dev, 2 * n), sb(*dev, 2 * n), sc(*dev, 2 * n);
      step(a.data(), gd.data(), sa.data(), clip.data());
      step(b.data(), halfd.data(), sb.data(), nullptr);
      step(c.data(), gd.data(), sc.data(), skip.data());
      CHECK(a.download() == b.download());
      CHECK(sa.download() == sb.download());
      CHECK(c.download() == p0);
      CHECK(sc.download() == std::vector<float>(2 * n, 0.0f));
    };
    run([&](float* p, const float* grad, float* state, const lockstep::StepControl* ctl) {
      dev->sgd_step(sgd, 0.1f, p, grad, state, n, ctl, nullptr);
    });
    run([&](float* p, const float* grad, float* state, const lockstep::StepControl* ctl) {
      dev->adamw_step(adamw, 0.01f, 1, p, grad, state, state + n, n, ctl, nullptr);
    });
  }

  TEST_CASE("sgd_step and adamw_step with params_bf16: to_bf16 of the updated parameters") {
    auto dev = lockstep::make_cpu_device(0, 2);
    using lockstep::StepControl;
    const std::size_t n = 70001;  // many blocks, a partial last one
    const auto p0 = random_floats(n, 110), g0 = random_floats(n, 111);
    auto gd = on_device(*dev, g0);
    DeviceArray<StepControl> clip(*dev, 1), skip(*dev, 1);
    clip.upload(std::vector{StepControl{.grad_norm = 1.0, .clip_scale = 0.37f}});
    skip.upload(std::vector{StepControl{.grad_norm = NAN, .skip = 1}});
    constexpr std::uint16_t kMarker = 0x1234;  // what a skipped step leaves in the copy
    // step(t, params, state (2n), control, copy) for t = 1..3, once with the copy and once
    // without: the parameters and the state must not differ, and the copy must be to_bf16 of
    // the parameters after the last step (untouched when every step is skipped).
    const auto run = [&](auto&& step) {
      StepControl* const none = nullptr;
      for (const StepControl* control : {none, clip.data(), skip.data()}) {
        CAPTURE(control == skip.data());
        auto with = on_device(*dev, p0), without = on_device(*dev, p0);
        DeviceArray<float> state_with(*dev, 2 * n), state_without(*dev, 2 * n);
        auto copy = on_device(*dev, std::vector<std::uint16_t>(n, kMarker));
        for (int t = 1; t <= 3; ++t) {
          step(t, with.data(), state_with.data(), control, copy.data());
          step(t, without.data(), state_without.data(), control, nullptr);
        }
        CHECK(same_bits(with.download(), without.download()));
        CHECK(same_bits(state_with.download(), state_without.download()));
        DeviceArray<std::uint16_t> want(*dev, n);
        dev->to_bf16(with.data(), want.data(), n);
        CHECK(copy.download() == (control == skip.data()
                                      ? std::vector<std::uint16_t>(n, kMarker)
                                      : want.download()));
        if (control == skip.data()) CHECK(with.download() == p0);
      }
    };
    for (const lockstep::SgdParams opt : {lockstep::SgdParams{0.0f, 0.0f, false},
                                          {0.9f, 0.0f, false}, {0.9f, 0.01f, true}}) {
      CAPTURE(opt.momentum);
      CAPTURE(opt.nesterov);
      run([&](int, float* p, float* state, const StepControl* ctl, std::uint16_t* copy) {
        dev->sgd_step(opt, 0.1f, p, gd.data(), opt.momentum != 0.0f ? state : nullptr, n, ctl,
                      copy);
      });
    }
    const lockstep::AdamWParams adamw{0.9f, 0.99f, 1e-8f, 0.1f};
    run([&](int t, float* p, float* state, const StepControl* ctl, std::uint16_t* copy) {
      dev->adamw_step(adamw, 0.01f, t, p, gd.data(), state, state + n, n, ctl, copy);
    });
  }

  TEST_CASE("reductions are bit-identical for 1 and 2 threads") {
    auto one = lockstep::make_cpu_device(0, 1), two = lockstep::make_cpu_device(1, 2);
    const int rows = 700, cols = 333;  // many row and column blocks
    const auto x = random_floats(std::size_t(rows) * cols, 60);
    const auto b0 = random_floats(cols, 61);
    std::vector<float> grads[2];
    double squares[2];
    std::uint64_t hashes[2];
    Device* devs[2] = {one.get(), two.get()};
    for (int d = 0; d < 2; ++d) {
      auto xd = on_device(*devs[d], x), bd = on_device(*devs[d], b0);
      devs[d]->bias_grad(bd.data(), xd.data(), rows, cols);
      grads[d] = bd.download();
      squares[d] = devs[d]->sum_squares(xd.data(), x.size());
      hashes[d] = devs[d]->hash(xd.data(), x.size());
    }
    CHECK(same_bits(grads[0], grads[1]));
    CHECK(std::memcmp(&squares[0], &squares[1], sizeof(double)) == 0);
    CHECK(hashes[0] == hashes[1]);
  }

  TEST_CASE("hash: the documented formula - equal buffers equal, any change differs") {
    auto dev = lockstep::make_cpu_device(0, 2);
    const std::size_t n = 40000;
    auto x = random_floats(n, 70);
    std::uint64_t want = n;
    for (std::size_t i = 0; i < n; ++i)
      want += lockstep::detail::mix64(std::uint64_t{std::bit_cast<std::uint32_t>(x[i])} ^
                                      lockstep::detail::mix64(i));
    auto a = on_device(*dev, x), b = on_device(*dev, x);
    const std::uint64_t h = dev->hash(a.data(), n);
    CHECK(h == want);
    CHECK(dev->hash(b.data(), n) == h);
    CHECK(dev->hash(a.data(), n - 1) != h);

    auto flipped = x;
    flipped[12345] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(flipped[12345]) ^ 1u);
    b.upload(flipped);
    CHECK(dev->hash(b.data(), n) != h);

    auto permuted = x;
    std::swap(permuted[3], permuted[30000]);
    b.upload(permuted);
    CHECK(dev->hash(b.data(), n) != h);
  }

  TEST_CASE("sgd_step matches PyTorch semantics over 3 steps") {
    auto dev = lockstep::make_cpu_device(0, 2);
    const std::size_t n = 20000;
    const float lr = 0.1f;
    for (const lockstep::SgdParams opt : {lockstep::SgdParams{0.0f, 0.0f, false},
                                          {0.9f, 0.0f, false}, {0.9f, 0.01f, true},
                                          {0.0f, 0.05f, false}}) {
      const float momentum = opt.momentum, wd = opt.weight_decay;
      const bool nesterov = opt.nesterov;
      CAPTURE(momentum);
      CAPTURE(nesterov);
      const auto p0 = random_floats(n, 80);
      std::vector<double> p(p0.begin(), p0.end()), buf(n, 0.0);
      auto pd = on_device(*dev, p0);
      DeviceArray<float> bufd(*dev, n);
      for (int step = 0; step < 3; ++step) {
        const auto g = random_floats(n, 81 + step);
        for (std::size_t i = 0; i < n; ++i) {
          double gi = g[i] + double(wd) * p[i];
          if (momentum != 0.0f) {
            buf[i] = momentum * buf[i] + gi;
            gi = nesterov ? gi + momentum * buf[i] : buf[i];
          }
          p[i] -= lr * gi;
        }
        auto gd = on_device(*dev, g);
        dev->sgd_step(opt, lr, pd.data(), gd.data(), momentum != 0.0f ? bufd.data() : nullptr, n,
                      nullptr, nullptr);
      }
      check_close(pd.download(), p, 1e-5, 1e-6);
    }
  }

  TEST_CASE("adamw_step matches PyTorch semantics over 3 steps") {
    auto dev = lockstep::make_cpu_device(0, 2);
    const std::size_t n = 20000;
    const lockstep::AdamWParams opt{0.9f, 0.99f, 1e-8f, 0.1f};
    const float lr = 0.01f;
    const auto p0 = random_floats(n, 90);
    std::vector<double> p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
    auto pd = on_device(*dev, p0);
    DeviceArray<float> md(*dev, n), vd(*dev, n);
    for (int t = 1; t <= 3; ++t) {
      const auto g = random_floats(n, 91 + t);
      const double b1 = opt.beta1, b2 = opt.beta2;
      for (std::size_t i = 0; i < n; ++i) {
        p[i] *= 1.0 - double(lr) * opt.weight_decay;
        m[i] = b1 * m[i] + (1.0 - b1) * g[i];
        v[i] = b2 * v[i] + (1.0 - b2) * double(g[i]) * g[i];
        const double denom =
            std::sqrt(v[i]) / std::sqrt(1.0 - std::pow(b2, t)) + double(opt.eps);
        p[i] -= lr / (1.0 - std::pow(b1, t)) * m[i] / denom;
      }
      auto gd = on_device(*dev, g);
      dev->adamw_step(opt, lr, t, pd.data(), gd.data(), md.data(), vd.data(), n, nullptr,
                      nullptr);
    }
    check_close(pd.download(), p, 1e-5, 1e-6);
    check_close(md.download(), m, 1e-5, 1e-7);
    check_close(vd.download(), v, 1e-5, 1e-8);
  }
}
