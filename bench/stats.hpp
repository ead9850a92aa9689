// Helpers shared by the benchmarks: medians, not means, because the machines are shared.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace lockstep::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace lockstep::bench
