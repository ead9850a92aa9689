// The CPU device's bf16 conversions (src/cpu/ops/convert.cpp): the rounding of common/bf16.hpp
// on every element, any length, and exact widening back.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "../random_data.hpp"
#include "common/bf16.hpp"
#include "lockstep/device.hpp"

TEST_CASE("cpu device: to_bf16 rounds to nearest even, from_bf16 widens exactly") {
  auto dev = lockstep::make_cpu_device(0, 2);
  // Past one block of the arena (kGrain elements), with the closed-form cases at the front:
  // 1 + 2^-8 ties down to 1, 1 + 3 x 2^-8 ties up to 1 + 2^-6, -0 stays -0.
  std::vector<float> x = lockstep::test::random_floats(40000, 5, -1e3, 1e3);
  x[0] = 1.00390625f;
  x[1] = 1.01171875f;
  x[2] = -0.0f;
  lockstep::DeviceArray<float> xd(*dev, x.size()), back(*dev, x.size());
  lockstep::DeviceArray<std::uint16_t> h(*dev, x.size());
  xd.upload(x);
  dev->to_bf16(xd.data(), h.data(), x.size());
  dev->from_bf16(h.data(), back.data(), x.size());
  const std::vector<std::uint16_t> bits = h.download();
  const std::vector<float> widened = back.download();
  CHECK(bits[0] == 0x3F80);
  CHECK(bits[1] == 0x3F82);
  CHECK(bits[2] == 0x8000);
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(bits[i] == lockstep::detail::float_to_bf16(x[i]));
    REQUIRE(widened[i] == lockstep::detail::bf16_to_float(bits[i]));
  }
}
