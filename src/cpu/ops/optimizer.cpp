// Optimiser steps. The per-element update is common/elementwise_math.hpp, shared with the CUDA
// kernels (src/cuda/ops/optimizer.cu).
#include "cpu/cpu_device.hpp"

#include "common/bf16.hpp"
#include "common/elementwise_math.hpp"
#include "cpu/ops/isa_dispatch.hpp"

namespace lockstep::cpu {

void CpuDevice::sgd_step(const SgdParams& opt, float lr, float* params, const float* grads,
                         float* momentum_buf, std::size_t n, const StepControl* control,
                         std::uint16_t* params_bf16) {
  if (opt.momentum != 0.0f && !momentum_buf)
    throw std::invalid_argument("sgd_step: momentum needs a momentum buffer");
  if (control && control->skip) return;
  const detail::SgdScalars s{lr, opt.momentum, opt.weight_decay, opt.nesterov};
  const float scale = control ? control->clip_scale : 1.0f;
  // By value: a float captured by reference might alias params[i] as far as GCC knows, which
  // would keep it from hoisting the branches out of the loop and vectorising it.
  for_range(n, vectorized([=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i)
      detail::sgd_update(s, scale, params, grads, momentum_buf, i);
    if (params_bf16)
      for (std::size_t i = i0; i < i1; ++i) params_bf16[i] = detail::float_to_bf16(params[i]);
  }));
}

void CpuDevice::adamw_step(const AdamWParams& opt, float lr, std::int64_t t, float* params,
                           const float* grads, float* m, float* v, std::size_t n,
                           const StepControl* control, std::uint16_t* params_bf16) {
  if (t < 1) throw std::invalid_argument(fmt::format("adamw_step: step {} < 1", t));
  if (control && control->skip) return;
  const detail::AdamWScalars s =
      detail::adamw_scalars(opt.beta1, opt.beta2, opt.eps, opt.weight_decay, lr, t);
  const float scale = control ? control->clip_scale : 1.0f;
  for_range(n, vectorized([=](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) detail::adamw_update(s, scale, params, grads, m, v, i);
    if (params_bf16)
      for (std::size_t i = i0; i < i1; ++i) params_bf16[i] = detail::float_to_bf16(params[i]);
  }));
}

}  // namespace lockstep::cpu
