// bf16 conversions: the rounding is common/bf16.hpp's, shared with the CPU device
// (src/cpu/ops/convert.cpp), so both round every float alike (Note [Rounding to bf16]).
#include "common/bf16.hpp"
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

// 16 bytes of bf16 per thread and step where the pointers allow (Note [Wide loads in the
// element-wise kernels] in common.cuh).
template <class X, class Y>
__global__ void convert_kernel(const X* x, Y* y, std::size_t n, bool wide) {
  for_each_pack(n, wide, [=](std::size_t i, auto width) {
    float v[decltype(width)::value];
    load(x + i, v);
    store(y + i, v);
  });
}

template <class X, class Y>
void convert(cudaStream_t stream, const X* x, Y* y, std::size_t n) {
  if (n == 0) return;
  const bool wide = aligned16(x, y);
  convert_kernel<<<blocks_for_packs(n, wide), kThreads, 0, stream>>>(x, y, n, wide);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_to_bf16(cudaStream_t stream, const float* x, std::uint16_t* y, std::size_t n) {
  convert(stream, x, y, n);
}

void launch_from_bf16(cudaStream_t stream, const std::uint16_t* x, float* y, std::size_t n) {
  convert(stream, x, y, n);
}

}  // namespace lockstep::cuda
