// Building blocks shared by the layers: a fully connected map on rows.
//
// Shapes: x (rows, in), weight (out, in) as torch.nn.Linear, bias (out), y (rows, out).
// Backward accumulates into dweight and dbias (+=) and overwrites dx (=) unless told to add.
#pragma once

#include "lockstep/device.hpp"

namespace lockstep::detail {

// y = x * weight^T + bias
inline void linear_forward(Device& dev, const float* weight, const float* bias, const float* x,
                           float* y, int rows, int in, int out) {
  dev.gemm(Transpose::no, Transpose::yes, rows, out, in, 1.0f, x, in, weight, in, 0.0f, y, out);
  dev.add_bias(y, bias, rows, out);
}

// dweight (out, in) += dy^T * x; dbias (out) += column sums of dy; dx (rows, in) = dy * weight
// (+= when accumulate_dx), skipped when dx is null.
inline void linear_backward(Device& dev, const float* weight, float* dweight, float* dbias,
                            const float* x, const float* dy, float* dx, int rows, int in, int out,
                            bool accumulate_dx = false) {
  dev.gemm(Transpose::yes, Transpose::no, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dweight, in);
  dev.bias_grad(dbias, dy, rows, out);
  if (dx)
    dev.gemm(Transpose::no, Transpose::no, rows, in, out, 1.0f, dy, out, weight, in,
             accumulate_dx ? 1.0f : 0.0f, dx, in);
}

}  // namespace lockstep::detail
