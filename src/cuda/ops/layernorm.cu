// LayerNorm and RMSNorm, forward and backward, each with the residual add fused (CPU:
// src/cpu/ops/layernorm.cpp, Notes [Residual LayerNorm] and [RMSNorm]).
//
// Per-row reductions use a fixed warp butterfly (every lane ends with the same bits); the weight
// and bias gradients go through per-block partials and a second pass, never atomics.
#include <cmath>

#include "common/bf16.hpp"
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

constexpr int kLayerNormChunk = 256;  // rows per partial of LayerNorm's dweight / dbias

// The row of a norm's input x: a's, or with b not null a + b stored into sum's first (each lane
// writes, then reads back, only its own columns, so the row needs no barrier). Calls read(v) on
// each of this lane's values of it, in order.
template <class Read>
__device__ const float* residual_row(const float* a, const float* b, float* sum, std::size_t row,
                                     int C, Read read) {
  const float* xr = a + row * C;
  if (!b) {
    for (int c = lane(); c < C; c += kWarp) read(xr[c]);
    return xr;
  }
  float* sr = sum + row * C;
  const float* br = b + row * C;
  for (int c = lane(); c < C; c += kWarp) {
    const float v = xr[c] + br[c];
    sr[c] = v;
    read(v);
  }
  return sr;
}

// One warp per row of x (rows, C): mean and variance in double, rounded once, as on the CPU;
// y with a rounded product (no fused multiply-add) before the bias, as on the CPU, stored as Y
// (float, or bf16 rounded). x is a, or with b not null a + b, stored into sum first (Note
// [Residual LayerNorm] in src/cpu/ops/layernorm.cpp): each lane reads back only the columns it
// wrote, so the row needs no barrier.
template <class Y>
__global__ void layernorm_forward_kernel(const float* a, const float* b, float* sum,
                                         const float* weight, const float* bias, Y* y,
                                         float* mean, float* rstd, std::size_t rows, int C) {
  const std::size_t row = warp_row();
  if (row >= rows) return;  // the whole warp: the shuffles below see every lane
  double total = 0.0;
  const float* xr = residual_row(a, b, sum, row, C, [&](float v) { total += v; });
  const double mu = warp_sum(total) / double(C);
  double var = 0.0;
  for (int c = lane(); c < C; c += kWarp) {
    const double d = xr[c] - mu;
    var += d * d;
  }
  var = warp_sum(var);
  const float m = static_cast<float>(mu);
  const float s = static_cast<float>(1.0 / sqrt(var / double(C) + 1e-5));
  Y* yr = y + row * C;
  for (int c = lane(); c < C; c += kWarp)
    detail::store_value(&yr[c], __fmul_rn((xr[c] - m) * s, weight[c]) + bias[c]);
  if (lane() == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx[i] = dresidual[i] (0 when null) + term, rounded into dx_bf16[i] too when that is not null.
// dx may alias dresidual: element i is read, then written, by one lane.
__device__ inline void write_dx(const float* dresidual, float* dx, std::uint16_t* dx_bf16,
                                std::size_t i, float term) {
  const float v = (dresidual ? dresidual[i] : 0.0f) + term;
  dx[i] = v;
  if (dx_bf16) dx_bf16[i] = detail::float_to_bf16(v);
}

// One warp per row: dx = dresidual (0 when null) + rstd * (g - mean_c(g) - xhat * mean_c(g *
// xhat)), g = dy * weight, the two means summed in double as on the CPU; dx rounded into dx_bf16
// too when that is not null (write_dx). __fmul_rn: rounded products, no fused multiply-add, as
// on the CPU (with C = 1, g - mean_c(g) must be exactly 0).
__global__ void layernorm_backward_dx_kernel(const float* x, const float* weight,
                                             const float* mean, const float* rstd,
                                             const float* dy, const float* dresidual, float* dx,
                                             std::uint16_t* dx_bf16, std::size_t rows, int C) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const float* xr = x + row * C;
  const float* dyr = dy + row * C;
  const float m = mean[row], s = rstd[row];
  double g_sum = 0.0, gx_sum = 0.0;
  for (int c = lane(); c < C; c += kWarp) {
    const float g = dyr[c] * weight[c];
    g_sum += g;
    gx_sum += double(g) * ((xr[c] - m) * s);
  }
  const float g_mean = static_cast<float>(warp_sum(g_sum) / double(C));
  const float gx_mean = static_cast<float>(warp_sum(gx_sum) / double(C));
  for (int c = lane(); c < C; c += kWarp) {
    const float xhat = (xr[c] - m) * s;
    write_dx(dresidual, dx, dx_bf16, row * C + c,
             __fmul_rn(s, __fmul_rn(dyr[c], weight[c]) - g_mean - __fmul_rn(xhat, gx_mean)));
  }
}

// Pass 1 of LayerNorm's dweight and dbias. Block (chunk, tile): rows [chunk * kLayerNormChunk,
// +kLayerNormChunk), columns [tile * 32, +32); lane = column, warp w takes rows w, w + 8, ...
// in order, then warp 0 adds the eight warps' sums in order. partials (chunks, 2, C): the
// chunk's sum of dy * xhat, then of dy, in double. mean null: 0 (RMSNorm's xhat = x * rstd).
__global__ void layernorm_param_partials_kernel(const float* x, const float* mean,
                                                const float* rstd, const float* dy, int rows,
                                                int C, double* partials) {
  const int w = static_cast<int>(threadIdx.x / kWarp);
  const int c = static_cast<int>(blockIdx.y) * kWarp + lane();
  const int chunk = static_cast<int>(blockIdx.x);
  const int r1 = min(rows, (chunk + 1) * kLayerNormChunk);
  double dw = 0.0, db = 0.0;
  if (c < C)
    for (int r = chunk * kLayerNormChunk + w; r < r1; r += kWarpsPerBlock) {
      const std::size_t i = static_cast<std::size_t>(r) * C + c;
      const float d = dy[i];
      dw += double(d) * ((x[i] - (mean ? mean[r] : 0.0f)) * rstd[r]);
      db += d;
    }
  __shared__ double sdw[kWarpsPerBlock][kWarp], sdb[kWarpsPerBlock][kWarp];
  sdw[w][lane()] = dw;
  sdb[w][lane()] = db;
  __syncthreads();
  if (w != 0 || c >= C) return;
  for (int k = 1; k < kWarpsPerBlock; ++k) {
    dw += sdw[k][lane()];
    db += sdb[k][lane()];
  }
  partials[(2 * static_cast<std::size_t>(chunk)) * C + c] = dw;
  partials[(2 * static_cast<std::size_t>(chunk) + 1) * C + c] = db;
}

// Pass 2: one thread per column adds the chunks' partials in chunk order, then into the
// gradients (rounded once, as on the CPU); dbias null: RMSNorm's, which has none.
__global__ void layernorm_param_grads_kernel(const double* partials, int chunks, int C,
                                             float* dweight, float* dbias) {
  const std::size_t c = first_index();
  if (c >= static_cast<std::size_t>(C)) return;
  double dw = 0.0, db = 0.0;
  for (int k = 0; k < chunks; ++k) {
    dw += partials[(2 * static_cast<std::size_t>(k)) * C + c];
    db += partials[(2 * static_cast<std::size_t>(k) + 1) * C + c];
  }
  dweight[c] += static_cast<float>(dw);
  if (dbias) dbias[c] += static_cast<float>(db);
}

// ---- RMSNorm (Note [RMSNorm]) ------------------------------------------------------------------

// One warp per row of x (rows, C): the sum of squares in double, rstd rounded once, as on the
// CPU; y = (x * rstd) * weight, stored as Y. x is a, or with b not null a + b, stored into sum
// first (each lane reads back only the columns it wrote).
template <class Y>
__global__ void rmsnorm_forward_kernel(const float* a, const float* b, float* sum,
                                       const float* weight, Y* y, float* rstd, std::size_t rows,
                                       int C, float eps) {
  const std::size_t row = warp_row();
  if (row >= rows) return;  // the whole warp: the shuffles below see every lane
  double squares = 0.0;
  const float* xr =
      residual_row(a, b, sum, row, C, [&](float v) { squares += double(v) * double(v); });
  const float s = static_cast<float>(1.0 / sqrt(warp_sum(squares) / double(C) + double(eps)));
  Y* yr = y + row * C;
  for (int c = lane(); c < C; c += kWarp) detail::store_value(&yr[c], xr[c] * s * weight[c]);
  if (lane() == 0) rstd[row] = s;
}

// One warp per row: dx = dresidual (0 when null) + rstd * (g - xhat * mean_c(g * xhat)),
// g = dy * weight, xhat = x * rstd, the mean summed in double as on the CPU; rounded products.
__global__ void rmsnorm_backward_dx_kernel(const float* x, const float* weight, const float* rstd,
                                           const float* dy, const float* dresidual, float* dx,
                                           std::uint16_t* dx_bf16, std::size_t rows, int C) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const float* xr = x + row * C;
  const float* dyr = dy + row * C;
  const float s = rstd[row];
  double gx_sum = 0.0;
  for (int c = lane(); c < C; c += kWarp)
    gx_sum += double(__fmul_rn(dyr[c], weight[c])) * (xr[c] * s);
  const float gx_mean = static_cast<float>(warp_sum(gx_sum) / double(C));
  for (int c = lane(); c < C; c += kWarp)
    write_dx(dresidual, dx, dx_bf16, row * C + c,
             __fmul_rn(s, __fmul_rn(dyr[c], weight[c]) - __fmul_rn(xr[c] * s, gx_mean)));
}

int layernorm_chunks(int rows) { return (rows + kLayerNormChunk - 1) / kLayerNormChunk; }

// dweight (C) += sum_r dy * xhat, dbias += sum_r dy when not null (mean null: RMSNorm's), in
// two passes through the partials in `scratch`.
void launch_norm_param_grads(cudaStream_t stream, const float* x, const float* mean,
                             const float* rstd, const float* dy, float* dweight, float* dbias,
                             int rows, int C, void* scratch) {
  const int chunks = layernorm_chunks(rows);
  auto* partials = static_cast<double*>(scratch);
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>((C + kWarp - 1) / kWarp));
  layernorm_param_partials_kernel<<<grid, kThreads, 0, stream>>>(x, mean, rstd, dy, rows, C,
                                                                 partials);
  CUDA_CHECK(cudaGetLastError());
  layernorm_param_grads_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      partials, chunks, C, dweight, dbias);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <class Y>
void layernorm_forward_of(cudaStream_t stream, const float* a, const float* b, float* sum,
                          const float* weight, const float* bias, Y* y, float* mean, float* rstd,
                          int rows, int C) {
  if (rows == 0) return;
  layernorm_forward_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(
      a, b, sum, weight, bias, y, mean, rstd, static_cast<std::size_t>(rows), C);
  CUDA_CHECK(cudaGetLastError());
}

void launch_layernorm_forward(cudaStream_t stream, const float* a, const float* b, float* sum,
                              const float* weight, const float* bias, float* y, float* mean,
                              float* rstd, int rows, int C) {
  layernorm_forward_of(stream, a, b, sum, weight, bias, y, mean, rstd, rows, C);
}

void launch_layernorm_forward_bf16(cudaStream_t stream, const float* a, const float* b,
                                   float* sum, const float* weight, const float* bias,
                                   std::uint16_t* y, float* mean, float* rstd, int rows, int C) {
  layernorm_forward_of(stream, a, b, sum, weight, bias, y, mean, rstd, rows, C);
}

std::size_t layernorm_backward_scratch_bytes(int rows, int C) {
  return 2 * static_cast<std::size_t>(layernorm_chunks(rows)) * static_cast<std::size_t>(C) *
         sizeof(double);
}

void launch_layernorm_backward(cudaStream_t stream, const float* x, const float* weight,
                               const float* mean, const float* rstd, const float* dy,
                               const float* dresidual, float* dx, std::uint16_t* dx_bf16,
                               float* dweight, float* dbias, int rows, int C, void* scratch) {
  if (rows == 0 || C == 0) return;
  layernorm_backward_dx_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(
      x, weight, mean, rstd, dy, dresidual, dx, dx_bf16, static_cast<std::size_t>(rows), C);
  CUDA_CHECK(cudaGetLastError());
  launch_norm_param_grads(stream, x, mean, rstd, dy, dweight, dbias, rows, C, scratch);
}

template <class Y>
void rmsnorm_forward_of(cudaStream_t stream, const float* a, const float* b, float* sum,
                        const float* weight, Y* y, float* rstd, int rows, int C, float eps) {
  if (rows == 0) return;
  rmsnorm_forward_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(
      a, b, sum, weight, y, rstd, static_cast<std::size_t>(rows), C, eps);
  CUDA_CHECK(cudaGetLastError());
}

void launch_rmsnorm_forward(cudaStream_t stream, const float* a, const float* b, float* sum,
                            const float* weight, float* y, float* rstd, int rows, int C,
                            float eps) {
  rmsnorm_forward_of(stream, a, b, sum, weight, y, rstd, rows, C, eps);
}

void launch_rmsnorm_forward_bf16(cudaStream_t stream, const float* a, const float* b, float* sum,
                                 const float* weight, std::uint16_t* y, float* rstd, int rows,
                                 int C, float eps) {
  rmsnorm_forward_of(stream, a, b, sum, weight, y, rstd, rows, C, eps);
}

void launch_rmsnorm_backward(cudaStream_t stream, const float* x, const float* weight,
                             const float* rstd, const float* dy, const float* dresidual,
                             float* dx, std::uint16_t* dx_bf16, float* dweight, int rows, int C,
                             void* scratch) {
  if (rows == 0 || C == 0) return;
  rmsnorm_backward_dx_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(
      x, weight, rstd, dy, dresidual, dx, dx_bf16, static_cast<std::size_t>(rows), C);
  CUDA_CHECK(cudaGetLastError());
  launch_norm_param_grads(stream, x, nullptr, rstd, dy, dweight, nullptr, rows, C, scratch);
}

}  // namespace lockstep::cuda
