// Elementwise kernels: fill, scale, add, the bias and its gradient, activations. The activation
// math is common/elementwise_math.hpp, shared with the CPU device (src/cpu/ops/elementwise.cpp).
#include "common/elementwise_math.hpp"
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

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

__device__ float activate(ActivationKind f, float x) {
  switch (f) {
    case ActivationKind::relu: return detail::relu(x);
    case ActivationKind::tanh: return detail::tanh_act(x);
    case ActivationKind::gelu: return detail::gelu(x);
  }
  return x;
}

__device__ float activate_grad(ActivationKind f, float x) {
  switch (f) {
    case ActivationKind::relu: return detail::relu_grad(x);
    case ActivationKind::tanh: return detail::tanh_grad(x);
    case ActivationKind::gelu: return detail::gelu_grad(x);
  }
  return 1.0f;
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

// y = a + b; y may alias a or b (each element is read, then written, by one thread).
__global__ void add_kernel(const float* a, const float* b, float* y, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) y[i] = a[i] + b[i];
}

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

}  // namespace

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

void launch_add(cudaStream_t stream, const float* a, const float* b, float* y, std::size_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, y, n);
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

}  // namespace lockstep::cuda
