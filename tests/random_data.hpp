// Random test inputs drawn from a seed (the same on every platform), bf16 bits to and from
// floats, and a helper to put them on a device. Shared by the CPU, CUDA and gradient-check tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/bf16.hpp"
#include "common/random.hpp"
#include "lockstep/device.hpp"

namespace lockstep::test {

// n floats uniform in [lo, hi).
inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, double lo = -1.0,
                                        double hi = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * detail::uniform01(seed));
  return v;
}

// n labels uniform in [0, classes).
inline std::vector<std::int32_t> random_labels(std::size_t n, int classes, std::uint64_t seed) {
  std::vector<std::int32_t> v(n);
  for (auto& l : v) l = static_cast<std::int32_t>(detail::uniform_below(seed, classes));
  return v;
}

// n token ids below vocab, stored as floats as a GPT's embedding reads them.
inline std::vector<float> random_tokens(std::size_t n, int vocab, std::uint64_t seed) {
  std::vector<float> v(n);
  for (float& t : v) t = static_cast<float>(detail::uniform_below(seed, static_cast<std::uint64_t>(vocab)));
  return v;
}

// x rounded to bf16 bits, and bf16 bits as the floats they hold.
inline std::vector<std::uint16_t> to_bits(const std::vector<float>& x) {
  std::vector<std::uint16_t> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = detail::float_to_bf16(x[i]);
  return out;
}
inline std::vector<float> widened(const std::vector<std::uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i] = detail::bf16_to_float(bits[i]);
  return out;
}

template <class T>
DeviceArray<T> on_device(Device& dev, const std::vector<T>& host) {
  DeviceArray<T> a(dev, host.size());
  a.upload(host);
  return a;
}

}  // namespace lockstep::test
