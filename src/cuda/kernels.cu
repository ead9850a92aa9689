// Every kernel of the CUDA backend, then their launchers (declared in kernels.hpp).
//
// Invariants:
//  - Each kernel computes what the CPU device computes (src/cpu/cpu_device.cpp), in the same
//    precision; tests/cuda/test_cuda.cpp compares them on random inputs.
//  - Elementwise kernels use grid-stride loops, so any grid size gives the same result.
//  - Reductions that produce floating-point values sum in an order fixed by the shape alone
//    (fixed block size, fixed grid, fixed tree), never by atomics: the same inputs give the same
//    bits on every run and every GPU. Only the integer hash uses atomics (addition mod 2^64 is
//    associative, so the order does not matter).
//  - Every block has exactly kThreads threads (block_sum relies on it).
#include <algorithm>
#include <climits>
#include <cmath>

#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/random.cuh"

namespace lockstep::cuda {
namespace {

constexpr std::size_t kMaxBlocks = 4096;  // elementwise grids: enough to fill any current GPU

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

__device__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// The sum of every thread's v, added in a fixed tree order; every thread receives it.
__device__ double block_sum(double v) {
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

// ---- Activations: f(x) and f'(x), as on the CPU -------------------------------------------------

__device__ float activate(ActivationKind f, float x) {
  switch (f) {
    case ActivationKind::relu:
      return x > 0.0f ? x : 0.0f;
    case ActivationKind::tanh:
      return tanhf(x);
    case ActivationKind::gelu:  // tanh approximation: 0.5 x (1 + tanh(c (x + a x^3)))
      return 0.5f * x * (1.0f + tanhf(kGeluC * (x + kGeluA * x * x * x)));
  }
  return x;
}

__device__ float activate_grad(ActivationKind f, float x) {
  switch (f) {
    case ActivationKind::relu:
      return x > 0.0f ? 1.0f : 0.0f;
    case ActivationKind::tanh: {
      const float t = tanhf(x);
      return 1.0f - t * t;
    }
    case ActivationKind::gelu: {
      const float t = tanhf(kGeluC * (x + kGeluA * x * x * x));
      return 0.5f * (1.0f + t) +
             0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
    }
  }
  return 1.0f;
}

// ---- Elementwise kernels ------------------------------------------------------------------------

__global__ void fill_kernel(float* x, float value, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] = value;
}

__global__ void scale_kernel(float* x, float alpha, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] *= alpha;
}

// y (rows, cols) += bias (cols); n = rows * cols
__global__ void add_bias_kernel(float* y, const float* bias, std::size_t cols, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) y[i] += bias[i % cols];
}

__global__ void activation_forward_kernel(ActivationKind f, const float* x, float* y,
                                          std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) y[i] = activate(f, x[i]);
}

__global__ void activation_backward_kernel(ActivationKind f, const float* x, const float* dy,
                                           float* dx, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    dx[i] = dy[i] * activate_grad(f, x[i]);
}

// ---- Reduction kernels --------------------------------------------------------------------------

// One thread per column: dbias[c] = float(dbias[c] + dy[0][c] + dy[1][c] + ...) in double, rows
// in order, exactly as the CPU device. Neighbouring threads read neighbouring columns. There are
// only `cols` threads, so each keeps 16 loads in flight (the adds stay in row order).
__global__ void bias_grad_kernel(float* dbias, const float* dy, int rows, int cols) {
  const int c = static_cast<int>(first_index());
  if (c >= cols) return;
  double acc = dbias[c];
#pragma unroll 16
  for (int r = 0; r < rows; ++r) acc += dy[static_cast<std::size_t>(r) * cols + c];
  dbias[c] = static_cast<float>(acc);
}

// One block per row of logits (rows, classes): argmax, log-sum-exp in double, the row's loss and
// correctness into row_loss / row_correct, and optionally the row of dlogits.
__global__ void softmax_xent_rows_kernel(const float* logits, const std::int32_t* labels,
                                         int classes, float* dlogits, float grad_scale,
                                         double* row_loss, int* row_correct, LossResult* result) {
  const int row = blockIdx.x;
  const int label = labels[row];
  if (label < 0 || label >= classes) {  // the same for the whole block: no thread is left waiting
    if (threadIdx.x == 0) {
      atomicMin(&result->bad_row, row);
      row_loss[row] = 0.0;
      row_correct[row] = 0;
    }
    return;
  }
  const float* z = logits + static_cast<std::size_t>(row) * classes;

  // argmax: the first index of the largest value, as the CPU's scan with a strict '>' finds it.
  __shared__ float best_value[kThreads];
  __shared__ int best_index[kThreads];
  float bv = 0.0f;
  int bi = INT_MAX;  // INT_MAX: this thread has seen nothing yet
  for (int j = threadIdx.x; j < classes; j += kThreads)
    if (bi == INT_MAX || z[j] > bv) {
      bv = z[j];
      bi = j;
    }
  best_value[threadIdx.x] = bv;
  best_index[threadIdx.x] = bi;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float ov = best_value[threadIdx.x + stride], mv = best_value[threadIdx.x];
      const int oi = best_index[threadIdx.x + stride], mi = best_index[threadIdx.x];
      if (oi != INT_MAX && (mi == INT_MAX || ov > mv || (ov == mv && oi < mi))) {
        best_value[threadIdx.x] = ov;
        best_index[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  const int argmax = best_index[0];
  const double zmax = z[argmax];

  double partial = 0.0;
  for (int j = threadIdx.x; j < classes; j += kThreads) partial += exp(double(z[j]) - zmax);
  const double sum = block_sum(partial);

  if (threadIdx.x == 0) {
    row_loss[row] = log(sum) - (double(z[label]) - zmax);  // logsumexp - z[label]
    row_correct[row] = argmax == label ? 1 : 0;
  }
  if (!dlogits) return;
  float* d = dlogits + static_cast<std::size_t>(row) * classes;
  for (int j = threadIdx.x; j < classes; j += kThreads) {
    const double p = exp(double(z[j]) - zmax) / sum - (j == label ? 1.0 : 0.0);
    d[j] = static_cast<float>(p * grad_scale);
  }
}

// One block: the rows' losses and correct counts, summed in a fixed order.
__global__ void softmax_xent_total_kernel(const double* row_loss, const int* row_correct,
                                          const std::int32_t* labels, int rows,
                                          LossResult* result) {
  double loss = 0.0, correct = 0.0;
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    loss += row_loss[r];
    correct += row_correct[r];
  }
  loss = block_sum(loss);
  correct = block_sum(correct);  // exact: integers far below 2^53
  if (threadIdx.x == 0) {
    result->loss_sum = loss;
    result->correct = static_cast<long long>(correct);
    const int bad = result->bad_row;
    result->bad_label = bad < rows ? labels[bad] : 0;
  }
}

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

// sum of mix64(bits(x[i]) ^ mix64(i)) mod 2^64: per thread, per warp, then one atomic per warp.
__global__ void hash_kernel(const float* x, std::size_t n, unsigned long long* result) {
  unsigned long long h = 0;
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    h += mix64(static_cast<std::uint64_t>(__float_as_uint(x[i])) ^ mix64(i));
  for (int offset = 16; offset > 0; offset /= 2) h += __shfl_down_sync(0xffffffffu, h, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(result, h);
}

// ---- Optimiser kernels (the CPU device's loops, element by element) ----------------------------

__global__ void sgd_step_kernel(float lr, float mu, float wd, bool nesterov, float* params,
                                const float* grads, float* momentum_buf, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float g = grads[i];
    if (wd != 0.0f) g += wd * params[i];
    if (mu != 0.0f) {
      const float buf = momentum_buf[i] = mu * momentum_buf[i] + g;
      g = nesterov ? g + mu * buf : buf;
    }
    params[i] -= lr * g;
  }
}

__global__ void adamw_step_kernel(AdamWScalars s, float* params, const float* grads, float* m,
                                  float* v, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float g = grads[i];
    const float mi = m[i] = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float vi = v[i] = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    params[i] = params[i] * s.decay - s.step_size * (mi / denom);
  }
}

// ---- Peer all-reduce ----------------------------------------------------------------------------

__global__ void peer_reduce_kernel(PeerSlices slices, int ranks, float* out, std::size_t n,
                                   bool average, float inv) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float acc = slices.src[0][i];
    for (int r = 1; r < ranks; ++r) acc += slices.src[r][i];
    if (average) acc *= inv;
    out[i] = acc;
  }
}

// ---- Launch helpers -----------------------------------------------------------------------------

unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min((n + kThreads - 1) / kThreads, kMaxBlocks));
}

}  // namespace

// ---- Launchers ----------------------------------------------------------------------------------

void launch_fill(cudaStream_t stream, float* x, float value, std::size_t n) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, value, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_scale(cudaStream_t stream, float* x, float alpha, std::size_t n) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, alpha, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_add_bias(cudaStream_t stream, float* y, const float* bias, int rows, int cols) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (n == 0) return;
  add_bias_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, bias, cols, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_activation_forward(cudaStream_t stream, ActivationKind f, const float* x, float* y,
                               std::size_t n) {
  if (n == 0) return;
  activation_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(f, x, y, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_activation_backward(cudaStream_t stream, ActivationKind f, const float* x,
                                const float* dy, float* dx, std::size_t n) {
  if (n == 0) return;
  activation_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(f, x, dy, dx, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_bias_grad(cudaStream_t stream, float* dbias, const float* dy, int rows, int cols) {
  if (cols <= 0) return;
  const unsigned blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
  bias_grad_kernel<<<blocks, kThreads, 0, stream>>>(dbias, dy, rows, cols);
  CUDA_CHECK(cudaGetLastError());
}

void launch_softmax_cross_entropy(cudaStream_t stream, const float* logits,
                                  const std::int32_t* labels, int rows, int classes,
                                  float* dlogits, float grad_scale, double* row_loss,
                                  int* row_correct, LossResult* result) {
  // bad_row starts above any row (0x7f7f7f7f); the row kernel lowers it with atomicMin.
  CUDA_CHECK(cudaMemsetAsync(&result->bad_row, 0x7f, sizeof(int), stream));
  if (rows > 0) {
    softmax_xent_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, labels, classes, dlogits, grad_scale, row_loss, row_correct, result);
    CUDA_CHECK(cudaGetLastError());
  }
  softmax_xent_total_kernel<<<1, kThreads, 0, stream>>>(row_loss, row_correct, labels, rows,
                                                        result);
  CUDA_CHECK(cudaGetLastError());
}

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

void launch_hash(cudaStream_t stream, const float* x, std::size_t n,
                 unsigned long long* result) {
  CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(unsigned long long), stream));
  if (n == 0) return;
  hash_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, result);
  CUDA_CHECK(cudaGetLastError());
}

void launch_sgd_step(cudaStream_t stream, float lr, float momentum, float weight_decay,
                     bool nesterov, float* params, const float* grads, float* momentum_buf,
                     std::size_t n) {
  if (n == 0) return;
  sgd_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(lr, momentum, weight_decay, nesterov,
                                                          params, grads, momentum_buf, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_adamw_step(cudaStream_t stream, const AdamWScalars& s, float* params,
                       const float* grads, float* m, float* v, std::size_t n) {
  if (n == 0) return;
  adamw_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, params, grads, m, v, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_peer_reduce(cudaStream_t stream, const PeerSlices& slices, int ranks, float* out,
                        std::size_t n, bool average) {
  if (n == 0) return;
  const float inv = 1.0f / static_cast<float>(ranks);
  peer_reduce_kernel<<<blocks_for(n), kThreads, 0, stream>>>(slices, ranks, out, n, average, inv);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::cuda
