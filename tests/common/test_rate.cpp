// detail::format_rate: a slow run's throughput keeps its digits (never "0 samples/s").
#include <doctest/doctest.h>

#include "common/rate.hpp"

TEST_CASE("format_rate: whole numbers from 100 up, three significant digits below") {
  using lockstep::detail::format_rate;
  CHECK(format_rate(12345.4) == "12345");
  CHECK(format_rate(100.0) == "100");
  CHECK(format_rate(45.24) == "45.2");
  CHECK(format_rate(0.2134) == "0.213");
  CHECK(format_rate(0.004) == "0.004");
}
