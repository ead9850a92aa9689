// Closed-form collective expectations: rank r fills element i with value(r, i); the sum over n
// ranks is expected_sum(n, i). Small integers keep every partial sum exact in float, in any order.
#pragma once

#include <cstddef>
#include <thread>
#include <vector>

#include "lockstep/comm.hpp"

namespace lockstep::test {

inline float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * 3 + i % 7); }
inline float expected_sum(int n, std::size_t i) {
  return static_cast<float>(3 * n * (n + 1) / 2 + n * static_cast<int>(i % 7));
}

// Runs fn(rank, comm) on one thread per rank of a fresh shared-memory group.
template <class Fn>
void on_group(int n, Fn fn) {
  auto comms = make_shared_memory_group(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(r, *comms[r]); });
  for (auto& t : threads) t.join();
}

}  // namespace lockstep::test
