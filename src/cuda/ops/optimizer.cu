// Optimiser kernels: one SGD or AdamW step, element by element. The per-element update is
// common/elementwise_math.hpp, shared with the CPU device (src/cpu/ops/optimizer.cpp).
#include "common/elementwise_math.hpp"
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

__global__ void sgd_step_kernel(detail::SgdScalars s, float* params, const float* grads,
                                float* momentum_buf, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    detail::sgd_update(s, params, grads, momentum_buf, i);
}

__global__ void adamw_step_kernel(AdamWScalars s, float* params, const float* grads, float* m,
                                  float* v, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    detail::adamw_update(s, params, grads, m, v, i);
}

}  // namespace

void launch_sgd_step(cudaStream_t stream, float lr, float momentum, float weight_decay,
                     bool nesterov, float* params, const float* grads, float* momentum_buf,
                     std::size_t n) {
  if (n == 0) return;
  const detail::SgdScalars s{lr, momentum, weight_decay, nesterov};
  sgd_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, params, grads, momentum_buf, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_adamw_step(cudaStream_t stream, const AdamWScalars& s, float* params,
                       const float* grads, float* m, float* v, std::size_t n) {
  if (n == 0) return;
  adamw_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, params, grads, m, v, n);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::cuda
