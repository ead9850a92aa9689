// What the CPU device's fused and bf16-storage tests compare against: the device's own
// to_bf16 and from_bf16 passes, and floats to the bit.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "lockstep/device.hpp"

namespace lockstep::test {

inline void require_same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// x rounded to bf16 by the device's to_bf16 pass.
inline std::vector<std::uint16_t> rounded(Device& dev, const DeviceArray<float>& x) {
  DeviceArray<std::uint16_t> h(dev, x.size());
  dev.to_bf16(x.data(), h.data(), x.size());
  return h.download();
}

// bits widened to fp32 by the device's from_bf16 pass.
inline DeviceArray<float> widened(Device& dev, const DeviceArray<std::uint16_t>& bits) {
  DeviceArray<float> x(dev, bits.size());
  dev.from_bf16(bits.data(), x.data(), bits.size());
  return x;
}

}  // namespace lockstep::test
