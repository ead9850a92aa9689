// bfloat16 <-> float, for the host and the GPU alike. A bf16 is the top half of a float: 1 sign,
// 8 exponent and 7 mantissa bits, so every float's range but a quarter of its mantissa.
//
//   std::uint16_t h = detail::float_to_bf16(x);   // round to nearest, ties to even
//   float back = detail::bf16_to_float(h);        // exact
//
// Note [Rounding to bf16]
// ~~~~~~~~~~~~~~~~~~~~~~~
// float_to_bf16 rounds to nearest, ties to even, bit for bit as PyTorch does
// (`torch.tensor(x).to(torch.bfloat16)`; tests/common/test_bf16.cpp compares the two): add
// 0x7FFF plus the lowest bit that is kept, then drop the low 16 bits. A carry out of the
// mantissa steps into the next binade, which is IEEE rounding too: floats at or above
// 0x7F7F8000 round to infinity, subnormals round like any other float (bf16 keeps them), and
// infinities are unchanged (their low bits are 0). Only NaN needs a case of its own, since the
// addition could carry a NaN into infinity: it becomes the quiet NaN 0x7FC0, sign and payload
// dropped, as PyTorch's scalar conversion does (its vectorised bulk copy writes 0xFFFF instead,
// another quiet NaN). The reverse conversion is exact: shift the bits back.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace lockstep::detail {

inline constexpr std::uint16_t kBf16QuietNan = 0x7FC0;

// The bits of a float and back (GCC and Clang have __builtin_bit_cast in C++17 too).
LOCKSTEP_HOST_DEVICE inline std::uint32_t bits_of_float(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  return __builtin_bit_cast(std::uint32_t, x);
#endif
}
LOCKSTEP_HOST_DEVICE inline float float_of_bits(std::uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  return __builtin_bit_cast(float, bits);
#endif
}

// Round to nearest, ties to even (Note [Rounding to bf16]).
LOCKSTEP_HOST_DEVICE inline std::uint16_t float_to_bf16(float x) {
  const std::uint32_t bits = bits_of_float(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return kBf16QuietNan;
  const std::uint32_t lowest_kept = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7FFFu + lowest_kept) >> 16);
}

LOCKSTEP_HOST_DEVICE inline float bf16_to_float(std::uint16_t h) {
  return float_of_bits(static_cast<std::uint32_t>(h) << 16);
}

// x as the nearest bf16 would give it back: what a value loses by a trip through bf16.
LOCKSTEP_HOST_DEVICE inline float round_to_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// Kernels templated on their storage type (float, or std::uint16_t holding bf16 bits) read a
// stored value as fp32 and store an fp32 value through these: a bf16 operand is widened as it is
// read and a bf16 result rounded as it is written, exactly as from_bf16 and to_bf16 passes
// around the fp32 kernel would (Note [bf16 compute] in src/model/ops.hpp).
LOCKSTEP_HOST_DEVICE inline float load_value(float x) { return x; }
LOCKSTEP_HOST_DEVICE inline float load_value(std::uint16_t h) { return bf16_to_float(h); }
LOCKSTEP_HOST_DEVICE inline void store_value(float* p, float v) { *p = v; }
LOCKSTEP_HOST_DEVICE inline void store_value(std::uint16_t* p, float v) { *p = float_to_bf16(v); }

}  // namespace lockstep::detail
