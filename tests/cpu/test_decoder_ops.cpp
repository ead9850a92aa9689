// The CPU device's kernels for a Llama-family decoder's new parts: RMSNorm with its residual add
// (Note [RMSNorm] in src/cpu/ops/layernorm.cpp), rotary embeddings in place on q and k (Note
// [RoPE] in src/cpu/ops/rope.cpp) and SwiGLU (Note [SwiGLU] in src/cpu/ops/elementwise.cpp).
// Each forward against a double-precision reference written from the formula; each backward
// against central differences of its forward; the fused forms bit for bit the ops they fuse;
// the bf16 overloads bit for bit the fp32 op between from_bf16 and to_bf16 passes. Shapes run
// past one block of the arena (kGrain).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../model/gradcheck.hpp"
#include "../random_data.hpp"
#include "device_passes.hpp"
#include "lockstep/device.hpp"

using namespace lockstep;
using lockstep::test::central_difference;
using lockstep::test::mismatch;
using lockstep::test::on_device;
using lockstep::test::random_floats;
using lockstep::test::require_same_floats;
using lockstep::test::rounded;
using lockstep::test::widened;

namespace {

// Every |got - want| within rel * (|want| + largest |want| of its row of `row`).
void check_near(const std::vector<float>& got, const std::vector<double>& want, double rel,
                std::size_t row) {
  REQUIRE(got.size() == want.size());
  for (std::size_t r0 = 0; r0 < want.size(); r0 += row) {
    double largest = 0.0;
    for (std::size_t i = r0; i < r0 + row; ++i) largest = std::max(largest, std::abs(want[i]));
    for (std::size_t i = r0; i < r0 + row; ++i)
      if (!(std::abs(got[i] - want[i]) <= rel * (std::abs(want[i]) + largest))) {
        FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
        return;
      }
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------------

struct RmsOut {
  std::vector<float> sum, y, rstd;
};

// residual_rmsnorm_forward of a (+ b when not empty), the sum into a fresh buffer.
RmsOut rmsnorm(Device& dev, const std::vector<float>& a, const std::vector<float>& b,
               const std::vector<float>& w, int rows, int C, float eps) {
  const std::size_t n = a.size();
  auto ad = on_device(dev, a), bd = on_device(dev, b), wd = on_device(dev, w);
  DeviceArray<float> sum(dev, n), y(dev, n), rstd(dev, std::size_t(rows));
  dev.residual_rmsnorm_forward(ad.data(), b.empty() ? nullptr : bd.data(), sum.data(), wd.data(),
                               y.data(), rstd.data(), rows, C, eps);
  return {sum.download(), y.download(), rstd.download()};
}

// ---- RoPE -------------------------------------------------------------------------------------

// A table of `positions` rows of D/2 random angles' cos and sin (each pair on the unit circle
// to float rounding): the ops read any table; model/rope.hpp's is tested in tests/model.
struct Table {
  std::vector<float> cos, sin;
  int positions;
};
Table random_table(int positions, int half, std::uint64_t seed) {
  const auto angles = random_floats(std::size_t(positions) * half, seed, -4.0, 4.0);
  Table t{{}, {}, positions};
  for (float a : angles) {
    t.cos.push_back(static_cast<float>(std::cos(double(a))));
    t.sin.push_back(static_cast<float>(std::sin(double(a))));
  }
  return t;
}

// The table on a device, as RopeTable of `positions` rows.
struct TableOn {
  DeviceArray<float> cos, sin;
  int positions;
  TableOn(Device& dev, const Table& t)
      : cos(on_device(dev, t.cos)), sin(on_device(dev, t.sin)), positions(t.positions) {}
  RopeTable view() const { return {cos.data(), sin.data(), positions}; }
};

std::size_t qkv_size(const RopeShape& s) {
  return std::size_t(s.batch) * s.T * (s.heads + 2 * s.kv_heads) * s.head_size;
}

// rope_forward of x (fp32) on the CPU device.
std::vector<float> rotated(Device& dev, const RopeShape& s, const Table& t,
                           const std::vector<float>& x) {
  TableOn table(dev, t);
  auto xd = on_device(dev, x);
  dev.rope_forward(s, table.view(), xd.data());
  return xd.download();
}

// ---- SwiGLU -----------------------------------------------------------------------------------

double silu(double x) { return x / (1.0 + std::exp(-x)); }

}  // namespace

TEST_SUITE("decoder ops") {
  // y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps), in double; a zero row gives y = 0
  // and rstd = 1 / sqrt(eps), so eps is read.
  TEST_CASE("rmsnorm forward matches its formula in double, eps included") {
    auto dev = make_cpu_device(0, 2);
    for (auto [rows, C] : {std::pair{1, 1}, {7, 31}, {600, 128}}) {
      for (const float eps : {1e-6f, 1e-5f, 0.5f}) {
        CAPTURE(rows);
        CAPTURE(C);
        CAPTURE(eps);
        const std::size_t n = std::size_t(rows) * C;
        std::vector<float> x = random_floats(n, 11 + n, -2.0, 3.0);
        std::fill(x.begin(), x.begin() + C, 0.0f);  // row 0: all zeros
        const auto w = random_floats(std::size_t(C), 12 + n, 0.5, 1.5);
        const RmsOut got = rmsnorm(*dev, x, {}, w, rows, C, eps);
        std::vector<double> y(n), rstd(static_cast<std::size_t>(rows));
        for (int r = 0; r < rows; ++r) {
          double squares = 0.0;
          for (int c = 0; c < C; ++c) squares += double(x[r * C + c]) * x[r * C + c];
          rstd[r] = 1.0 / std::sqrt(squares / C + double(eps));
          for (int c = 0; c < C; ++c) y[r * C + c] = x[r * C + c] * rstd[r] * w[c];
        }
        check_near(got.y, y, 4e-7, std::size_t(C));
        check_near(got.rstd, rstd, 1e-7, 1);
      }
    }
  }

  TEST_CASE("residual rmsnorm forward is add, then rmsnorm of the sum, bit for bit, and in bf16 "
            "the fp32 y rounded") {
    auto dev = make_cpu_device(0, 2);
    for (auto [rows, C] : {std::pair{1, 1}, {7, 31}, {600, 128}}) {
      CAPTURE(rows);
      CAPTURE(C);
      const std::size_t n = std::size_t(rows) * C;
      const auto a = random_floats(n, 21 + n, -2.0, 3.0), b = random_floats(n, 22 + n);
      const auto w = random_floats(std::size_t(C), 23 + n);
      std::vector<float> sum(n);
      for (std::size_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
      const RmsOut want = rmsnorm(*dev, sum, {}, w, rows, C, 1e-5f);
      const RmsOut fused = rmsnorm(*dev, a, b, w, rows, C, 1e-5f);
      require_same_floats(fused.sum, sum);
      require_same_floats(fused.y, want.y);
      require_same_floats(fused.rstd, want.rstd);
      // In place over either addend, into bf16.
      for (const bool over_a : {true, false}) {
        CAPTURE(over_a);
        auto ad = on_device(*dev, a), bd = on_device(*dev, b), wd = on_device(*dev, w);
        auto y32 = on_device(*dev, want.y);
        DeviceArray<std::uint16_t> y16(*dev, n);
        DeviceArray<float> rstd(*dev, std::size_t(rows));
        float* into = over_a ? ad.data() : bd.data();
        dev->residual_rmsnorm_forward(ad.data(), bd.data(), into, wd.data(), y16.data(),
                                      rstd.data(), rows, C, 1e-5f);
        std::vector<float> got_sum(n);
        dev->copy_to_host(got_sum.data(), into, n * sizeof(float));
        require_same_floats(got_sum, sum);
        CHECK(y16.download() == rounded(*dev, y32));
        require_same_floats(rstd.download(), want.rstd);
      }
    }
  }

  // dresidual beside dx, under it, or null; dx_bf16 the rounding of dx; dweight accumulated.
  TEST_CASE("residual rmsnorm backward is a copy of dresidual, then += the norm's gradient, "
            "bit for bit, and rounds dx as to_bf16 does") {
    auto dev = make_cpu_device(0, 2);
    for (auto [rows, C] : {std::pair{1, 1}, {7, 31}, {600, 128}}) {
      CAPTURE(rows);
      CAPTURE(C);
      const std::size_t n = std::size_t(rows) * C, nc = std::size_t(C);
      const auto x = random_floats(n, 31 + n, -2.0, 3.0), w = random_floats(nc, 32 + n);
      const auto dy = random_floats(n, 33 + n), dres = random_floats(n, 34 + n);
      const auto dw0 = random_floats(nc, 35 + n);
      const RmsOut fwd = rmsnorm(*dev, x, {}, w, rows, C, 1e-6f);
      auto xd = on_device(*dev, x), wd = on_device(*dev, w), dyd = on_device(*dev, dy);
      auto rstd = on_device(*dev, fwd.rstd);
      // Without a residual: the norm's gradient alone.
      DeviceArray<float> alone(*dev, n);
      auto dw = on_device(*dev, dw0);
      dev->residual_rmsnorm_backward(xd.data(), wd.data(), rstd.data(), dyd.data(), nullptr,
                                     alone.data(), nullptr, dw.data(), rows, C);
      const std::vector<float> term = alone.download(), dw1 = dw.download();
      std::vector<float> want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = dres[i] + term[i];
      // Beside, rounded too; and in place.
      auto dresd = on_device(*dev, dres), dw2 = on_device(*dev, dw0);
      DeviceArray<float> dx(*dev, n);
      DeviceArray<std::uint16_t> dx16(*dev, n);
      dev->residual_rmsnorm_backward(xd.data(), wd.data(), rstd.data(), dyd.data(), dresd.data(),
                                     dx.data(), dx16.data(), dw2.data(), rows, C);
      require_same_floats(dx.download(), want);
      CHECK(dx16.download() == rounded(*dev, dx));
      require_same_floats(dresd.download(), dres);  // left alone
      require_same_floats(dw2.download(), dw1);
      dev->residual_rmsnorm_backward(xd.data(), wd.data(), rstd.data(), dyd.data(), dresd.data(),
                                     dresd.data(), nullptr, dw2.data(), rows, C);
      require_same_floats(dresd.download(), want);
      // dweight += its gradient each time: twice from dw0 is dw0 + 2 g, g = dw1 - dw0.
      const std::vector<float> twice = dw2.download();
      for (std::size_t c = 0; c < nc; ++c)
        CHECK(twice[c] == doctest::Approx(dw0[c] + 2 * (dw1[c] - dw0[c])).epsilon(1e-5));
    }
  }

  // J = sum(y * R) + sum(s * S) with s = a + b and y = RMSNorm(s): dJ/da = dJ/db = S + the
  // norm's input gradient from R, which backward writes with dresidual = S.
  TEST_CASE("residual rmsnorm backward matches finite differences: both addends and the "
            "weight") {
    auto dev = make_cpu_device(0, 1);
    const int rows = 3, C = 5;
    const std::size_t n = std::size_t(rows) * C;
    std::vector<float> a = random_floats(n, 41, -2.0, 2.0), b = random_floats(n, 42);
    std::vector<float> w = random_floats(C, 43, 0.5, 1.5);
    const std::vector<float> r = random_floats(n, 44), s = random_floats(n, 45);
    const auto objective = [&] {
      const RmsOut o = rmsnorm(*dev, a, b, w, rows, C, 1e-5f);
      double j = 0.0;
      for (std::size_t i = 0; i < n; ++i) j += double(o.y[i]) * r[i] + double(o.sum[i]) * s[i];
      return j;
    };
    const RmsOut fwd = rmsnorm(*dev, a, b, w, rows, C, 1e-5f);
    auto sum = on_device(*dev, fwd.sum), wd = on_device(*dev, w), rstd = on_device(*dev, fwd.rstd);
    auto rd = on_device(*dev, r), sd = on_device(*dev, s);
    DeviceArray<float> dx(*dev, n), dw(*dev, C);
    dev->residual_rmsnorm_backward(sum.data(), wd.data(), rstd.data(), rd.data(), sd.data(),
                                   dx.data(), nullptr, dw.data(), rows, C);
    for (auto [v, analytic] : {std::pair{&a, dx.download()}, {&b, dx.download()},
                               {&w, dw.download()}}) {
      std::vector<double> fd;
      for (std::size_t i = 0; i < v->size(); ++i)
        fd.push_back(central_difference(*v, i, objective));
      const std::string miss = mismatch(fd, analytic);
      CHECK_MESSAGE(miss.empty(), miss);
    }
  }

  // Two sequences of 5 positions from `position` 3, GQA's layout (4 q heads, 2 kv heads):
  // against the rotate-half formula in double on the table's values; v left alone, bit for bit.
  TEST_CASE("rope forward rotates q and k by rotate-half at each row's position and leaves v") {
    auto dev = make_cpu_device(0, 2);
    for (const RopeShape s : {RopeShape{2, 5, 4, 2, 8, 3}, RopeShape{1, 1, 1, 1, 2, 0},
                              RopeShape{3, 300, 6, 6, 64, 0}}) {
      CAPTURE(s.T);
      CAPTURE(s.head_size);
      const Table t = random_table(s.position + s.T, s.head_size / 2, 51);
      const auto x = random_floats(qkv_size(s), 52);
      const std::vector<float> got = rotated(*dev, s, t, x);
      const int width = (s.heads + 2 * s.kv_heads) * s.head_size, half = s.head_size / 2;
      std::vector<double> want(x.begin(), x.end());
      for (int row = 0; row < s.batch * s.T; ++row) {
        const int p = s.position + row % s.T;
        for (int h = 0; h < s.heads + s.kv_heads; ++h)
          for (int i = 0; i < half; ++i) {
            const std::size_t lo = std::size_t(row) * width + h * s.head_size + i, hi = lo + half;
            const double c = t.cos[p * half + i], sn = t.sin[p * half + i];
            want[lo] = x[lo] * c - x[hi] * sn;
            want[hi] = x[hi] * c + x[lo] * sn;
          }
        const std::size_t v = std::size_t(row) * width + (s.heads + s.kv_heads) * s.head_size;
        CHECK(std::memcmp(&got[v], &x[v], s.kv_heads * s.head_size * sizeof(float)) == 0);
      }
      check_near(got, want, 2e-7, std::size_t(s.head_size));
    }
  }

  // Rows at positions 3.. of a run from 0 are the same bits as a run from position 3: what a
  // key/value cache relies on when it rotates one new position at a time.
  TEST_CASE("rope forward with a position offset is the tail of a run from 0, bit for bit") {
    auto dev = make_cpu_device(0, 1);
    const RopeShape whole{1, 9, 2, 1, 16, 0}, tail{1, 6, 2, 1, 16, 3};
    const Table t = random_table(9, 8, 61);
    const auto x = random_floats(qkv_size(whole), 62);
    const std::size_t skip = qkv_size(whole) - qkv_size(tail);
    const std::vector<float> all = rotated(*dev, whole, t, x);
    const std::vector<float> part = rotated(*dev, tail, t, {x.begin() + skip, x.end()});
    require_same_floats(part, {all.begin() + skip, all.end()});
  }

  // J = sum(rope(qkv) * R): dJ/dqkv is rope_backward of R, v's gradient R itself.
  TEST_CASE("rope backward matches finite differences of the forward") {
    auto dev = make_cpu_device(0, 1);
    const RopeShape s{2, 3, 2, 1, 4, 1};
    const Table t = random_table(4, 2, 71);
    std::vector<float> x = random_floats(qkv_size(s), 72);
    const std::vector<float> r = random_floats(x.size(), 73);
    const auto objective = [&] {
      const std::vector<float> y = rotated(*dev, s, t, x);
      double j = 0.0;
      for (std::size_t i = 0; i < y.size(); ++i) j += double(y[i]) * r[i];
      return j;
    };
    TableOn table(*dev, t);
    auto dqkv = on_device(*dev, r);
    dev->rope_backward(s, table.view(), dqkv.data(), nullptr);
    std::vector<double> fd;
    for (std::size_t i = 0; i < x.size(); ++i) fd.push_back(central_difference(x, i, objective));
    const std::string miss = mismatch(fd, dqkv.download());
    CHECK_MESSAGE(miss.empty(), miss);
  }

  TEST_CASE("rope in bf16: forward is from_bf16, the fp32 rotation, to_bf16, and backward's "
            "dqkv_bf16 is to_bf16 of its dqkv, v included") {
    auto dev = make_cpu_device(0, 2);
    const RopeShape s{4, 200, 4, 2, 64, 0};
    const Table t = random_table(200, 32, 81);
    TableOn table(*dev, t);
    const std::size_t n = qkv_size(s);
    auto x = on_device(*dev, random_floats(n, 82, -3.0, 3.0));
    DeviceArray<std::uint16_t> q16(*dev, n);
    dev->to_bf16(x.data(), q16.data(), n);
    DeviceArray<float> wide = widened(*dev, q16);
    dev->rope_forward(s, table.view(), q16.data());
    dev->rope_forward(s, table.view(), wide.data());
    CHECK(q16.download() == rounded(*dev, wide));
    const auto dy = random_floats(n, 83);
    auto d = on_device(*dev, dy), plain = on_device(*dev, dy);
    DeviceArray<std::uint16_t> d16(*dev, n);
    dev->rope_backward(s, table.view(), d.data(), d16.data());
    dev->rope_backward(s, table.view(), plain.data(), nullptr);
    require_same_floats(d.download(), plain.download());
    CHECK(d16.download() == rounded(*dev, d));
  }

  TEST_CASE("rope refuses an odd head size, no heads and a table too short") {
    auto dev = make_cpu_device(0, 1);
    const Table t = random_table(4, 2, 91);
    TableOn table(*dev, t);
    DeviceArray<float> x(*dev, 64);
    const RopeTable view = table.view();
    CHECK_THROWS_AS(dev->rope_forward({1, 2, 1, 1, 3, 0}, view, x.data()), std::invalid_argument);
    CHECK_THROWS_AS(dev->rope_forward({1, 2, 1, 0, 4, 0}, view, x.data()), std::invalid_argument);
    CHECK_THROWS_AS(dev->rope_forward({1, 4, 1, 1, 4, 1}, view, x.data()), std::invalid_argument);
    CHECK_THROWS_AS(dev->rope_backward({1, 5, 1, 1, 4, 0}, view, x.data(), nullptr),
                    std::invalid_argument);
    dev->rope_forward({1, 3, 1, 1, 4, 1}, view, x.data());  // positions 1..3 of 4: fine
  }

  TEST_CASE("swiglu forward is silu(gate) * up, gate and up side by side, against double") {
    auto dev = make_cpu_device(0, 2);
    for (auto [rows, F] : {std::pair{1, 1}, {7, 33}, {300, 96}}) {
      CAPTURE(rows);
      CAPTURE(F);
      const std::size_t n = std::size_t(rows) * F;
      const auto h = random_floats(2 * n, 101 + n, -12.0, 12.0);
      auto hd = on_device(*dev, h);
      DeviceArray<float> y(*dev, n);
      dev->swiglu_forward(hd.data(), y.data(), rows, F);
      std::vector<double> want(n);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < F; ++c)
          want[r * F + c] = silu(h[2 * r * F + c]) * h[2 * r * F + F + c];
      check_near(y.download(), want, 4e-7, 1);
    }
  }

  // J = sum(y * R): dh against central differences of every gate and up element.
  TEST_CASE("swiglu backward matches finite differences of the forward") {
    auto dev = make_cpu_device(0, 1);
    const int rows = 3, F = 5;
    const std::size_t n = std::size_t(rows) * F;
    std::vector<float> h = random_floats(2 * n, 111, -4.0, 4.0);
    const std::vector<float> r = random_floats(n, 112);
    const auto objective = [&] {
      auto hd = on_device(*dev, h);
      DeviceArray<float> y(*dev, n);
      dev->swiglu_forward(hd.data(), y.data(), rows, F);
      const std::vector<float> out = y.download();
      double j = 0.0;
      for (std::size_t i = 0; i < n; ++i) j += double(out[i]) * r[i];
      return j;
    };
    auto hd = on_device(*dev, h), rd = on_device(*dev, r);
    DeviceArray<float> dh(*dev, 2 * n);
    dev->swiglu_backward(hd.data(), rd.data(), dh.data(), rows, F);
    std::vector<double> fd;
    for (std::size_t i = 0; i < h.size(); ++i) fd.push_back(central_difference(h, i, objective));
    const std::string miss = mismatch(fd, dh.download());
    CHECK_MESSAGE(miss.empty(), miss);
  }

  TEST_CASE("swiglu in bf16: forward and backward are the fp32 ops on the widened h, y and "
            "dh_bf16 rounded as to_bf16 rounds") {
    auto dev = make_cpu_device(0, 2);
    for (auto [rows, F] : {std::pair{3, 5}, {300, 96}}) {
      CAPTURE(rows);
      CAPTURE(F);
      const std::size_t n = std::size_t(rows) * F;
      auto h = on_device(*dev, random_floats(2 * n, 121 + n, -8.0, 8.0));
      DeviceArray<std::uint16_t> h16(*dev, 2 * n), y16(*dev, n), dh16(*dev, 2 * n);
      dev->to_bf16(h.data(), h16.data(), 2 * n);
      DeviceArray<float> wide = widened(*dev, h16), y(*dev, n), dh(*dev, 2 * n), want(*dev, 2 * n);
      dev->swiglu_forward(h16.data(), y16.data(), rows, F);
      dev->swiglu_forward(wide.data(), y.data(), rows, F);
      CHECK(y16.download() == rounded(*dev, y));
      auto dy = on_device(*dev, random_floats(n, 122 + n));
      dev->swiglu_backward(h16.data(), dy.data(), dh.data(), dh16.data(), rows, F);
      dev->swiglu_backward(wide.data(), dy.data(), want.data(), rows, F);
      require_same_floats(dh.download(), want.download());
      CHECK(dh16.download() == rounded(*dev, dh));
    }
  }
}
