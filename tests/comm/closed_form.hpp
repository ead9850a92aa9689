// Closed-form all-reduce expectations: rank r fills element i with value(r, i); the sum over n
// ranks is expected_sum(n, i). Small integers keep every partial sum exact in float, in any order.
#pragma once

#include <cstddef>

namespace lockstep::test {

inline float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * 3 + i % 7); }
inline float expected_sum(int n, std::size_t i) {
  return static_cast<float>(3 * n * (n + 1) / 2 + n * static_cast<int>(i % 7));
}

}  // namespace lockstep::test
