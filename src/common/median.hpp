// The median of timings or fractions: of an even count, the upper of the two middle values (a
// value that occurred, and one pass of nth_element). The device-busy share and the CUDA graphs'
// auto mode use it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace lockstep::detail {

// 0 for none.
inline double upper_median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

}  // namespace lockstep::detail
