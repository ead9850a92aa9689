// LayerNorm, forward and backward (CUDA: src/cuda/ops/layernorm.cu).
#include "cpu/cpu_device.hpp"

#include <cmath>

#include "common/bf16.hpp"
#include "cpu/ops/isa_dispatch.hpp"

namespace lockstep::cpu {

template <class Y>
void CpuDevice::layernorm_forward_of(const float* x, const float* weight, const float* bias, Y* y,
                                     float* mean, float* rstd, int rows, int C) {
  const std::size_t nc = static_cast<std::size_t>(C), nr = static_cast<std::size_t>(rows);
  const std::size_t block = rows_per_block(nc);
  for_blocks(blocks_of(nr, block), vectorized([=](std::size_t blk) {
    for (std::size_t r = blk * block; r < std::min(nr, (blk + 1) * block); ++r) {
      const float* xr = x + r * nc;
      double sum = 0.0;
      for (std::size_t c = 0; c < nc; ++c) sum += xr[c];
      const double mu = sum / double(nc);
      double var = 0.0;
      for (std::size_t c = 0; c < nc; ++c) var += (xr[c] - mu) * (xr[c] - mu);
      const float m = static_cast<float>(mu);
      const float s = static_cast<float>(1.0 / std::sqrt(var / double(nc) + 1e-5));
      Y* yr = y + r * nc;
      for (std::size_t c = 0; c < nc; ++c)
        detail::store_value(&yr[c], (xr[c] - m) * s * weight[c] + bias[c]);
      mean[r] = m;
      rstd[r] = s;
    }
  }));
}

void CpuDevice::layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                                  float* mean, float* rstd, int rows, int C) {
  layernorm_forward_of(x, weight, bias, y, mean, rstd, rows, C);
}

void CpuDevice::layernorm_forward(const float* x, const float* weight, const float* bias,
                                  std::uint16_t* y, float* mean, float* rstd, int rows, int C) {
  layernorm_forward_of(x, weight, bias, y, mean, rstd, rows, C);
}

// With xhat = (x - mean) * rstd and g = dy * weight:
//   dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),
//   dweight += sum_r dy * xhat, dbias += sum_r dy (rows in order, per block of columns).
void CpuDevice::layernorm_backward(const float* x, const float* weight, const float* mean,
                                   const float* rstd, const float* dy, float* dx, float* dweight,
                                   float* dbias, int rows, int C) {
  constexpr std::size_t kCols = 64;
  const std::size_t nc = static_cast<std::size_t>(C), nr = static_cast<std::size_t>(rows);
  const std::size_t block = rows_per_block(nc);
  for_blocks(blocks_of(nr, block), vectorized([=](std::size_t blk) {
    for (std::size_t r = blk * block; r < std::min(nr, (blk + 1) * block); ++r) {
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
      float* dxr = dx + r * nc;
      for (std::size_t c = 0; c < nc; ++c) {
        const float xhat = (xr[c] - mean[r]) * rstd[r];
        dxr[c] += rstd[r] * (dyr[c] * weight[c] - g_mean - xhat * gx_mean);
      }
    }
  }));
  for_blocks(blocks_of(nc, kCols), vectorized([=](std::size_t blk) {
    const std::size_t c0 = blk * kCols, c1 = std::min(nc, c0 + kCols);
    double dw[kCols] = {}, db[kCols] = {};
    for (std::size_t r = 0; r < nr; ++r)
      for (std::size_t c = c0; c < c1; ++c) {
        const float d = dy[r * nc + c];
        dw[c - c0] += double(d) * ((x[r * nc + c] - mean[r]) * rstd[r]);
        db[c - c0] += d;
      }
    for (std::size_t c = c0; c < c1; ++c) {
      dweight[c] += static_cast<float>(dw[c - c0]);
      dbias[c] += static_cast<float>(db[c - c0]);
    }
  }));
}

}  // namespace lockstep::cpu
