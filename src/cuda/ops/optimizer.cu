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

// Packs of kPack elements per thread where the pointers allow (Note [Wide loads in the
// element-wise kernels] in common.cuh): the operands are loaded into registers, updated there by
// the same per-element function at indices 0..W-1, and stored, the bf16 copy as 16 bytes.
__global__ void sgd_step_kernel(detail::SgdScalars s, const StepControlValues* control,
                                float* params, const float* grads, float* momentum_buf,
                                std::size_t n, std::uint16_t* params_bf16, bool wide) {
  if (step_skipped(control)) return;
  const float scale = clip_scale_of(control);
  for_each_pack(n, wide, [&](std::size_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float p[W], g[W], buf[W] = {};
    load(params + i, p);
    load(grads + i, g);
    if (momentum_buf) load(momentum_buf + i, buf);
    float* const b = momentum_buf ? buf : nullptr;
#pragma unroll
    for (int k = 0; k < W; ++k) detail::sgd_update(s, scale, p, g, b, k);
    store(params + i, p);
    if (momentum_buf) store(momentum_buf + i, buf);
    if (params_bf16) store(params_bf16 + i, p);
  });
}

__global__ void adamw_step_kernel(AdamWScalars s, const StepControlValues* control,
                                  float* params, const float* grads, float* m, float* v,
                                  std::size_t n, std::uint16_t* params_bf16, bool wide) {
  if (step_skipped(control)) return;
  const float scale = clip_scale_of(control);
  for_each_pack(n, wide, [&](std::size_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float p[W], g[W], mi[W], vi[W];
    load(params + i, p);
    load(grads + i, g);
    load(m + i, mi);
    load(v + i, vi);
#pragma unroll
    for (int k = 0; k < W; ++k) detail::adamw_update(s, scale, p, g, mi, vi, k);
    store(params + i, p);
    store(m + i, mi);
    store(v + i, vi);
    if (params_bf16) store(params_bf16 + i, p);
  });
}

}  // namespace

void launch_sgd_step(cudaStream_t stream, float lr, float momentum, float weight_decay,
                     bool nesterov, float* params, const float* grads, float* momentum_buf,
                     std::size_t n, const StepControlValues* control,
                     std::uint16_t* params_bf16) {
  if (n == 0) return;
  const detail::SgdScalars s{lr, momentum, weight_decay, nesterov};
  const bool wide = aligned16(params, grads, momentum_buf, params_bf16);  // null is aligned
  sgd_step_kernel<<<blocks_for_packs(n, wide), kThreads, 0, stream>>>(
      s, control, params, grads, momentum_buf, n, params_bf16, wide);
  CUDA_CHECK(cudaGetLastError());
}

void launch_adamw_step(cudaStream_t stream, const AdamWScalars& s, float* params,
                       const float* grads, float* m, float* v, std::size_t n,
                       const StepControlValues* control, std::uint16_t* params_bf16) {
  if (n == 0) return;
  const bool wide = aligned16(params, grads, m, v, params_bf16);  // a null params_bf16 is aligned
  adamw_step_kernel<<<blocks_for_packs(n, wide), kThreads, 0, stream>>>(
      s, control, params, grads, m, v, n, params_bf16, wide);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::cuda
