// Optimiser kernels: one SGD or AdamW step, element by element, scaled by the step's clip factor
// and skipped on its flag, both read from the device (Note [One read per step]). The per-element update is
// common/elementwise_math.hpp, shared with the CPU device (src/cpu/ops/optimizer.cpp).
#include "common/bf16.hpp"
#include "common/elementwise_math.hpp"
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

// The clip factor from the step's control (1 without one); a skipped step reads as nothing to do.
__device__ bool step_skipped(const StepControlValues* control) { return control && control->skip; }
__device__ float clip_scale_of(const StepControlValues* control) {
  return control ? control->clip_scale : 1.0f;
}

__global__ void sgd_step_kernel(detail::SgdScalars s, const StepControlValues* control,
                                float* params, const float* grads, float* momentum_buf,
                                std::size_t n, std::uint16_t* params_bf16) {
  if (step_skipped(control)) return;
  const float scale = clip_scale_of(control);
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    detail::sgd_update(s, scale, params, grads, momentum_buf, i);
    if (params_bf16) params_bf16[i] = detail::float_to_bf16(params[i]);
  }
}

__global__ void adamw_step_kernel(AdamWScalars s, const StepControlValues* control,
                                  float* params, const float* grads, float* m, float* v,
                                  std::size_t n, std::uint16_t* params_bf16) {
  if (step_skipped(control)) return;
  const float scale = clip_scale_of(control);
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    detail::adamw_update(s, scale, params, grads, m, v, i);
    if (params_bf16) params_bf16[i] = detail::float_to_bf16(params[i]);
  }
}

}  // namespace

void launch_sgd_step(cudaStream_t stream, float lr, float momentum, float weight_decay,
                     bool nesterov, float* params, const float* grads, float* momentum_buf,
                     std::size_t n, const StepControlValues* control,
                     std::uint16_t* params_bf16) {
  if (n == 0) return;
  const detail::SgdScalars s{lr, momentum, weight_decay, nesterov};
  sgd_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, control, params, grads,
                                                          momentum_buf, n, params_bf16);
  CUDA_CHECK(cudaGetLastError());
}

void launch_adamw_step(cudaStream_t stream, const AdamWScalars& s, float* params,
                       const float* grads, float* m, float* v, std::size_t n,
                       const StepControlValues* control, std::uint16_t* params_bf16) {
  if (n == 0) return;
  adamw_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, control, params, grads, m, v, n,
                                                            params_bf16);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::cuda
