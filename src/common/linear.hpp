// Matrix products in either storage, and a fully connected map (LinearOps) as the composition of
// the Device's other ops: the CPU device's linear_forward and linear_backward, and the CUDA
// device's where cuBLASLt has no fused algorithm (Note [Fused linear] in lockstep/device.hpp).
#pragma once

#include <cstddef>
#include <stdexcept>

#include <fmt/format.h>

#include "lockstep/device.hpp"

namespace lockstep::detail {

// C = alpha op(A) op(B) + beta C in the operands' precision (both fp32, or both bf16).
inline void matmul(Device& dev, Transpose ta, Transpose tb, int m, int n, int k, MatIn a,
                   int lda, MatIn b, int ldb, float beta, float* c, int ldc, float alpha = 1.0f) {
  if (a.bf16)
    dev.gemm_bf16(ta, tb, m, n, k, alpha, a.bf16, lda, b.bf16, ldb, beta, c, ldc);
  else
    dev.gemm(ta, tb, m, n, k, alpha, a.f32, lda, b.f32, ldb, beta, c, ldc);
}

// The operands' storages agree and every pointer the call needs is there;
// std::invalid_argument naming the op otherwise.
inline void check_linear(const LinearForward& f) {
  const bool gelu = f.act == FusedActivation::gelu;
  const bool bf16_y = f.y.bf16 != nullptr;
  const bool bias_fits = bf16_y ? f.bias.bf16 && !f.bias.f32 : f.bias.f32 && !f.bias.bf16;
  const bool ok = f.rows >= 0 && f.in >= 1 && f.out >= 1 && bias_fits &&
                  (f.x.bf16 != nullptr) == (f.weight.bf16 != nullptr) &&
                  (f.y.f32 != nullptr) != bf16_y && (!bf16_y || f.product) &&
                  (gelu ? (bf16_y ? f.pre.bf16 != nullptr : f.pre.f32 != nullptr)
                        : !f.pre.f32 && !f.pre.bf16);
  if (!ok)
    throw std::invalid_argument(fmt::format(
        "linear_forward: bad operands (rows={} in={} out={}, {})", f.rows, f.in, f.out,
        gelu ? "gelu" : "no activation"));
}

// GELU's backward needs dx and pre, and dx_bf16 rounds a bf16 pre's gradient; without GELU,
// dbias_pre is not given, and dx_bf16 rounds dx under bf16 weights.
inline bool activation_operands_fit(const LinearBackward& b) {
  if (b.act != FusedActivation::gelu)
    return !b.dbias_pre && (!b.dx_bf16 || (b.dx && b.weight.bf16));
  return b.dx && (b.pre.f32 || b.pre.bf16) && (!b.dx_bf16 || b.pre.bf16);
}

inline void check_linear(const LinearBackward& b) {
  const bool bf16 = b.weight.bf16 != nullptr;
  const bool storage = (b.x.bf16 != nullptr) == bf16 && (b.g.bf16 != nullptr) == bf16;
  const bool ok = b.rows >= 0 && b.in >= 1 && b.out >= 1 && b.dweight && storage &&
                  (!b.dbias || b.dy) && activation_operands_fit(b);
  if (!ok)
    throw std::invalid_argument(fmt::format(
        "linear_backward: bad operands (rows={} in={} out={}, {})", b.rows, b.in, b.out,
        b.act == FusedActivation::gelu ? "gelu" : "no activation"));
}

// y = act(x weight^T + bias): the product into y (fp32, no activation), pre (fp32) or product
// (bf16), the bias (in y's storage) added in place or as it is rounded into place, then GELU
// reading pre as kept.
inline void compose_linear_forward(Device& dev, const LinearForward& f) {
  check_linear(f);
  const bool gelu = f.act == FusedActivation::gelu;
  const MatOut sum = gelu ? f.pre : f.y;  // where x weight^T + bias is kept
  float* c = sum.bf16 ? f.product : sum.f32;
  matmul(dev, Transpose::no, Transpose::yes, f.rows, f.out, f.in, f.x, f.in, f.weight, f.in, 0.0f,
         c, f.out);
  if (sum.bf16)
    dev.add_bias(c, f.bias.bf16, sum.bf16, f.rows, f.out);
  else
    dev.add_bias(c, f.bias.f32, f.rows, f.out);
  if (!gelu) return;
  const std::size_t n = std::size_t(f.rows) * std::size_t(f.out);
  if (sum.bf16)
    dev.activation_forward(Activation::gelu, f.pre.bf16, f.y.bf16, n);
  else
    dev.activation_forward(Activation::gelu, f.pre.f32, f.y.f32, n);
}

// dweight += g^T x, then dbias += column sums of dy.
inline void compose_weight_grad(Device& dev, const LinearBackward& b) {
  matmul(dev, Transpose::yes, Transpose::no, b.out, b.in, b.rows, b.g, b.out, b.x, b.in, 1.0f,
         b.dweight, b.in);
  if (b.dbias) dev.bias_grad(b.dbias, b.dy, b.rows, b.out);
}

// dx = g weight, and with act gelu GELU's backward on it (rounding into dx_bf16), then dbias_pre
// from the fp32 result; without GELU, dx rounded into dx_bf16 when that is set.
inline void compose_input_grad(Device& dev, const LinearBackward& b) {
  if (!b.dx) return;
  matmul(dev, Transpose::no, Transpose::no, b.rows, b.in, b.out, b.g, b.out, b.weight, b.in,
         0.0f, b.dx, b.in);
  const std::size_t n = std::size_t(b.rows) * std::size_t(b.in);
  if (b.act != FusedActivation::gelu) {
    if (b.dx_bf16) dev.to_bf16(b.dx, b.dx_bf16, n);
    return;
  }
  if (b.pre.bf16)
    dev.activation_backward(Activation::gelu, b.pre.bf16, b.dx, b.dx, b.dx_bf16, n);
  else
    dev.activation_backward(Activation::gelu, b.pre.f32, b.dx, b.dx, n);
  if (b.dbias_pre) dev.bias_grad(b.dbias_pre, b.dx, b.rows, b.in);
}

// The weight and bias gradients, then the input's: the order the layers ran them in before.
inline void compose_linear_backward(Device& dev, const LinearBackward& b) {
  check_linear(b);
  compose_weight_grad(dev, b);
  compose_input_grad(dev, b);
}

}  // namespace lockstep::detail
