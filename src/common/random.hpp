// Portable random numbers: the same stream on every platform and standard library, so that
// initial weights, shuffles and synthetic data depend on the seed alone.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.hpp"

namespace lockstep::detail {

// SplitMix64 (Steele, Lea, Flood 2014): advances `state` and returns the next 64-bit draw.
LOCKSTEP_HOST_DEVICE inline std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Mixes a value without state (for hashing). Compiled by nvcc too: Device::hash on the GPU
// uses it (common/elementwise_math.hpp, hash_term).
LOCKSTEP_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t x) noexcept {
  std::uint64_t s = x;
  return splitmix64(s);
}

// A key drawn from `key` and `part`, never 0 (which callers take as "none"): chained, a key of
// several parts, (seed, step, ...) for the dropout masks of Note [LoRA dropout].
inline std::uint64_t derive_key(std::uint64_t key, std::uint64_t part) noexcept {
  const std::uint64_t k = mix64(key ^ mix64(part));
  return k != 0 ? k : 1;
}

// Uniform in [0, 1) with 53 random bits.
inline double uniform01(std::uint64_t& state) noexcept {
  return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
}

// Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias below 2^-64 * n).
__extension__ using uint128 = unsigned __int128;
inline std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t n) noexcept {
  return static_cast<std::uint64_t>((static_cast<uint128>(splitmix64(state)) * n) >> 64);
}

// Standard normal by Box-Muller.
inline double normal(std::uint64_t& state) noexcept {
  double u1 = uniform01(state);
  double u2 = uniform01(state);
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace lockstep::detail
