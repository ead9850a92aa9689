// The residual LayerNorm (Note [Residual LayerNorm] in src/cpu/ops/layernorm.cpp) on the CPU
// device: one pass that must give the bits of the ops it replaces, an add (or a copy) and the
// LayerNorm, in either output storage, in place and not, on fresh random inputs past one block
// of the arena (kGrain). Its gradient against finite differences is in
// tests/model/test_gradcheck.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "../random_data.hpp"
#include "device_passes.hpp"
#include "lockstep/device.hpp"

using namespace lockstep;
using lockstep::test::on_device;
using lockstep::test::random_floats;
using lockstep::test::require_same_floats;

namespace {

// Where the sum goes: a new buffer, or over one of the addends, as a GPT block writes it.
enum class SumInto { fresh, a, b };

}  // namespace

TEST_CASE("cpu device: residual_layernorm_forward is add, then layernorm_forward, bit for bit") {
  auto dev = make_cpu_device(0, 2);
  for (auto [rows, C] : {std::pair{1, 1}, {7, 31}, {600, 128}}) {
    for (SumInto into : {SumInto::fresh, SumInto::a, SumInto::b}) {
      CAPTURE(rows);
      CAPTURE(C);
      CAPTURE(int(into));
      const std::size_t n = std::size_t(rows) * C;
      const auto a = random_floats(n, 61 + n, -2.0, 3.0), b = random_floats(n, 62 + n, -1.0, 1.0);
      auto w = on_device(*dev, random_floats(std::size_t(C), 63 + n));
      auto bias = on_device(*dev, random_floats(std::size_t(C), 64 + n));
      // The ops it replaces.
      auto ad = on_device(*dev, a), bd = on_device(*dev, b);
      DeviceArray<float> sum(*dev, n), y(*dev, n), mean(*dev, rows), rstd(*dev, rows);
      DeviceArray<std::uint16_t> y16(*dev, n);
      dev->add(ad.data(), bd.data(), sum.data(), n);
      dev->layernorm_forward(sum.data(), w.data(), bias.data(), y.data(), mean.data(), rstd.data(),
                             rows, C);
      dev->layernorm_forward(sum.data(), w.data(), bias.data(), y16.data(), mean.data(),
                             rstd.data(), rows, C);
      // Fused, into either storage.
      for (const bool bf16 : {false, true}) {
        CAPTURE(bf16);
        auto fa = on_device(*dev, a), fb = on_device(*dev, b);
        DeviceArray<float> fresh(*dev, n), fy(*dev, n), fmean(*dev, rows), frstd(*dev, rows);
        DeviceArray<std::uint16_t> fy16(*dev, n);
        float* s = into == SumInto::fresh ? fresh.data()
                   : into == SumInto::a   ? fa.data()
                                          : fb.data();
        if (bf16)
          dev->residual_layernorm_forward(fa.data(), fb.data(), s, w.data(), bias.data(),
                                          fy16.data(), fmean.data(), frstd.data(), rows, C);
        else
          dev->residual_layernorm_forward(fa.data(), fb.data(), s, w.data(), bias.data(),
                                          fy.data(), fmean.data(), frstd.data(), rows, C);
        std::vector<float> got_sum(n);
        dev->copy_to_host(got_sum.data(), s, n * sizeof(float));
        require_same_floats(got_sum, sum.download());
        if (bf16)
          CHECK(fy16.download() == y16.download());
        else
          require_same_floats(fy.download(), y.download());
        require_same_floats(fmean.download(), mean.download());
        require_same_floats(frstd.download(), rstd.download());
      }
    }
  }
}

// dresidual beside dx, under it (in place), or null (zeros: the final LayerNorm's, which
// replaced a fill of dx).
enum class Residual { beside, in_place, none };

TEST_CASE("cpu device: residual_layernorm_backward is a copy (or a fill), then "
          "layernorm_backward, bit for bit, and rounds dx as to_bf16 does") {
  auto dev = make_cpu_device(0, 2);
  for (auto [rows, C] : {std::pair{1, 1}, {7, 31}, {600, 128}}) {
    for (const Residual mode : {Residual::beside, Residual::in_place, Residual::none}) {
      CAPTURE(rows);
      CAPTURE(C);
      CAPTURE(int(mode));
      const std::size_t n = std::size_t(rows) * C, nc = std::size_t(C);
      auto x = on_device(*dev, random_floats(n, 71 + n, -2.0, 3.0));
      auto w = on_device(*dev, random_floats(nc, 72 + n));
      auto bias = on_device(*dev, random_floats(nc, 73 + n));
      auto dy = on_device(*dev, random_floats(n, 74 + n));
      const auto dres = mode == Residual::none ? std::vector<float>(n, 0.0f)
                                               : random_floats(n, 75 + n);
      const auto dw0 = random_floats(nc, 76 + n), db0 = random_floats(nc, 77 + n);
      DeviceArray<float> y(*dev, n), mean(*dev, rows), rstd(*dev, rows);
      dev->layernorm_forward(x.data(), w.data(), bias.data(), y.data(), mean.data(), rstd.data(),
                             rows, C);
      // The ops it replaces: dx = dresidual (a copy, or a fill with 0), then dx += LayerNorm's.
      auto want = on_device(*dev, dres), dw = on_device(*dev, dw0), db = on_device(*dev, db0);
      dev->layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                              want.data(), dw.data(), db.data(), rows, C);
      DeviceArray<std::uint16_t> want16(*dev, n);
      dev->to_bf16(want.data(), want16.data(), n);
      // Fused.
      auto fres = on_device(*dev, dres), fdw = on_device(*dev, dw0), fdb = on_device(*dev, db0);
      DeviceArray<float> fresh(*dev, n);
      DeviceArray<std::uint16_t> dx16(*dev, n);
      float* dx = mode == Residual::in_place ? fres.data() : fresh.data();
      dev->residual_layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                       mode == Residual::none ? nullptr : fres.data(), dx,
                                       dx16.data(), fdw.data(), fdb.data(), rows, C);
      std::vector<float> got(n);
      dev->copy_to_host(got.data(), dx, n * sizeof(float));
      require_same_floats(got, want.download());
      CHECK(dx16.download() == want16.download());
      require_same_floats(fdw.download(), dw.download());
      require_same_floats(fdb.download(), db.download());
      if (mode != Residual::in_place) require_same_floats(fres.download(), dres);  // left alone
    }
  }
}
