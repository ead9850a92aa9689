// A throughput as a person reads it: whole numbers from 100 up ("12345", "250"), three
// significant digits below ("45.2", "0.213"), so that a slow run never reads "0 samples/s".
#pragma once

#include <fmt/format.h>

#include <string>

namespace lockstep::detail {

inline std::string format_rate(double per_second) {
  return per_second >= 100.0 ? fmt::format("{:.0f}", per_second) : fmt::format("{:.3g}", per_second);
}

}  // namespace lockstep::detail
