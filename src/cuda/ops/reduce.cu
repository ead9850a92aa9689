// Whole-buffer reductions: the sum of squares (gradient norms) in two fixed-shape passes, and
// the replica hash (CPU: src/cpu/ops/reduce.cpp).
#include "common/elementwise_math.hpp"
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

// Pass 1 of sum_squares: grid of exactly kReduceBlocks blocks, one partial per block. Each
// thread takes its elements in grid-stride order, four loads at a time so that enough bytes are
// in flight to stream at full bandwidth; the adds stay in that order.
__global__ void sum_squares_kernel(const float* x, std::size_t n, double* partials) {
  const std::size_t stride = grid_stride();
  std::size_t i = first_index();
  double s = 0.0;
  for (; i < n && 3 * stride < n - i; i += 4 * stride) {  // i + 3 stride < n, without overflow
    const double a = x[i], b = x[i + stride], c = x[i + 2 * stride], d = x[i + 3 * stride];
    s += a * a;
    s += b * b;
    s += c * c;
    s += d * d;
  }
  for (; i < n; i += stride) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// Pass 2: one block sums `count` partials.
__global__ void sum_partials_kernel(const double* partials, int count, double* result) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *result = s;
}

// One block per grain: its threads stride through the grain, then one block_sum.
__global__ void sum_squares_grains_kernel(const float* x, std::size_t n, std::size_t grain,
                                          double* sums) {
  const std::size_t begin = static_cast<std::size_t>(blockIdx.x) * grain;
  const std::size_t end = begin + grain < n ? begin + grain : n;
  double s = 0.0;
  for (std::size_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) sums[blockIdx.x] = s;
}

// The grain sums added in order from 0, as the CPU adds them (the same bits), by one block:
// its threads load the next chunk of sums into shared memory, coalesced, while thread 0 adds
// the current one. One thread loading them itself, one dependent global load after another,
// took a fraction of a millisecond on the step's critical path at GPT-2 124M (about 7,600
// grains), ten times that at GPT-2 XL.
constexpr int kControlChunk = 1024;
__global__ void step_control_kernel(const double* grain_sums, std::size_t count, double clip,
                                    StepControlValues* control) {
  __shared__ double chunk[2][kControlChunk];
  const std::size_t chunks = (count + kControlChunk - 1) / kControlChunk;
  const auto load = [&](std::size_t c) {
    const std::size_t begin = c * kControlChunk;
    const std::size_t n = count - begin < kControlChunk ? count - begin : kControlChunk;
    for (std::size_t i = threadIdx.x; i < n; i += blockDim.x)
      chunk[c & 1][i] = grain_sums[begin + i];
  };
  if (chunks > 0) load(0);
  __syncthreads();
  double s = 0.0;
  for (std::size_t c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) load(c + 1);
    if (threadIdx.x == 0) {
      const std::size_t begin = c * kControlChunk;
      const std::size_t n = count - begin < kControlChunk ? count - begin : kControlChunk;
      for (std::size_t i = 0; i < n; ++i) s += chunk[c & 1][i];
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  const detail::StepScalars v = detail::step_scalars(s, clip);
  control->grad_norm = v.grad_norm;
  control->clip_scale = v.clip_scale;
  control->skip = v.skip;
}

// sum of hash_term(bits(x[i]), i) mod 2^64: per thread, per warp, then one atomic per warp.
__global__ void hash_kernel(const float* x, std::size_t n, unsigned long long* result) {
  unsigned long long h = 0;
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    h += detail::hash_term(__float_as_uint(x[i]), i);
  for (int offset = 16; offset > 0; offset /= 2) h += __shfl_down_sync(0xffffffffu, h, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(result, h);
}

}  // namespace

void launch_sum_squares(cudaStream_t stream, const float* x, std::size_t n, double* partials,
                        double* result) {
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream));
    return;
  }
  sum_squares_kernel<<<kReduceBlocks, kThreads, 0, stream>>>(x, n, partials);
  CUDA_CHECK(cudaGetLastError());
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(partials, kReduceBlocks, result);
  CUDA_CHECK(cudaGetLastError());
}

void launch_sum_squares_grains(cudaStream_t stream, const float* x, std::size_t n,
                               std::size_t grain, double* sums) {
  const std::size_t grains = (n + grain - 1) / grain;
  sum_squares_grains_kernel<<<static_cast<unsigned>(grains), kThreads, 0, stream>>>(x, n, grain,
                                                                                    sums);
  CUDA_CHECK(cudaGetLastError());
}

void launch_step_control(cudaStream_t stream, const double* grain_sums, std::size_t count,
                         double clip, StepControlValues* control) {
  step_control_kernel<<<1, kThreads, 0, stream>>>(grain_sums, count, clip, control);
  CUDA_CHECK(cudaGetLastError());
}

void launch_hash(cudaStream_t stream, const float* x, std::size_t n,
                 unsigned long long* result) {
  CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(unsigned long long), stream));
  if (n == 0) return;
  hash_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, result);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::cuda
