// bf16 conversions: the CPU reference of the CUDA kernels in src/cuda/ops/convert.cu, both
// rounding with common/bf16.hpp (Note [Rounding to bf16]).
#include "common/bf16.hpp"
#include "cpu/cpu_device.hpp"
#include "cpu/ops/isa_dispatch.hpp"

namespace lockstep::cpu {

void CpuDevice::to_bf16(const float* x, std::uint16_t* y, std::size_t n) {
  for_range(n, vectorized([=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) y[i] = detail::float_to_bf16(x[i]);
  }));
}

void CpuDevice::from_bf16(const std::uint16_t* x, float* y, std::size_t n) {
  for_range(n, vectorized([=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) y[i] = detail::bf16_to_float(x[i]);
  }));
}

}  // namespace lockstep::cpu
