// bf16 conversions: the rounding is common/bf16.hpp's, shared with the CPU device
// (src/cpu/ops/convert.cpp), so both round every float alike (Note [Rounding to bf16]).
#include "common/bf16.hpp"
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

__global__ void to_bf16_kernel(const float* x, std::uint16_t* y, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    y[i] = detail::float_to_bf16(x[i]);
}

__global__ void from_bf16_kernel(const std::uint16_t* x, float* y, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    y[i] = detail::bf16_to_float(x[i]);
}

}  // namespace

void launch_to_bf16(cudaStream_t stream, const float* x, std::uint16_t* y, std::size_t n) {
  if (n == 0) return;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_from_bf16(cudaStream_t stream, const std::uint16_t* x, float* y, std::size_t n) {
  if (n == 0) return;
  from_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::cuda
