// Issue 25's fewer, wider passes on the GPU against the CPU device: the residual LayerNorm
// (Note [Residual LayerNorm] in src/cpu/ops/layernorm.cpp), and the element-wise kernels that
// move 16 bytes per thread (Note [Wide loads in the element-wise kernels] in
// src/cuda/ops/common.cuh) at sizes with a tail of n % 8 elements and on pointers one element
// off 16-byte alignment, where they fall back to one element per thread. Skip without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gpu_vs_cpu.hpp"

using namespace lockstep;
using namespace lockstep::test;

namespace {

// Element offsets of the operands: 0 keeps DeviceArray's alignment (the wide path), 1 moves a
// pointer 4 bytes (fp32) or 2 bytes (bf16) off it (the one-element path).
constexpr std::size_t kOffsets[] = {0, 1};

// Sizes: whole packs of 8, a tail of 5, and fewer than one pack.
constexpr std::size_t kSizes[] = {8 * 4099, 8 * 4099 + 5, 3};

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("cuda: residual LayerNorm forward and backward against the CPU device") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (auto [rows, C] : {std::pair{1, 1}, {37, 100}, {1030, 768}}) {
      CAPTURE(rows);
      CAPTURE(C);
      const std::size_t n = std::size_t(rows) * C, nc = std::size_t(C);
      const auto a = random_floats(n, 800 + n, -2.0, 3.0), b = random_floats(n, 801 + n);
      const auto w = random_floats(nc, 802), bias = random_floats(nc, 803);
      const auto dy = random_floats(n, 804 + n), dres = random_floats(n, 805 + n);
      const auto dw0 = random_floats(nc, 806), db0 = random_floats(nc, 807);
      // Forward with the sum over a (as a GPT block), into an fp32 y and into bf16; then
      // backward with dx beside dresidual and rounded, in place, and without a residual.
      for (const bool bf16 : {false, true}) {
        CAPTURE(bf16);
        const Tolerance row_sums = fp32_sums(C + 4, nc);
        const Tolerance y_tol = bf16 ? bf16_rounded(row_sums) : row_sums;
        // dweight and dbias sum over the rows too.
        const Tolerance grads = fp32_sums(std::max(rows, C) + 4, nc);
        compare_each(*gpu, [&](Device& d) {
          auto ad = on_device(d, a), bd = on_device(d, b), wd = on_device(d, w);
          auto biasd = on_device(d, bias), dyd = on_device(d, dy), dresd = on_device(d, dres);
          auto mean = poisoned(d, rows), rstd = poisoned(d, rows), y = poisoned(d, n);
          DeviceArray<std::uint16_t> y16 = poisoned_bf16(d, n), dx16 = poisoned_bf16(d, n);
          if (bf16)
            d.residual_layernorm_forward(ad.data(), bd.data(), ad.data(), wd.data(), biasd.data(),
                                         y16.data(), mean.data(), rstd.data(), rows, C);
          else
            d.residual_layernorm_forward(ad.data(), bd.data(), ad.data(), wd.data(), biasd.data(),
                                         y.data(), mean.data(), rstd.data(), rows, C);
          auto dx = poisoned(d, n), dw = on_device(d, dw0), db = on_device(d, db0);
          d.residual_layernorm_backward(ad.data(), wd.data(), mean.data(), rstd.data(),
                                        dyd.data(), dresd.data(), dx.data(), dx16.data(),
                                        dw.data(), db.data(), rows, C);
          d.residual_layernorm_backward(ad.data(), wd.data(), mean.data(), rstd.data(),
                                        dyd.data(), dresd.data(), dresd.data(), nullptr,
                                        dw.data(), db.data(), rows, C);
          auto alone = poisoned(d, n);  // no residual: the final LayerNorm's
          d.residual_layernorm_backward(ad.data(), wd.data(), mean.data(), rstd.data(),
                                        dyd.data(), nullptr, alone.data(), nullptr, dw.data(),
                                        db.data(), rows, C);
          return Outputs{ad.download(),    bf16 ? widened(y16.download()) : y.download(),
                         mean.download(),  rstd.download(),
                         dx.download(),    widened(dx16.download()),
                         dresd.download(), alone.download(),
                         dw.download(),    db.download()};
        }, {kSameBits, y_tol, row_sums, row_sums, row_sums, bf16_rounded(row_sums), row_sums,
            row_sums, grads, grads});
      }
    }
  }

  TEST_CASE("cuda: 16-byte element-wise kernels against the CPU device, with tails and "
            "misaligned pointers") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (const std::size_t n : kSizes) {
      for (const std::size_t off : kOffsets) {
        CAPTURE(n);
        CAPTURE(off);
        const std::size_t m = n + off;  // room for the offset
        const auto x = random_floats(m, 810 + n, -6.0, 6.0), y = random_floats(m, 811 + n);
        // to_bf16, from_bf16, add (in place too), and the activations on bf16 storage: single
        // IEEE operations on both sides, the same bits (tanh would call each side's library).
        compare(*gpu, [&](Device& d) {
          auto xd = on_device(d, x), yd = on_device(d, y);
          DeviceArray<std::uint16_t> h = poisoned_bf16(d, m), g = poisoned_bf16(d, m),
                                     d16 = poisoned_bf16(d, m);
          auto back = poisoned(d, m), sum = poisoned(d, m), dx = poisoned(d, m);
          d.to_bf16(xd.data() + off, h.data() + off, n);
          d.from_bf16(h.data() + off, back.data() + off, n);
          d.add(xd.data() + off, yd.data() + off, sum.data() + off, n);
          d.add(yd.data() + off, xd.data() + off, yd.data() + off, n);
          Outputs out{widened(h.download()), back.download(), sum.download(), yd.download()};
          for (Activation f : {Activation::relu, Activation::gelu}) {
            d.activation_forward(f, h.data() + off, g.data() + off, n);
            d.activation_backward(f, h.data() + off, xd.data() + off, dx.data() + off,
                                  d16.data() + off, n);
            for (auto* o : {&g, &d16}) out.push_back(widened(o->download()));
            out.push_back(dx.download());
          }
          // The offset's leading elements stay NaN on both sides.
          return out;
        }, kSameBits, NaNs::where_cpu_has_them);
        // add_bias into bf16: a row width that is a multiple of 8 (wide when aligned) and one
        // that is not (one element per thread throughout).
        for (const int cols : {64, 77}) {
          CAPTURE(cols);
          const int rows = static_cast<int>(n / std::size_t(cols));
          if (rows == 0) continue;
          const auto bias = random_floats(std::size_t(cols) + off, 812);
          compare(*gpu, [&](Device& d) {
            auto xd = on_device(d, x);
            DeviceArray<std::uint16_t> bias16 = on_device(d, to_bits(bias)),
                                       out = poisoned_bf16(d, m);
            d.add_bias(xd.data() + off, bias16.data() + off, out.data() + off, rows, cols);
            return Outputs{widened(out.download())};
          }, kSameBits, NaNs::where_cpu_has_them);
        }
        // AdamW and SGD with the bf16 copy: three steps, as test_cuda_bf16.cpp's.
        compare(*gpu, [&](Device& d) {
          auto p = on_device(d, x), g = on_device(d, y);
          auto m1 = on_device(d, std::vector<float>(m, 0.0f)), v1 = on_device(d, m1.download());
          auto ps = on_device(d, x), buf = on_device(d, m1.download());
          DeviceArray<std::uint16_t> copy = poisoned_bf16(d, m), copy_sgd = poisoned_bf16(d, m);
          for (int t = 1; t <= 3; ++t) {
            d.adamw_step({.weight_decay = 0.01f}, 0.01f, t, p.data() + off, g.data() + off,
                         m1.data() + off, v1.data() + off, n, nullptr, copy.data() + off);
            d.sgd_step({.momentum = 0.9f, .weight_decay = 0.01f}, 0.1f, ps.data() + off,
                       g.data() + off, buf.data() + off, n, nullptr, copy_sgd.data() + off);
          }
          return Outputs{p.download(),  m1.download(), v1.download(), widened(copy.download()),
                         ps.download(), buf.download(), widened(copy_sgd.download())};
        }, bf16_rounded(kOptimizerSteps), NaNs::where_cpu_has_them);
      }
    }
  }
}
