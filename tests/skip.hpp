// For a test case that cannot run here (no GPU, no PyTorch): say why, and let CTest report it as
// skipped rather than passed.
//
//   if (!backend) return test::skip("no usable GPU");
#pragma once

#include <doctest/doctest.h>

#include <string>

namespace lockstep::test {

// Set by skip(); tests/main.cpp reads it once the run is over. See Note [Skipped cases].
void mark_skipped() noexcept;

// Prints "skipping: WHY" and marks the run as skipped. The caller returns right after.
inline void skip(const std::string& why) {
  MESSAGE("skipping: " << why);
  mark_skipped();
}

}  // namespace lockstep::test
