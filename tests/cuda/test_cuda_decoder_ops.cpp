// A Llama-family decoder's kernels on the GPU against the CPU device, element by element (Note
// [Comparing with the CPU] in gpu_vs_cpu.hpp), on fresh random inputs: RMSNorm with its
// residual add, RoPE in place on q and k, SwiGLU; fp32 and bf16, each backward too. RoPE and
// SwiGLU compute the CPU's bits (Note [Numerics of the CUDA kernels] in src/cuda/ops/common.cuh);
// RMSNorm sums its rows in another order. LoRA's dropout draws the CPU's mask. Skip without a
// GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_vs_cpu.hpp"

using namespace lockstep;
using namespace lockstep::test;

TEST_SUITE("cuda") {
  TEST_CASE("cuda: residual RMSNorm forward and backward against the CPU device") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (auto [rows, C] : {std::pair{1, 1}, {37, 100}, {1030, 768}}) {
      CAPTURE(rows);
      CAPTURE(C);
      const std::size_t n = std::size_t(rows) * C, nc = std::size_t(C);
      const auto a = random_floats(n, 900 + n, -2.0, 3.0), b = random_floats(n, 901 + n);
      const auto w = random_floats(nc, 902), dy = random_floats(n, 903 + n);
      const auto dres = random_floats(n, 904 + n), dw0 = random_floats(nc, 905);
      // Forward with the sum over a, into fp32 and bf16; backward beside dresidual and rounded,
      // in place, and without a residual (the final norm's).
      for (const bool bf16 : {false, true}) {
        CAPTURE(bf16);
        const Tolerance row_sums = fp32_sums(C + 4, nc);
        const Tolerance y_tol = bf16 ? bf16_rounded(row_sums) : row_sums;
        const Tolerance grads = fp32_sums(std::max(rows, C) + 4, nc);  // dweight: over the rows
        compare_each(*gpu, [&](Device& d) {
          auto ad = on_device(d, a), bd = on_device(d, b), wd = on_device(d, w);
          auto dyd = on_device(d, dy), dresd = on_device(d, dres);
          auto rstd = poisoned(d, rows), y = poisoned(d, n);
          DeviceArray<std::uint16_t> y16 = poisoned_bf16(d, n), dx16 = poisoned_bf16(d, n);
          if (bf16)
            d.residual_rmsnorm_forward(ad.data(), bd.data(), ad.data(), wd.data(), y16.data(),
                                       rstd.data(), rows, C, 1e-5f);
          else
            d.residual_rmsnorm_forward(ad.data(), bd.data(), ad.data(), wd.data(), y.data(),
                                       rstd.data(), rows, C, 1e-5f);
          auto dx = poisoned(d, n), dw = on_device(d, dw0), alone = poisoned(d, n);
          d.residual_rmsnorm_backward(ad.data(), wd.data(), rstd.data(), dyd.data(), dresd.data(),
                                      dx.data(), dx16.data(), dw.data(), rows, C);
          d.residual_rmsnorm_backward(ad.data(), wd.data(), rstd.data(), dyd.data(), dresd.data(),
                                      dresd.data(), nullptr, dw.data(), rows, C);
          d.residual_rmsnorm_backward(ad.data(), wd.data(), rstd.data(), dyd.data(), nullptr,
                                      alone.data(), nullptr, dw.data(), rows, C);
          return Outputs{ad.download(),    bf16 ? widened(y16.download()) : y.download(),
                         rstd.download(),  dx.download(),
                         widened(dx16.download()), dresd.download(),
                         alone.download(), dw.download()};
        }, {kSameBits, y_tol, row_sums, row_sums, bf16_rounded(row_sums), row_sums, row_sums,
            grads});
      }
    }
  }

  // GQA's layout and plain multi-head, an offset position, a head of 2 channels; bf16 qkv.
  TEST_CASE("cuda: RoPE forward and backward give the CPU device's bits") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (const RopeShape s : {RopeShape{2, 5, 4, 2, 8, 3}, RopeShape{1, 1, 1, 1, 2, 0},
                              RopeShape{3, 300, 8, 2, 64, 7}, RopeShape{2, 129, 12, 12, 128, 0}}) {
      CAPTURE(s.T);
      CAPTURE(s.heads);
      CAPTURE(s.head_size);
      const int half = s.head_size / 2, positions = s.position + s.T;
      const std::size_t n =
          std::size_t(s.batch) * s.T * (s.heads + 2 * s.kv_heads) * s.head_size;
      std::vector<float> cos, sin;
      for (float angle : random_floats(std::size_t(positions) * half, 910 + n, -4.0, 4.0)) {
        cos.push_back(static_cast<float>(std::cos(double(angle))));
        sin.push_back(static_cast<float>(std::sin(double(angle))));
      }
      const auto x = random_floats(n, 911 + n, -3.0, 3.0), dy = random_floats(n, 912 + n);
      compare(*gpu, [&](Device& d) {
        auto cd = on_device(d, cos), sd = on_device(d, sin);
        const RopeTable table{cd.data(), sd.data(), positions};
        auto q = on_device(d, x), dq = on_device(d, dy);
        DeviceArray<std::uint16_t> q16(d, n), dq16 = poisoned_bf16(d, n);
        d.to_bf16(q.data(), q16.data(), n);
        d.rope_forward(s, table, q.data());
        d.rope_forward(s, table, q16.data());
        d.rope_backward(s, table, dq.data(), dq16.data());
        return Outputs{q.download(), widened(q16.download()), dq.download(),
                       widened(dq16.download())};
      }, kSameBits);
    }
  }

  // F a multiple of 8 (16-byte packs) and not (one element per thread), and every operand one
  // element off 16-byte alignment (one element per thread too); bf16 h and y.
  TEST_CASE("cuda: SwiGLU forward and backward give the CPU device's bits") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    for (auto [rows, F] : {std::pair{1, 1}, {7, 33}, {300, 96}, {513, 1024}}) {
      for (const std::size_t at : {0, 1}) {
        CAPTURE(rows);
        CAPTURE(F);
        CAPTURE(at);
        const std::size_t n = std::size_t(rows) * F;
        const auto h = random_floats(2 * n + at, 920 + n, -12.0, 12.0);
        const auto dy = random_floats(n + at, 921 + n);
        compare(*gpu, [&](Device& d) {
          auto hd = on_device(d, h), dyd = on_device(d, dy);
          DeviceArray<std::uint16_t> h16(d, 2 * n + at), y16 = poisoned_bf16(d, n + at);
          DeviceArray<std::uint16_t> dh16 = poisoned_bf16(d, 2 * n + at);
          d.to_bf16(hd.data(), h16.data(), 2 * n + at);
          auto y = poisoned(d, n + at), dh = poisoned(d, 2 * n + at);
          auto dh_of16 = poisoned(d, 2 * n + at);
          d.swiglu_forward(hd.data() + at, y.data() + at, rows, F);
          d.swiglu_forward(h16.data() + at, y16.data() + at, rows, F);
          d.swiglu_backward(hd.data() + at, dyd.data() + at, dh.data() + at, rows, F);
          d.swiglu_backward(h16.data() + at, dyd.data() + at, dh_of16.data() + at,
                            dh16.data() + at, rows, F);
          // The element before an offset operand stays NaN on both sides: never written.
          return Outputs{y.download(), widened(y16.download()), dh.download(),
                         dh_of16.download(), widened(dh16.download())};
        }, kSameBits, NaNs::where_cpu_has_them);
      }
    }
  }

  TEST_CASE("cuda: LoRA's dropout gives the CPU device's mask and bits") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    // Lengths around the kernel's packs, an unaligned start (at 1), and two probabilities.
    for (const std::size_t n : {1ul, 7ul, 4099ul, 300000ul}) {
      for (const std::size_t at : {0, 1}) {
        for (const float p : {0.1f, 0.5f}) {
          CAPTURE(n);
          CAPTURE(at);
          CAPTURE(p);
          const std::uint64_t key = 0x5eed0000ull + n;
          const auto x = random_floats(n + at, 930 + n, -3.0, 3.0);
          const auto y0 = random_floats(n + at, 931 + n);
          compare(*gpu, [&](Device& d) {
            auto xd = on_device(d, x), acc = on_device(d, y0), y = poisoned(d, n + at);
            d.dropout(xd.data() + at, y.data() + at, n, key, p, false);
            d.dropout(xd.data() + at, acc.data() + at, n, key, p, true);
            return Outputs{y.download(), acc.download()};
          }, kSameBits, NaNs::where_cpu_has_them);
        }
      }
    }
  }
}
