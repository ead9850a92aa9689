// Note [Wide vectors for the CPU kernels] (src/cpu/ops/isa_dispatch.hpp): every CPU kernel that
// runs through vectorized() must give the baseline's bits under each wider ISA this CPU has.
// Each case runs its kernels once per ISA (cpu::force_isa) on the same fresh random inputs,
// mixed with special values (NaN with any payload, infinities, signed zeros, subnormals, bf16
// rounding ties, the largest floats), past one block of the arena (kGrain) and with ragged
// tails, and compares every output with the baseline's: to the bit, but for a NaN's sign and
// payload, which the Note lets differ (the tiled attention's case uses plain random inputs).
// Since a NaN then equals any NaN, no fp32 output of the baseline may be more than half NaN: one
// that is compares next to nothing (LayerNorm's weight gradient sums every row, so one NaN in any
// row made it all NaN). Letting FMA in (target
// "avx2,fma", or -ffp-contract=fast with AVX-512) fails the activation, LayerNorm and optimiser
// cases.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../random_data.hpp"
#include "../skip.hpp"
#include "cpu/ops/isa_dispatch.hpp"
#include "lockstep/device.hpp"

using namespace lockstep;
using lockstep::test::on_device;

namespace {

// What a run's kernels wrote, in the order written: fp32 and bf16 outputs apart; where each fp32
// output starts in `floats`.
struct Outputs {
  std::vector<float> floats;
  std::vector<std::uint16_t> halves;
  std::vector<std::size_t> float_starts;
};

// Runs the kernels as compiled for one ISA until the end of the scope, however it ends.
struct ForcedIsa {
  explicit ForcedIsa(cpu::Isa isa) { cpu::force_isa(isa); }
  ~ForcedIsa() { cpu::force_isa(std::nullopt); }
  ForcedIsa(const ForcedIsa&) = delete;
  ForcedIsa& operator=(const ForcedIsa&) = delete;
};

float from_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// n floats uniform in [lo, hi), about one in `special_in` replaced by a special value: a random
// bit pattern (NaNs and subnormals among them), an entry of the table below, or a bf16 tie.
std::vector<float> awkward_floats(std::size_t n, std::uint64_t seed, double lo, double hi,
                                  std::uint64_t special_in) {
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), from_bits(0xFFC00001u),
                            from_bits(0x7F800001u),  // a signalling NaN
                            std::numeric_limits<float>::denorm_min(), from_bits(0x807FFFFFu),
                            std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(), from_bits(0x7F7F8000u),
                            1.00390625f, 1.01171875f, 88.0f, -88.0f, 1e-30f};
  std::vector<float> v = test::random_floats(n, seed, lo, hi);
  for (float& x : v) {
    if (detail::uniform_below(seed, special_in) != 0) continue;
    const std::uint32_t bits = static_cast<std::uint32_t>(detail::splitmix64(seed));
    switch (detail::uniform_below(seed, 3)) {
      case 0: x = from_bits(bits); break;
      case 1: x = specials[bits % std::size(specials)]; break;
      default: x = from_bits((bits & 0xFFFF0000u) | 0x8000u); break;  // halfway between bf16s
    }
  }
  return v;
}

// n random bf16 bit patterns, NaNs and subnormals included.
std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint16_t> v(n);
  for (auto& h : v) h = static_cast<std::uint16_t>(detail::splitmix64(seed));
  return v;
}

void append(Outputs& out, const DeviceArray<float>& a) {
  const std::vector<float> host = a.download();
  out.float_starts.push_back(out.floats.size());
  out.floats.insert(out.floats.end(), host.begin(), host.end());
}
void append(Outputs& out, const DeviceArray<std::uint16_t>& a) {
  const std::vector<std::uint16_t> host = a.download();
  out.halves.insert(out.halves.end(), host.begin(), host.end());
}

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// The same bits, but for a NaN's sign and payload (Note [Wide vectors for the CPU kernels]).
bool same_value(float a, float b) {
  return bits_of(a) == bits_of(b) || (std::isnan(a) && std::isnan(b));
}

// run(device) -> the Outputs of its kernels, from inputs it makes afresh each time. Requires
// every wider ISA's outputs to equal the baseline's: bf16 to the bit, fp32 to the bit or both NaN.
template <class Run>
void same_bits_on_every_isa(const Run& run) {
  const std::vector<cpu::Isa> isas = cpu::supported_isas();
  REQUIRE(isas.front() == cpu::Isa::baseline);
  if (isas.size() < 2) return test::skip(test::Skip::platform,
                                         "this CPU has no vectors wider than the baseline's");
  auto dev = make_cpu_device(0, 2);
  Outputs baseline;
  {
    ForcedIsa forced(cpu::Isa::baseline);
    REQUIRE(cpu::active_isa() == cpu::Isa::baseline);
    baseline = run(*dev);
  }
  REQUIRE(baseline.floats.size() + baseline.halves.size() > 0);
  for (std::size_t k = 0; k < baseline.float_starts.size(); ++k) {
    const std::size_t begin = baseline.float_starts[k];
    const std::size_t end = k + 1 < baseline.float_starts.size() ? baseline.float_starts[k + 1]
                                                                   : baseline.floats.size();
    const auto nans = std::count_if(baseline.floats.begin() + begin, baseline.floats.begin() + end,
                                    [](float x) { return std::isnan(x); });
    CHECK_MESSAGE(2 * std::size_t(nans) <= end - begin,
                  fmt::format("fp32 output {} of the baseline is {} NaN of {}: NaN equals NaN, so "
                              "it would not be compared",
                              k, nans, end - begin));
  }
  for (std::size_t k = 1; k < isas.size(); ++k) {
    const std::string isa = cpu::isa_name(isas[k]);
    CAPTURE(isa);
    ForcedIsa forced(isas[k]);
    REQUIRE(cpu::active_isa() == isas[k]);
    const Outputs got = run(*dev);
    REQUIRE(got.floats.size() == baseline.floats.size());
    REQUIRE(got.halves.size() == baseline.halves.size());
    for (std::size_t i = 0; i < got.floats.size(); ++i)
      if (!same_value(got.floats[i], baseline.floats[i])) {
        FAIL_CHECK(fmt::format("fp32 output {}: {:08x}, baseline {:08x}", i,
                               bits_of(got.floats[i]), bits_of(baseline.floats[i])));
        break;
      }
    for (std::size_t i = 0; i < got.halves.size(); ++i)
      if (got.halves[i] != baseline.halves[i]) {
        FAIL_CHECK(fmt::format("bf16 output {}: {:04x}, baseline {:04x}", i, got.halves[i],
                               baseline.halves[i]));
        break;
      }
  }
}

constexpr std::size_t kN = 40013;  // three blocks of kGrain, the last ragged

}  // namespace

TEST_CASE("wide vectors: activations on fp32 and bf16 storage give the baseline's bits") {
  same_bits_on_every_isa([](Device& dev) {
    Outputs out;
    const std::vector<float> x = awkward_floats(kN, 1, -8.0, 8.0, 4);
    const std::vector<float> dy = awkward_floats(kN, 2, -3.0, 3.0, 4);
    const auto x16 = on_device(dev, random_bf16(kN, 3));
    for (Activation f : {Activation::relu, Activation::tanh, Activation::gelu}) {
      auto xd = on_device(dev, x), y = on_device(dev, x), dyd = on_device(dev, dy);
      DeviceArray<float> dx(dev, kN);
      dev.activation_forward(f, xd.data(), y.data(), kN);
      dev.activation_backward(f, xd.data(), dyd.data(), dx.data(), kN);
      append(out, y);
      append(out, dx);
      dev.activation_forward(f, xd.data(), xd.data(), kN);     // in place
      dev.activation_backward(f, y.data(), dyd.data(), dyd.data(), kN);
      append(out, xd);
      append(out, dyd);
      DeviceArray<std::uint16_t> y16(dev, kN), dx16(dev, kN);
      auto dyd2 = on_device(dev, dy);
      dev.activation_forward(f, x16.data(), y16.data(), kN);
      dev.activation_backward(f, x16.data(), dyd2.data(), dx.data(), dx16.data(), kN);
      append(out, y16);
      append(out, dx);
      append(out, dx16);
      dev.activation_backward(f, x16.data(), dyd2.data(), dyd2.data(), nullptr, kN);
      append(out, dyd2);
    }
    return out;
  });
}

TEST_CASE("wide vectors: add_bias, bias_grad, scale and add give the baseline's bits") {
  same_bits_on_every_isa([](Device& dev) {
    Outputs out;
    for (auto [rows, cols] : {std::pair{300, 77}, {48, 768}, {5, 3}}) {
      const std::size_t n = std::size_t(rows) * cols;
      const std::vector<float> x = awkward_floats(n, 10 + n, -40.0, 40.0, 8);
      auto bias = on_device(dev, awkward_floats(std::size_t(cols), 11 + n, -2.0, 2.0, 8));
      // bias_grad sums every row: over x, whose special values are in nearly every column,
      // the sums would be all NaN (so compared to nothing); over finite values instead.
      auto y = on_device(dev, x), a = on_device(dev, test::random_floats(n, 14 + n, -40.0, 40.0));
      DeviceArray<std::uint16_t> y16(dev, n), a16(dev, n), bias16(dev, std::size_t(cols));
      dev.to_bf16(bias.data(), bias16.data(), std::size_t(cols));
      dev.to_bf16(a.data(), a16.data(), n);
      dev.add_bias(y.data(), bias16.data(), y16.data(), rows, cols);
      dev.add_bias(y.data(), bias.data(), rows, cols);
      dev.bias_grad(bias.data(), a.data(), rows, cols);
      dev.bias_grad(bias.data(), a16.data(), rows, cols);
      append(out, y16);
      append(out, y);
      append(out, bias);
    }
    auto a = on_device(dev, awkward_floats(kN, 12, -1e3, 1e3, 4));
    auto b = on_device(dev, awkward_floats(kN, 13, -1e3, 1e3, 4));
    DeviceArray<float> sum(dev, kN);
    dev.add(a.data(), b.data(), sum.data(), kN);
    dev.scale(a.data(), 0.3f, kN);
    append(out, sum);
    append(out, a);
    return out;
  });
}

TEST_CASE("wide vectors: to_bf16 and from_bf16 give the baseline's bits") {
  same_bits_on_every_isa([](Device& dev) {
    Outputs out;
    // One in two special: random bit patterns give every kind of NaN and subnormal.
    auto x = on_device(dev, awkward_floats(kN, 20, -1e3, 1e3, 2));
    DeviceArray<std::uint16_t> h(dev, kN);
    dev.to_bf16(x.data(), h.data(), kN);
    append(out, h);
    auto bits = on_device(dev, random_bf16(kN, 21));
    DeviceArray<float> wide(dev, kN);
    dev.from_bf16(bits.data(), wide.data(), kN);
    append(out, wide);
    return out;
  });
}

// Twice per shape: on finite inputs, where every output is compared to the bit, and with special
// values in about one row in eight (a NaN or infinity spreads over its row), where the weight and
// bias gradients, sums over every row, would be all NaN and are left out.
TEST_CASE("wide vectors: LayerNorm forward and backward give the baseline's bits") {
  same_bits_on_every_isa([](Device& dev) {
    Outputs out;
    for (auto [rows, C] : {std::pair{300, 77}, {40, 768}}) {
      for (const bool special : {false, true}) {
        const std::size_t n = std::size_t(rows) * C, nc = std::size_t(C);
        // Two inputs of a row with about 1/16 of a special value each.
        const std::uint64_t in = special ? 16 * nc : 0;
        const auto inputs = [&](std::uint64_t seed, double lo, double hi, std::size_t count) {
          return on_device(dev, special ? awkward_floats(count, seed, lo, hi, in)
                                        : test::random_floats(count, seed, lo, hi));
        };
        auto x = inputs(30 + n, -3.0, 3.0, n);
        auto w = inputs(31 + n, 0.5, 1.5, nc);
        auto b = inputs(32 + n, -0.5, 0.5, nc);
        auto dy = inputs(33 + n, -1.0, 1.0, n);
        DeviceArray<float> y(dev, n), mean(dev, rows), rstd(dev, rows);
        DeviceArray<std::uint16_t> y16(dev, n);
        dev.layernorm_forward(x.data(), w.data(), b.data(), y16.data(), mean.data(), rstd.data(),
                              rows, C);
        dev.layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(),
                              rows, C);
        auto dx = on_device(dev, test::random_floats(n, 34 + n));
        auto dw = on_device(dev, test::random_floats(nc, 35 + n));
        auto db = on_device(dev, test::random_floats(nc, 36 + n));
        dev.layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(), dx.data(),
                               dw.data(), db.data(), rows, C);
        for (const auto* a : {&y, &mean, &rstd, &dx}) append(out, *a);
        if (!special) {
          append(out, dw);
          append(out, db);
        }
        append(out, y16);
      }
    }
    return out;
  });
}

// The residual forms (Note [Residual LayerNorm]): the sum written beside a and over it, dx
// written beside dresidual with its bf16 rounding and over it.
TEST_CASE("wide vectors: residual LayerNorm forward and backward give the baseline's bits") {
  same_bits_on_every_isa([](Device& dev) {
    Outputs out;
    for (auto [rows, C] : {std::pair{300, 77}, {40, 768}}) {
      const std::size_t n = std::size_t(rows) * C, nc = std::size_t(C);
      auto a = on_device(dev, awkward_floats(n, 40 + n, -3.0, 3.0, 16 * nc));
      auto b = on_device(dev, test::random_floats(n, 41 + n, -1.0, 1.0));
      auto w = on_device(dev, test::random_floats(nc, 42 + n, 0.5, 1.5));
      auto bias = on_device(dev, test::random_floats(nc, 43 + n, -0.5, 0.5));
      auto dy = on_device(dev, test::random_floats(n, 44 + n));
      DeviceArray<float> sum(dev, n), y(dev, n), mean(dev, rows), rstd(dev, rows);
      DeviceArray<std::uint16_t> y16(dev, n), dx16(dev, n);
      dev.residual_layernorm_forward(a.data(), b.data(), sum.data(), w.data(), bias.data(),
                                     y16.data(), mean.data(), rstd.data(), rows, C);
      for (const auto* o : {&sum, &mean, &rstd}) append(out, *o);
      append(out, y16);
      dev.residual_layernorm_forward(a.data(), b.data(), a.data(), w.data(), bias.data(),
                                     y.data(), mean.data(), rstd.data(), rows, C);
      for (const auto* o : {&a, &y, &mean, &rstd}) append(out, *o);
      auto dres = on_device(dev, awkward_floats(n, 45 + n, -1.0, 1.0, 16 * nc));
      auto dw = on_device(dev, test::random_floats(nc, 46 + n));
      auto db = on_device(dev, test::random_floats(nc, 47 + n));
      DeviceArray<float> dx(dev, n);
      auto x = on_device(dev, test::random_floats(n, 48 + n, -3.0, 3.0));
      dev.layernorm_forward(x.data(), w.data(), bias.data(), y.data(), mean.data(), rstd.data(),
                            rows, C);
      dev.residual_layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                      dres.data(), dx.data(), dx16.data(), dw.data(), db.data(),
                                      rows, C);
      dev.residual_layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                      dres.data(), dres.data(), nullptr, dw.data(), db.data(),
                                      rows, C);
      for (const auto* o : {&dx, &dres, &dw, &db}) append(out, *o);
      append(out, dx16);
    }
    return out;
  });
}

// A Llama-family decoder's kernels: RMSNorm with its residual add, RoPE, SwiGLU, each in fp32
// and bf16 storage, forward and backward.
TEST_CASE("wide vectors: RMSNorm, RoPE and SwiGLU give the baseline's bits") {
  same_bits_on_every_isa([](Device& dev) {
    Outputs out;
    for (auto [rows, C] : {std::pair{300, 77}, {40, 768}}) {
      const std::size_t n = std::size_t(rows) * C, nc = std::size_t(C);
      auto a = on_device(dev, awkward_floats(n, 60 + n, -3.0, 3.0, 16 * nc));
      auto b = on_device(dev, test::random_floats(n, 61 + n));
      auto w = on_device(dev, test::random_floats(nc, 62 + n, 0.5, 1.5));
      DeviceArray<float> sum(dev, n), y(dev, n), rstd(dev, rows), dx(dev, n);
      DeviceArray<std::uint16_t> y16(dev, n), dx16(dev, n);
      dev.residual_rmsnorm_forward(a.data(), b.data(), sum.data(), w.data(), y16.data(),
                                   rstd.data(), rows, C, 1e-5f);
      append(out, y16);
      auto x = on_device(dev, test::random_floats(n, 63 + n, -3.0, 3.0));
      dev.residual_rmsnorm_forward(x.data(), nullptr, nullptr, w.data(), y.data(), rstd.data(),
                                   rows, C, 1e-6f);
      auto dy = on_device(dev, test::random_floats(n, 64 + n));
      auto dres = on_device(dev, awkward_floats(n, 65 + n, -1.0, 1.0, 16 * nc));
      auto dw = on_device(dev, test::random_floats(nc, 66 + n));
      dev.residual_rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dres.data(),
                                    dx.data(), dx16.data(), dw.data(), rows, C);
      for (const auto* o : {&sum, &y, &rstd, &dx, &dw}) append(out, *o);
      append(out, dx16);
    }
    const RopeShape s{3, 100, 4, 2, 64, 5};
    const std::size_t n = std::size_t(300) * 8 * 64, angles = std::size_t(105) * 32;
    auto cos = on_device(dev, test::random_floats(angles, 67, -1.0, 1.0));
    auto sin = on_device(dev, test::random_floats(angles, 68, -1.0, 1.0));
    const RopeTable table{cos.data(), sin.data(), 105};
    auto qkv = on_device(dev, awkward_floats(n, 69, -3.0, 3.0, 64));
    DeviceArray<std::uint16_t> q16(dev, n), d16(dev, n);
    dev.to_bf16(qkv.data(), q16.data(), n);
    dev.rope_forward(s, table, qkv.data());
    dev.rope_forward(s, table, q16.data());
    auto dq = on_device(dev, awkward_floats(n, 70, -1.0, 1.0, 64));
    dev.rope_backward(s, table, dq.data(), d16.data());
    append(out, qkv);
    append(out, dq);
    append(out, q16);
    append(out, d16);
    const int rows = 200, F = 101;  // 2F is not a multiple of any vector's width
    const std::size_t m = std::size_t(rows) * F;
    auto h = on_device(dev, awkward_floats(2 * m, 71, -12.0, 12.0, 4));
    auto dy = on_device(dev, awkward_floats(m, 72, -1.0, 1.0, 4));
    DeviceArray<std::uint16_t> h16(dev, 2 * m), y16(dev, m), dh16(dev, 2 * m);
    DeviceArray<float> y(dev, m), dh(dev, 2 * m), dh_of16(dev, 2 * m);
    dev.to_bf16(h.data(), h16.data(), 2 * m);
    dev.swiglu_forward(h.data(), y.data(), rows, F);
    dev.swiglu_forward(h16.data(), y16.data(), rows, F);
    dev.swiglu_backward(h.data(), dy.data(), dh.data(), rows, F);
    dev.swiglu_backward(h16.data(), dy.data(), dh_of16.data(), dh16.data(), rows, F);
    for (const auto* o : {&y, &dh, &dh_of16}) append(out, *o);
    append(out, y16);
    append(out, dh16);
    return out;
  });
}

TEST_CASE("wide vectors: causal softmax on fp32 and bf16 gives the baseline's bits") {
  same_bits_on_every_isa([](Device& dev) {
    Outputs out;
    for (auto [count, T] : {std::pair{24, 64}, {3, 37}}) {
      const std::size_t n = std::size_t(count) * T * T;
      const float scale = 0.125f;
      auto s = on_device(dev, awkward_floats(n, 40 + n, -20.0, 20.0, 512));
      auto dp = on_device(dev, awkward_floats(n, 41 + n, -1.0, 1.0, 512));
      DeviceArray<float> p(dev, n), ds(dev, n);
      DeviceArray<std::uint16_t> p16(dev, n), ds16(dev, n);
      dev.causal_softmax_forward(s.data(), p.data(), count, T, scale);
      dev.causal_softmax_forward(s.data(), p16.data(), count, T, scale);
      dev.causal_softmax_backward(p.data(), dp.data(), ds.data(), count, T, scale);
      dev.causal_softmax_backward(p16.data(), dp.data(), ds16.data(), count, T, scale);
      for (const auto* a : {&p, &ds}) append(out, *a);
      for (const auto* a : {&p16, &ds16}) append(out, *a);
    }
    return out;
  });
}

// The tiled attention's own loops (Note [Tiled attention]): the rows' maxima and sums in eight
// lanes, exp_poly, the masks; its products are OpenBLAS's, the same under every forced ISA.
TEST_CASE("wide vectors: tiled attention on fp32 and bf16 gives the baseline's bits") {
  same_bits_on_every_isa([](Device& dev) {
    Outputs out;
    const AttentionShape s{2, 130, 2, 16};
    const std::size_t n = std::size_t(s.batch) * s.T * s.heads * s.head_size;
    const std::size_t rows = std::size_t(s.batch) * s.heads * s.T;
    auto qkv = on_device(dev, test::random_floats(3 * n, 50, -3.0, 3.0));
    auto dy = on_device(dev, test::random_floats(n, 51));
    DeviceArray<std::uint16_t> qkv16(dev, 3 * n), dy16(dev, n), y16(dev, n);
    dev.to_bf16(qkv.data(), qkv16.data(), 3 * n);
    dev.to_bf16(dy.data(), dy16.data(), n);
    DeviceArray<float> y(dev, n), lse(dev, rows), lse16(dev, rows), dqkv(dev, 3 * n),
        dqkv16(dev, 3 * n);
    dev.attention_forward(s, {qkv.data()}, {y.data()}, lse.data());
    dev.attention_backward(s, {qkv.data()}, {y.data()}, {dy.data()}, lse.data(), dqkv.data());
    dev.attention_forward(s, {nullptr, qkv16.data()}, {nullptr, y16.data()}, lse16.data());
    dev.attention_backward(s, {nullptr, qkv16.data()}, {nullptr, y16.data()},
                           {nullptr, dy16.data()}, lse16.data(), dqkv16.data());
    for (const auto* a : {&y, &lse, &dqkv, &lse16, &dqkv16}) append(out, *a);
    append(out, y16);
    return out;
  });
}

TEST_CASE("wide vectors: AdamW and SGD steps give the baseline's bits") {
  same_bits_on_every_isa([](Device& dev) {
    Outputs out;
    const StepControl clipped{.grad_norm = 2.0, .clip_scale = 0.5f, .skip = 0};
    for (const StepControl* control : {static_cast<const StepControl*>(nullptr), &clipped}) {
      auto p = on_device(dev, awkward_floats(kN, 50, -1.0, 1.0, 64));
      auto g = on_device(dev, awkward_floats(kN, 51, -1.0, 1.0, 64));
      auto m = on_device(dev, test::random_floats(kN, 52, -0.1, 0.1));
      auto v = on_device(dev, test::random_floats(kN, 53, 0.0, 0.01));
      DeviceArray<std::uint16_t> p16(dev, kN);
      const AdamWParams adamw{.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
      dev.adamw_step(adamw, 3e-3f, 7, p.data(), g.data(), m.data(), v.data(), kN, control,
                     p16.data());
      for (const auto* a : {&p, &m, &v}) append(out, *a);
      append(out, p16);
      const SgdParams sgd{.momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true};
      dev.sgd_step(sgd, 0.1f, p.data(), g.data(), m.data(), kN, control, p16.data());
      for (const auto* a : {&p, &m}) append(out, *a);
      append(out, p16);
    }
    return out;
  });
}

TEST_CASE("wide vectors: embedding forward and backward give the baseline's bits") {
  same_bits_on_every_isa([](Device& dev) {
    Outputs out;
    const int batch = 4, T = 50, C = 200, vocab = 30;
    const std::size_t rows = std::size_t(batch) * T;
    auto ids = on_device(dev, test::random_tokens(rows, vocab, 60));
    auto wte = on_device(dev, awkward_floats(std::size_t(vocab) * C, 61, -1.0, 1.0, 16));
    auto wpe = on_device(dev, awkward_floats(std::size_t(T) * C, 62, -1.0, 1.0, 16));
    auto dout = on_device(dev, awkward_floats(rows * C, 63, -1.0, 1.0, 16));
    DeviceArray<float> y(dev, rows * C);
    dev.embedding_forward(ids.data(), wte.data(), wpe.data(), y.data(), batch, T, C, nullptr);
    dev.embedding_backward(ids.data(), dout.data(), wte.data(), wpe.data(), batch, T, C, nullptr);
    for (const auto* a : {&y, &wte, &wpe}) append(out, *a);
    return out;
  });
}
