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

// One thread: the grain sums added in order from 0, as the CPU adds them.
__global__ void step_control_kernel(const double* grain_sums, std::size_t count, double clip,
                                    StepControlValues* control) {
  double s = 0.0;
  for (std::size_t g = 0; g < count; ++g) s += grain_sums[g];
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
  step_control_kernel<<<1, 1, 0, stream>>>(grain_sums, count, clip, control);
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
