// What every kernel file of src/cuda/ops shares: block and grid shapes, grid-stride indexing,
// warp and block reductions, and the launch check.
//
// Invariants every kernel keeps (tests/cuda compare each with the CPU device on random inputs):
//  - Each kernel computes what the CPU device computes (src/cpu/ops/*.cpp, same file names), to
//    the bit or within a stated tolerance: see Note [Numerics of the CUDA kernels]. Element-wise
//    math both share lives in common/elementwise_math.hpp.
//  - Elementwise kernels use grid-stride loops, so any grid size gives the same result.
//  - Reductions that produce floating-point values sum in an order fixed by the shape alone
//    (fixed block size, fixed grid, fixed tree), never by atomics: the same inputs give the same
//    bits on every run and every GPU. Only the integer hash uses atomics (addition mod 2^64 is
//    associative, so the order does not matter).
//  - Every block has exactly kThreads threads (block_sum relies on it), except bias_grad's
//    (elementwise.cu), which sums without block_sum. Row kernels give each row one warp,
//    kWarpsPerBlock rows per block.
//  - Every launcher takes the worker's stream, launches nothing for empty inputs, and checks the
//    launch with CUDA_CHECK(cudaGetLastError()).
//
// Note [Numerics of the CUDA kernels]
// nvcc contracts a * b + c into one fused multiply-add (one rounding instead of two) unless told
// not to; g++ does the same on hosts where FMA is baseline (aarch64, e.g. GH200). The CPU device
// is therefore built with -ffp-contract=off (src/cpu/CMakeLists.txt), and each kernel family
// below either matches it to the bit or documents its tolerance (the tests in tests/cuda check
// exactly that):
//  - elementwise.cu, optimizer.cu: compiled with --fmad=false (src/cuda/CMakeLists.txt). Fill,
//    scale, add, add_bias, ReLU, GELU (exp_poly, no library call), and the SGD and AdamW updates
//    are single-rounded IEEE operations in the same order on both sides: the same bits. tanh
//    calls each side's library (CUDA's tanhf is within 2 ulp): a tolerance. bias_grad sums in
//    double in another order: the same float or its neighbour.
//  - embedding.cu, peer_reduce.cu: float additions only, in the CPU's order: the same bits.
//  - layernorm.cu, softmax.cu (causal softmax): products that the CPU rounds are written
//    __fmul_rn, but the sums run in another order and expf is CUDA's (within 2 ulp): tolerance
//    1e-5 of the largest value. The cross-entropy takes exp in float once per logit where the
//    CPU takes it in double: dlogits within 1e-5 of the largest, the loss sum within 1e-6
//    relative (each exp within a few 1e-7; the sums in double). The fused classifier (bf16
//    logits) also rescales its sums as the running largest grows: its bf16 dlogits within a
//    bf16 neighbour, the loss sum within 1e-6 relative.
//  - reduce.cu: sum_squares in double in a fixed tree (contraction allowed: it only makes the
//    double sums more exact): 1e-10 relative. The hash: integers, exact.
//  - GEMM (cuBLAS, unaffected by these flags): another summation order, TF32 when asked: 1e-5
//    to 1e-4 of the largest value in fp32 (growing with k), 1e-2 with TF32.
// The kernels built with --fmad=false are bound by memory bandwidth, not arithmetic, so the
// unfused form is expected to cost little; bench/bench_kernels times add_bias and bias_grad.
#pragma once

#include <algorithm>
#include <cstddef>

#include "cuda/check.hpp"
#include "cuda/kernels.hpp"

namespace lockstep::cuda {

constexpr std::size_t kMaxBlocks = 4096;  // elementwise grids: enough to fill any current GPU

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;  // rows per block of the row kernels

// ---- Indexing -----------------------------------------------------------------------------

__device__ inline std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

// The row of this thread's warp in a row kernel (rows >= the result means: no row), and its lane.
__device__ inline std::size_t warp_row() {
  return static_cast<std::size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
}
__device__ inline int lane() { return static_cast<int>(threadIdx.x % kWarp); }

// ---- Reductions ---------------------------------------------------------------------------

// The sum of every thread's v, added in a fixed tree order; every thread receives it.
__device__ inline double block_sum(double v) {
  __shared__ double partial[kThreads];
  partial[threadIdx.x] = v;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = partial[0];
  __syncthreads();  // `partial` is reused by the next call
  return total;
}

// Sum and max over a warp by butterfly: x + y == y + x, so every lane ends with the same bits.
template <class T>
__device__ T warp_sum(T v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// ---- Grid sizes ---------------------------------------------------------------------------

// Blocks of an elementwise (grid-stride) kernel over n elements.
inline unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// Blocks of the row kernels: one warp per row.
inline unsigned blocks_for_rows(std::size_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace lockstep::cuda
