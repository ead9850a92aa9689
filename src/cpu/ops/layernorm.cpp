// LayerNorm and RMSNorm, forward and backward, each with the residual add fused (CUDA:
// src/cuda/ops/layernorm.cu).
#include "cpu/cpu_device.hpp"

#include <cmath>

#include "common/bf16.hpp"
#include "cpu/ops/isa_dispatch.hpp"

namespace lockstep::cpu {

// Note [Residual LayerNorm]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A GPT block's residual stream meets a LayerNorm twice per step: forward, res1 = x + attn(...)
// is ln_2's input; backward, ln_2's and ln_1's input gradients are added to the residual's.
// Done as separate ops these were an add (or a copy) and the LayerNorm, two passes over the
// (rows, C) stream; residual_layernorm_forward and residual_layernorm_backward make them one
// row by row, the row still in cache when the LayerNorm reads it. They compute what the
// separate ops computed, in their order: the sum a + b is the add's (one IEEE addition, so
// a + b and b + a agree), and the LayerNorm's sums then read the stored sum; backward adds
// dresidual + the LayerNorm's term as the copy followed by `dx +=` did. So neither precision's
// bits change (the fp32 and bf16 gpt_tiny runs are unchanged). The same pass also writes the
// bf16 copy of dx that the next products read (dx_bf16), instead of a to_bf16 pass of its own.
//
// The element-wise passes of a bf16 GPT block, per layer, on the CUDA path (cuBLASLt's
// epilogues take the bias adds, GELU and the bias gradients), counted before issue 25 and after:
//                                before                          after
//   forward   residual add       2 (res1 = x + attn, out = ...)  1 (out; the sum of res1 is
//                                                                   ln_2's forward)
//             to_bf16            1 (atty, materialised attention) 1
//   backward  copy               2 (dout -> d res1, d res1 -> din) 0 (the LayerNorms' dresidual)
//             to_bf16            4 (dout, d res1, d atty, d qkv)  2 (dout, d qkv)
//   total                        9                               4
// d res1's rounding is now ln_2's backward (dx_bf16), d atty's the attention projection's
// product writing its input gradient in bf16 (LinearBackward::dx_bf16). The fused attention
// path has no atty pass: 8 before, 3 after. What is left crosses the layer's interface (the
// block's output add, the rounding of its dout) or belongs to attention (d qkv, atty). Per
// step, L layers of these, plus the LM head's two to_bf16 (its input, and its logits chunk by
// chunk), unchanged. The CPU composes the linear maps from passes (Note [Fused linear]), so
// there d atty is still rounded by a to_bf16 pass, inside linear_backward: it saves the two
// copies, one add and one to_bf16 per layer.

// Note [RMSNorm]
// ~~~~~~~~~~~~~~
// A Llama-family decoder normalises by the root mean square alone, with a weight and no bias:
// y = x * rstd * weight, rstd = 1 / sqrt(mean_c(x^2) + eps), eps a model key (rms_norm_eps).
// transformers' LlamaRMSNorm computes it in fp32 (weight * (x * rsqrt(mean(x^2) + eps))): here
// the sum of squares is taken in double, each square exact, and rstd rounded to float once,
// so rstd is within an ulp of the exact value and y within two roundings of the products,
// (x * rstd) * weight in transformers' order: well inside the 1e-5 relative the parity tests
// ask. The residual add is fused as the LayerNorm's (Note [Residual LayerNorm]): the same
// helpers write sum and, backward, dresidual + the norm's term and its bf16 rounding. With
// xhat = x * rstd and g = dy * weight, backward is LayerNorm's without the mean's term:
//   dx = dresidual + rstd * (g - xhat * mean_c(g * xhat)),  dweight += sum_r dy * xhat.
// xhat is computed as (x - 0) * rstd by the weight gradient LayerNorm shares (exactly x * rstd).

namespace {

// Row r of a norm's input: a's, or a + b stored into sum's row (the residual add).
inline const float* residual_row(const float* a, const float* b, float* sum, std::size_t r,
                                 std::size_t nc) {
  const float* xr = a + r * nc;
  if (!b) return xr;
  // The add's loop, in place when sum aliases an operand (as CpuDevice::map: GCC vectorises two
  // arrays that may overlap behind a check that exact aliasing fails).
  float* sr = sum + r * nc;
  const float* br = b + r * nc;
  if (sr == xr)
    for (std::size_t c = 0; c < nc; ++c) sr[c] += br[c];
  else if (sr == br)
    for (std::size_t c = 0; c < nc; ++c) sr[c] += xr[c];
  else
    for (std::size_t c = 0; c < nc; ++c) sr[c] = xr[c] + br[c];
  return sr;
}

// dx's row = dresidual's row + term(c), or 0 + term(c) without one (as dx zeroed, then +=:
// 0 + (-0) is +0); rounded into dx_bf16's row too when that is not null.
template <class Term>
inline void write_dx_row(const float* dres, float* dxr, std::uint16_t* dx_bf16,
                         std::size_t nc, const Term& term) {
  if (!dres)
    for (std::size_t c = 0; c < nc; ++c) dxr[c] = 0.0f + term(c);
  else if (dres == dxr)  // in place: see residual_row
    for (std::size_t c = 0; c < nc; ++c) dxr[c] += term(c);
  else
    for (std::size_t c = 0; c < nc; ++c) dxr[c] = dres[c] + term(c);
  if (dx_bf16)
    for (std::size_t c = 0; c < nc; ++c) dx_bf16[c] = detail::float_to_bf16(dxr[c]);
}

}  // namespace

// One row of y (C) = LayerNorm(x) with x = a (+ b, stored into sum when b is not null).
template <class Y>
void CpuDevice::layernorm_forward_of(const float* a, const float* b, float* sum,
                                     const float* weight, const float* bias, Y* y, float* mean,
                                     float* rstd, int rows, int C) {
  const std::size_t nc = static_cast<std::size_t>(C), nr = static_cast<std::size_t>(rows);
  for_rows(nr, nc, [=](std::size_t r) {
    const float* xr = residual_row(a, b, sum, r, nc);
    double total = 0.0;
    for (std::size_t c = 0; c < nc; ++c) total += xr[c];
    const double mu = total / double(nc);
    double var = 0.0;
    for (std::size_t c = 0; c < nc; ++c) var += (xr[c] - mu) * (xr[c] - mu);
    const float m = static_cast<float>(mu);
    const float s = static_cast<float>(1.0 / std::sqrt(var / double(nc) + 1e-5));
    Y* yr = y + r * nc;
    for (std::size_t c = 0; c < nc; ++c)
      detail::store_value(&yr[c], (xr[c] - m) * s * weight[c] + bias[c]);
    mean[r] = m;
    rstd[r] = s;
  });
}

void CpuDevice::layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                                  float* mean, float* rstd, int rows, int C) {
  layernorm_forward_of(x, nullptr, nullptr, weight, bias, y, mean, rstd, rows, C);
}

void CpuDevice::layernorm_forward(const float* x, const float* weight, const float* bias,
                                  std::uint16_t* y, float* mean, float* rstd, int rows, int C) {
  layernorm_forward_of(x, nullptr, nullptr, weight, bias, y, mean, rstd, rows, C);
}

void CpuDevice::residual_layernorm_forward(const float* a, const float* b, float* sum,
                                           const float* weight, const float* bias, float* y,
                                           float* mean, float* rstd, int rows, int C) {
  layernorm_forward_of(a, b, sum, weight, bias, y, mean, rstd, rows, C);
}

void CpuDevice::residual_layernorm_forward(const float* a, const float* b, float* sum,
                                           const float* weight, const float* bias,
                                           std::uint16_t* y, float* mean, float* rstd, int rows,
                                           int C) {
  layernorm_forward_of(a, b, sum, weight, bias, y, mean, rstd, rows, C);
}

void CpuDevice::layernorm_backward(const float* x, const float* weight, const float* mean,
                                   const float* rstd, const float* dy, float* dx, float* dweight,
                                   float* dbias, int rows, int C) {
  residual_layernorm_backward(x, weight, mean, rstd, dy, dx, dx, nullptr, dweight, dbias, rows,
                              C);
}

// With xhat = (x - mean) * rstd and g = dy * weight:
//   dx = dresidual + rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),
//   dweight += sum_r dy * xhat, dbias += sum_r dy (rows in order, per block of columns).
void CpuDevice::residual_layernorm_backward(const float* x, const float* weight,
                                            const float* mean, const float* rstd, const float* dy,
                                            const float* dresidual, float* dx,
                                            std::uint16_t* dx_bf16, float* dweight, float* dbias,
                                            int rows, int C) {
  const std::size_t nc = static_cast<std::size_t>(C), nr = static_cast<std::size_t>(rows);
  for_rows(nr, nc, [=](std::size_t r) {
    const float* xr = x + r * nc;
    const float* dyr = dy + r * nc;
    double g_sum = 0.0, gx_sum = 0.0;
    for (std::size_t c = 0; c < nc; ++c) {
      const float g = dyr[c] * weight[c];
      g_sum += g;
      gx_sum += double(g) * ((xr[c] - mean[r]) * rstd[r]);
    }
    const float g_mean = static_cast<float>(g_sum / double(nc));
    const float gx_mean = static_cast<float>(gx_sum / double(nc));
    write_dx_row(dresidual ? dresidual + r * nc : nullptr, dx + r * nc,
                 dx_bf16 ? dx_bf16 + r * nc : nullptr, nc, [&](std::size_t c) {
                   const float xhat = (xr[c] - mean[r]) * rstd[r];
                   return rstd[r] * (dyr[c] * weight[c] - g_mean - xhat * gx_mean);
                 });
  });
  norm_param_grads(x, mean, rstd, dy, dweight, dbias, rows, C);
}

// dweight (C) += sum_r dy * xhat with xhat = (x - mean) * rstd (mean null: 0, RMSNorm's), and
// dbias += sum_r dy when not null: rows in order, in double, per block of columns.
void CpuDevice::norm_param_grads(const float* x, const float* mean, const float* rstd,
                                 const float* dy, float* dweight, float* dbias, int rows, int C) {
  constexpr std::size_t kCols = 64;
  const std::size_t nc = static_cast<std::size_t>(C), nr = static_cast<std::size_t>(rows);
  for_blocks(blocks_of(nc, kCols), vectorized([=](std::size_t blk) {
    const std::size_t c0 = blk * kCols, c1 = std::min(nc, c0 + kCols);
    double dw[kCols] = {}, db[kCols] = {};
    for (std::size_t r = 0; r < nr; ++r) {
      const float m = mean ? mean[r] : 0.0f;
      for (std::size_t c = c0; c < c1; ++c) {
        const float d = dy[r * nc + c];
        dw[c - c0] += double(d) * ((x[r * nc + c] - m) * rstd[r]);
        db[c - c0] += d;
      }
    }
    for (std::size_t c = c0; c < c1; ++c) {
      dweight[c] += static_cast<float>(dw[c - c0]);
      if (dbias) dbias[c] += static_cast<float>(db[c - c0]);
    }
  }));
}

// ---- RMSNorm (Note [RMSNorm]) ----------------------------------------------------------------

// One row of y (C) = RMSNorm(x) with x = a (+ b, stored into sum when b is not null).
template <class Y>
void CpuDevice::rmsnorm_forward_of(const float* a, const float* b, float* sum,
                                   const float* weight, Y* y, float* rstd, int rows, int C,
                                   float eps) {
  const std::size_t nc = static_cast<std::size_t>(C), nr = static_cast<std::size_t>(rows);
  for_rows(nr, nc, [=](std::size_t r) {
    const float* xr = residual_row(a, b, sum, r, nc);
    double squares = 0.0;
    for (std::size_t c = 0; c < nc; ++c) squares += double(xr[c]) * double(xr[c]);
    const float s = static_cast<float>(1.0 / std::sqrt(squares / double(nc) + double(eps)));
    Y* yr = y + r * nc;
    for (std::size_t c = 0; c < nc; ++c) detail::store_value(&yr[c], xr[c] * s * weight[c]);
    rstd[r] = s;
  });
}

void CpuDevice::residual_rmsnorm_forward(const float* a, const float* b, float* sum,
                                         const float* weight, float* y, float* rstd, int rows,
                                         int C, float eps) {
  rmsnorm_forward_of(a, b, sum, weight, y, rstd, rows, C, eps);
}

void CpuDevice::residual_rmsnorm_forward(const float* a, const float* b, float* sum,
                                         const float* weight, std::uint16_t* y, float* rstd,
                                         int rows, int C, float eps) {
  rmsnorm_forward_of(a, b, sum, weight, y, rstd, rows, C, eps);
}

// dx = dresidual + rstd * (g - xhat * mean_c(g * xhat)), g = dy * weight, xhat = x * rstd.
void CpuDevice::residual_rmsnorm_backward(const float* x, const float* weight, const float* rstd,
                                          const float* dy, const float* dresidual, float* dx,
                                          std::uint16_t* dx_bf16, float* dweight, int rows,
                                          int C) {
  const std::size_t nc = static_cast<std::size_t>(C), nr = static_cast<std::size_t>(rows);
  for_rows(nr, nc, [=](std::size_t r) {
    const float* xr = x + r * nc;
    const float* dyr = dy + r * nc;
    const float s = rstd[r];
    double gx_sum = 0.0;
    for (std::size_t c = 0; c < nc; ++c) gx_sum += double(dyr[c] * weight[c]) * (xr[c] * s);
    const float gx_mean = static_cast<float>(gx_sum / double(nc));
    write_dx_row(dresidual ? dresidual + r * nc : nullptr, dx + r * nc,
                 dx_bf16 ? dx_bf16 + r * nc : nullptr, nc, [&](std::size_t c) {
                   return s * (dyr[c] * weight[c] - (xr[c] * s) * gx_mean);
                 });
  });
  norm_param_grads(x, nullptr, rstd, dy, dweight, nullptr, rows, C);
}

}  // namespace lockstep::cpu
