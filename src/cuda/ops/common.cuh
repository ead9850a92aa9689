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
//  - elementwise.cu, optimizer.cu, rope.cu: compiled with --fmad=false (src/cuda/CMakeLists.txt).
//    Fill, scale, add, add_bias, ReLU, GELU and SwiGLU (exp_poly, no library call), RoPE's
//    rotation, and the SGD and AdamW updates are single-rounded IEEE operations in the same
//    order on both sides: the same bits. tanh calls each side's library (CUDA's tanhf is
//    within 2 ulp): a tolerance. bias_grad sums in double in another order: the same float or
//    its neighbour.
//  - embedding.cu, peer_reduce.cu: float additions only, in the CPU's order: the same bits.
//  - layernorm.cu (LayerNorm, RMSNorm), softmax.cu (causal softmax): products that the CPU
//    rounds are written __fmul_rn, but the sums run in another order and expf is CUDA's
//    (within 2 ulp): tolerance 1e-5 of the largest value. The cross-entropy takes exp in float
//    once per logit where the CPU takes it in double: dlogits within 1e-5 of the largest, the
//    loss sum within 1e-6 relative (each exp within a few 1e-7; the sums in double). The fused
//    classifier (bf16 logits) also rescales its sums as the running largest grows: its bf16
//    dlogits within a bf16 neighbour, the loss sum within 1e-6 relative.
//  - reduce.cu: sum_squares in double in a fixed tree (contraction allowed: it only makes the
//    double sums more exact): 1e-10 relative. The hash: integers, exact.
//  - GEMM (cuBLAS, unaffected by these flags): another summation order, TF32 when asked: 1e-5
//    to 1e-4 of the largest value in fp32 (growing with k), 1e-2 with TF32.
// The kernels built with --fmad=false are bound by memory bandwidth, not arithmetic, so the
// unfused form is expected to cost little; bench/bench_kernels times add_bias and bias_grad.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/bf16.hpp"
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

// ---- Wide loads and stores -----------------------------------------------------------------
//
// Note [Wide loads in the element-wise kernels]
// A memory-bound kernel that moves one 2-byte bf16 per thread and instruction leaves most of
// each memory transaction's width to other instructions; GPUs move 16 bytes per thread in one
// instruction (LDG.128, STG.128). So the element-wise kernels that touch bf16 (to_bf16,
// from_bf16, add, add_bias, the activations, the optimisers' bf16 copy) take kPack = 8
// consecutive elements per thread: one 16-byte access of bf16, two of fp32. Each element is
// computed as before, on its own, with the same operations: the same bits as the one-element
// form and as the CPU. A pack needs every pointer 16-byte aligned (checked on the host:
// aligned16); a call whose pointers are not runs the one-element form throughout, and the
// last n % kPack elements of a wide call run one by one. tests/cuda/test_cuda_wide.cpp runs
// each kernel at sizes with a tail and on pointers one element off alignment.
constexpr int kPack = 8;

// Width<W>: W elements per step, 1 or kPack; bodies take it to size their registers.
template <int W>
struct Width {
  static constexpr int value = W;
};

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
template <class... P>
bool aligned16(const P*... p) {
  return (aligned16(static_cast<const void*>(p)) && ...);
}

// v[0..W) = p[0..W), widened from bf16 where p holds bf16; p 16-byte aligned when W = kPack.
template <int W>
__device__ inline void load(const float* p, float (&v)[W]) {
  if constexpr (W == kPack) {
    const float4 lo = reinterpret_cast<const float4*>(p)[0];
    const float4 hi = reinterpret_cast<const float4*>(p)[1];
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
    v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = p[k];
  }
}
template <int W>
__device__ inline void load(const std::uint16_t* p, float (&v)[W]) {
  if constexpr (W == kPack) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const unsigned words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = detail::bf16_to_float(static_cast<std::uint16_t>(words[k] & 0xFFFFu));
      v[2 * k + 1] = detail::bf16_to_float(static_cast<std::uint16_t>(words[k] >> 16));
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = detail::bf16_to_float(p[k]);
  }
}

// p[0..W) = v[0..W), rounded to bf16 (to nearest even) where p holds bf16.
template <int W>
__device__ inline void store(float* p, const float (&v)[W]) {
  if constexpr (W == kPack) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) p[k] = v[k];
  }
}
template <int W>
__device__ inline void store(std::uint16_t* p, const float (&v)[W]) {
  if constexpr (W == kPack) {
    unsigned words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      words[k] = unsigned(detail::float_to_bf16(v[2 * k])) |
                 (unsigned(detail::float_to_bf16(v[2 * k + 1])) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) p[k] = detail::float_to_bf16(v[k]);
  }
}

// Calls body(i, Width<W>{}) for the elements [i, i + W) of [0, n) this thread takes, grid
// stride: with `wide`, W = kPack over the whole packs, then W = 1 over the last n % kPack;
// otherwise W = 1 throughout. Each element belongs to exactly one call.
template <class Body>
__device__ void for_each_pack(std::size_t n, bool wide, const Body& body) {
  std::size_t done = 0;
  if (wide) {
    const std::size_t packs = n / kPack;
    for (std::size_t p = first_index(); p < packs; p += grid_stride())
      body(p * kPack, Width<kPack>{});
    done = packs * kPack;
  }
  for (std::size_t i = done + first_index(); i < n; i += grid_stride()) body(i, Width<1>{});
}

// ---- Grid sizes ---------------------------------------------------------------------------

// Blocks of an elementwise (grid-stride) kernel over n elements.
inline unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// Blocks of a for_each_pack kernel over n elements.
inline unsigned blocks_for_packs(std::size_t n, bool wide) {
  return blocks_for(wide ? (n + kPack - 1) / kPack : n);
}

// Blocks of the row kernels: one warp per row.
inline unsigned blocks_for_rows(std::size_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace lockstep::cuda
