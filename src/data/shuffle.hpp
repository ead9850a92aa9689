// Fisher-Yates shuffles on the portable generator, shared by the sampler, the train/eval split
// and the synthetic data, so that every order depends on the seed alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "common/random.hpp"

namespace lockstep::detail {

template <class T>
void shuffle(std::span<T> values, std::uint64_t& state) noexcept {
  for (std::size_t i = values.size(); i > 1; --i) {
    std::swap(values[i - 1], values[uniform_below(state, i)]);
  }
}

// A uniformly random permutation of [0, n).
inline std::vector<std::size_t> permutation(std::size_t n, std::uint64_t& state) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  shuffle(std::span<std::size_t>(order), state);
  return order;
}

}  // namespace lockstep::detail
