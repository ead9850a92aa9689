// The CPU device's fully connected maps (Note [Fused linear] in lockstep/device.hpp): each
// variant of linear_forward and linear_backward gives the bits of the plain ops the layers called
// before the op existed, in the same order, on fresh random inputs; and bad operands are refused.
#include <doctest/doctest.h>

#include <cstring>
#include <stdexcept>
#include <tuple>

#include "../linear_cases.hpp"

using namespace lockstep;
using namespace lockstep::test;

namespace {

void require_same_bits(const LinearOutputs& got, const LinearOutputs& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    CAPTURE(k);
    REQUIRE(got[k].size() == want[k].size());
    CHECK(std::memcmp(got[k].data(), want[k].data(), got[k].size() * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("cpu device: linear_forward and linear_backward are the plain ops' composition") {
  auto dev = make_cpu_device(0, 2);
  for (auto [rows, in, out] : {std::tuple{1, 1, 1}, {37, 24, 40}, {300, 65, 257}}) {
    const LinearCase c(rows, in, out, 100 + rows);
    for (const LinearVariant v : linear_variants()) {
      CAPTURE(v.name());
      CAPTURE(rows);
      require_same_bits(run_linear_forward(*dev, c, v, true),
                        run_linear_forward(*dev, c, v, false));
      if (v.bf16_out != v.bf16_in) continue;  // the backward has no output storage of its own
      require_same_bits(run_linear_backward(*dev, c, v, true, true),
                        run_linear_backward(*dev, c, v, false, true));
    }
  }
}

TEST_CASE("cpu device: linear ops refuse operands that do not fit together") {
  auto dev = make_cpu_device(0, 1);
  DeviceArray<float> a(*dev, 64), b(*dev, 64), bias(*dev, 8);
  DeviceArray<std::uint16_t> h(*dev, 64);
  const MatIn x{a.data(), nullptr};
  // fp32 x with bf16 weights; GELU without pre; pre without GELU; a bf16 y without product.
  CHECK_THROWS_AS(dev->linear_forward({.rows = 2, .in = 4, .out = 8, .x = x,
                                       .weight = {nullptr, h.data()},
                                       .bias = {bias.data(), nullptr},
                                       .y = {b.data(), nullptr}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(dev->linear_forward({.rows = 2, .in = 4, .out = 8, .x = x, .weight = x,
                                       .bias = {bias.data(), nullptr}, .act = FusedActivation::gelu,
                                       .y = {b.data(), nullptr}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(dev->linear_forward({.rows = 2, .in = 4, .out = 8, .x = x, .weight = x,
                                       .bias = {bias.data(), nullptr}, .pre = {b.data(), nullptr},
                                       .y = {b.data(), nullptr}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(dev->linear_forward({.rows = 2, .in = 4, .out = 8, .x = x, .weight = x,
                                       .bias = {nullptr, h.data()}, .y = {nullptr, h.data()}}),
                  std::invalid_argument);
  // A bf16 y with an fp32 bias, an fp32 y with a bf16 one, no bias.
  CHECK_THROWS_AS(dev->linear_forward({.rows = 2, .in = 4, .out = 8, .x = x, .weight = x,
                                       .bias = {bias.data(), nullptr}, .y = {nullptr, h.data()},
                                       .product = a.data()}),
                  std::invalid_argument);
  CHECK_THROWS_AS(dev->linear_forward({.rows = 2, .in = 4, .out = 8, .x = x, .weight = x,
                                       .bias = {nullptr, h.data()}, .y = {b.data(), nullptr}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(dev->linear_forward({.rows = 2, .in = 4, .out = 8, .x = x, .weight = x,
                                       .y = {b.data(), nullptr}}),
                  std::invalid_argument);
  // A bias gradient without dy; a rounded dx with fp32 weights.
  CHECK_THROWS_AS(dev->linear_backward({.rows = 2, .in = 4, .out = 8, .x = x, .weight = x,
                                        .g = x, .dweight = b.data(), .dbias = bias.data()}),
                  std::invalid_argument);
  CHECK_THROWS_AS(dev->linear_backward({.rows = 2, .in = 4, .out = 8, .x = x, .weight = x,
                                        .g = x, .dweight = b.data(), .dx = a.data(),
                                        .dx_bf16 = h.data()}),
                  std::invalid_argument);
}

// The CPU composes every product (Note [Fused linear]) and counts it as a GPU counts a
// fallback: a forward one, a backward two (weight and input gradients), or one without dx.
TEST_CASE("cpu device: linear products are counted, all composed") {
  auto dev = make_cpu_device(0, 1);
  const LinearCase c(5, 8, 16, 3);
  CHECK(dev->linear_counts().total() == 0);
  for (const LinearVariant v : linear_variants()) {
    (void)run_linear_forward(*dev, c, v, true);
    if (v.bf16_out == v.bf16_in) (void)run_linear_backward(*dev, c, v, true, true);
  }
  const LinearCounts n = dev->linear_counts();
  CHECK(n.fused == 0);
  CHECK(n.partial == 0);
  CHECK(n.composed == 6 + 2 * 4);  // 6 variants forward, 4 of them backward
  DeviceArray<float> a(*dev, 128), w(*dev, 128), g(*dev, 128);
  const MatIn x{a.data(), nullptr};
  dev->linear_backward({.rows = 2, .in = 4, .out = 8, .x = x, .weight = x, .g = x,
                        .dweight = w.data()});
  CHECK(dev->linear_counts().composed == n.composed + 1);
}
