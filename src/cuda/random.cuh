// The hash mixer of common/random.hpp, callable from kernels.
//
// Device::hash() must give the same value for the same bits on every backend, so this is the
// same SplitMix64 finaliser as detail::mix64, line for line. Change both or neither.
#pragma once

#include <cstdint>

namespace lockstep::cuda {

__host__ __device__ inline std::uint64_t mix64(std::uint64_t x) {
  std::uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace lockstep::cuda
