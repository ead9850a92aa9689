// Every kernel of the CUDA backend, then their launchers (declared in kernels.hpp).
//
// Invariants:
//  - Each kernel computes what the CPU device computes (src/cpu/cpu_device.cpp), in the same
//    precision; tests/cuda/test_cuda.cpp compares them on random inputs.
//  - Elementwise kernels use grid-stride loops, so any grid size gives the same result.
//  - Reductions that produce floating-point values sum in an order fixed by the shape alone
//    (fixed block size, fixed grid, fixed tree), never by atomics: the same inputs give the same
//    bits on every run and every GPU. Only the integer hash uses atomics (addition mod 2^64 is
//    associative, so the order does not matter).
//    The transformer kernels keep to this too: per-row reductions use a fixed warp butterfly
//    (every lane ends with the same bits), LayerNorm's weight and bias gradients go through
//    per-block partials and a second pass, and the embedding gradient sorts the rows by token
//    (a stable radix sort) so that each token's rows are added in row order, as on the CPU.
//  - Every block has exactly kThreads threads (block_sum relies on it). Row kernels give each
//    row one warp, kWarpsPerBlock rows per block.
//  - In-place row kernels (causal softmax) are safe because every element of a row is read and
//    written by the same lane only, reads before writes.
#include <algorithm>
#include <climits>
#include <cmath>

#include <cub/device/device_radix_sort.cuh>

#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/random.cuh"

namespace lockstep::cuda {
namespace {

constexpr std::size_t kMaxBlocks = 4096;  // elementwise grids: enough to fill any current GPU

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;  // rows per block of the row kernels
constexpr int kLayerNormChunk = 256;  // rows per partial of LayerNorm's dweight / dbias

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

__device__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// The sum of every thread's v, added in a fixed tree order; every thread receives it.
__device__ double block_sum(double v) {
  __shared__ double partial[kThreads];
  partial[threadIdx.x] = v;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = partial[0];
  __syncthreads();  // `partial` is reused by the next call
  return total;
}

// Sum and max over a warp by butterfly: x + y == y + x, so every lane ends with the same bits.
template <class T>
__device__ T warp_sum(T v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The row of this thread's warp in a row kernel (rows >= the result means: no row), and its lane.
__device__ std::size_t warp_row() {
  return static_cast<std::size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
}
__device__ int lane() { return static_cast<int>(threadIdx.x % kWarp); }

// ---- Activations: f(x) and f'(x), as on the CPU -------------------------------------------------

// GELU's 1 + tanh(u) and 1 - tanh(u)^2 from e = exp(-2|u|), without the cancellation of computing
// them from tanh(u) near +-1: the CPU device's formula (src/cpu/cpu_device.cpp, TanhTerms).
struct TanhTerms {
  float one_plus;      // 1 + tanh(u)
  float one_minus_sq;  // 1 - tanh(u)^2
};
__device__ TanhTerms tanh_terms(float u) {
  const float e = expf(u < 0.0f ? 2.0f * u : -2.0f * u);
  const float inv = 1.0f / (1.0f + e);
  return {(u < 0.0f ? 2.0f * e : 2.0f) * inv, 4.0f * e * inv * inv};
}

__device__ float activate(ActivationKind f, float x) {
  switch (f) {
    case ActivationKind::relu:
      return x > 0.0f ? x : 0.0f;
    case ActivationKind::tanh:
      return tanhf(x);
    case ActivationKind::gelu:  // tanh approximation: 0.5 x (1 + tanh(c (x + a x^3)))
      return 0.5f * x * tanh_terms(kGeluC * (x + kGeluA * x * x * x)).one_plus;
  }
  return x;
}

__device__ float activate_grad(ActivationKind f, float x) {
  switch (f) {
    case ActivationKind::relu:
      return x > 0.0f ? 1.0f : 0.0f;
    case ActivationKind::tanh: {
      const float t = tanhf(x);
      return 1.0f - t * t;
    }
    case ActivationKind::gelu: {
      const TanhTerms t = tanh_terms(kGeluC * (x + kGeluA * x * x * x));
      return 0.5f * t.one_plus +
             0.5f * x * t.one_minus_sq * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
    }
  }
  return 1.0f;
}

// ---- Elementwise kernels ------------------------------------------------------------------------

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

// ---- Reduction kernels --------------------------------------------------------------------------

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

// One block per row of logits (rows, classes): argmax, log-sum-exp in double, the row's loss and
// correctness into row_loss / row_correct, and optionally the row of dlogits.
__global__ void softmax_xent_rows_kernel(const float* logits, const std::int32_t* labels,
                                         int classes, float* dlogits, float grad_scale,
                                         double* row_loss, int* row_correct, LossResult* result) {
  const int row = blockIdx.x;
  const int label = labels[row];
  if (label < 0 || label >= classes) {  // the same for the whole block: no thread is left waiting
    if (threadIdx.x == 0) {
      atomicMin(&result->bad_row, row);
      row_loss[row] = 0.0;
      row_correct[row] = 0;
    }
    return;
  }
  const float* z = logits + static_cast<std::size_t>(row) * classes;

  // argmax: the first index of the largest value, as the CPU's scan with a strict '>' finds it.
  __shared__ float best_value[kThreads];
  __shared__ int best_index[kThreads];
  float bv = 0.0f;
  int bi = INT_MAX;  // INT_MAX: this thread has seen nothing yet
  for (int j = threadIdx.x; j < classes; j += kThreads)
    if (bi == INT_MAX || z[j] > bv) {
      bv = z[j];
      bi = j;
    }
  best_value[threadIdx.x] = bv;
  best_index[threadIdx.x] = bi;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float ov = best_value[threadIdx.x + stride], mv = best_value[threadIdx.x];
      const int oi = best_index[threadIdx.x + stride], mi = best_index[threadIdx.x];
      if (oi != INT_MAX && (mi == INT_MAX || ov > mv || (ov == mv && oi < mi))) {
        best_value[threadIdx.x] = ov;
        best_index[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  const int argmax = best_index[0];
  const double zmax = z[argmax];

  double partial = 0.0;
  for (int j = threadIdx.x; j < classes; j += kThreads) partial += exp(double(z[j]) - zmax);
  const double sum = block_sum(partial);

  if (threadIdx.x == 0) {
    row_loss[row] = log(sum) - (double(z[label]) - zmax);  // logsumexp - z[label]
    row_correct[row] = argmax == label ? 1 : 0;
  }
  if (!dlogits) return;
  float* d = dlogits + static_cast<std::size_t>(row) * classes;
  for (int j = threadIdx.x; j < classes; j += kThreads) {
    const double p = exp(double(z[j]) - zmax) / sum - (j == label ? 1.0 : 0.0);
    d[j] = static_cast<float>(p * grad_scale);
  }
}

// One block: the rows' losses and correct counts, summed in a fixed order.
__global__ void softmax_xent_total_kernel(const double* row_loss, const int* row_correct,
                                          const std::int32_t* labels, int rows,
                                          LossResult* result) {
  double loss = 0.0, correct = 0.0;
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    loss += row_loss[r];
    correct += row_correct[r];
  }
  loss = block_sum(loss);
  correct = block_sum(correct);  // exact: integers far below 2^53
  if (threadIdx.x == 0) {
    result->loss_sum = loss;
    result->correct = static_cast<long long>(correct);
    const int bad = result->bad_row;
    result->bad_label = bad < rows ? labels[bad] : 0;
  }
}

// Pass 1 of sum_squares: grid of exactly kReduceBlocks blocks, one partial per block. Each
// thread takes its elements in grid-stride order, four loads at a time so that enough bytes are
// in flight to stream at full bandwidth; the adds stay in that order.
__global__ void sum_squares_kernel(const float* x, std::size_t n, double* partials) {
  const std::size_t stride = grid_stride();
  std::size_t i = first_index();
  double s = 0.0;
  for (; i < n && 3 * stride < n - i; i += 4 * stride) {  // i + 3 stride < n, without overflow
    const double a = x[i], b = x[i + stride], c = x[i + 2 * stride], d = x[i + 3 * stride];
    s += a * a;
    s += b * b;
    s += c * c;
    s += d * d;
  }
  for (; i < n; i += stride) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// Pass 2: one block sums `count` partials.
__global__ void sum_partials_kernel(const double* partials, int count, double* result) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *result = s;
}

// sum of mix64(bits(x[i]) ^ mix64(i)) mod 2^64: per thread, per warp, then one atomic per warp.
__global__ void hash_kernel(const float* x, std::size_t n, unsigned long long* result) {
  unsigned long long h = 0;
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    h += mix64(static_cast<std::uint64_t>(__float_as_uint(x[i])) ^ mix64(i));
  for (int offset = 16; offset > 0; offset /= 2) h += __shfl_down_sync(0xffffffffu, h, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(result, h);
}

// ---- Optimiser kernels (the CPU device's loops, element by element) ----------------------------

__global__ void sgd_step_kernel(float lr, float mu, float wd, bool nesterov, float* params,
                                const float* grads, float* momentum_buf, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float g = grads[i];
    if (wd != 0.0f) g += wd * params[i];
    if (mu != 0.0f) {
      const float buf = momentum_buf[i] = mu * momentum_buf[i] + g;
      g = nesterov ? g + mu * buf : buf;
    }
    params[i] -= lr * g;
  }
}

__global__ void adamw_step_kernel(AdamWScalars s, float* params, const float* grads, float* m,
                                  float* v, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float g = grads[i];
    const float mi = m[i] = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float vi = v[i] = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    params[i] = params[i] * s.decay - s.step_size * (mi / denom);
  }
}

// ---- Transformer kernels ------------------------------------------------------------------------

// out (rows, C) = wte[ids[r]] + wpe[r % T]: a block per row (grid-stride over rows), threads
// over the channels.
__global__ void embedding_forward_kernel(const float* ids, const float* wte, const float* wpe,
                                         float* out, std::size_t rows, std::size_t T,
                                         std::size_t C) {
  for (std::size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* tok = wte + static_cast<std::size_t>(ids[r]) * C;
    const float* pos = wpe + (r % T) * C;
    float* o = out + r * C;
    for (std::size_t c = threadIdx.x; c < C; c += kThreads) o[c] = tok[c] + pos[c];
  }
}

// Sort keys of embedding_backward: token[r] = ids[r], row[r] = r.
__global__ void embedding_keys_kernel(const float* ids, unsigned* token, int* row, int rows) {
  for (std::size_t r = first_index(); r < static_cast<std::size_t>(rows); r += grid_stride()) {
    token[r] = static_cast<unsigned>(ids[r]);
    row[r] = static_cast<int>(r);
  }
}

// dwte (V, C): token and row hold the rows sorted by token, each token's rows in increasing
// order (the sort is stable). The block at the first position of each token's run adds that
// token's rows in that order: dwte[t][c] = ((dwte[t][c] + dout[r0][c]) + dout[r1][c]) + ...,
// the CPU's float additions exactly. No atomics: the same bits on every run.
__global__ void embedding_dwte_kernel(const unsigned* token, const int* row, const float* dout,
                                      float* dwte, int rows, std::size_t C) {
  for (int i = static_cast<int>(blockIdx.x); i < rows; i += static_cast<int>(gridDim.x)) {
    const unsigned t = token[i];
    if (i > 0 && token[i - 1] == t) continue;  // not the first of its run: the same for the block
    int end = i + 1;
    while (end < rows && token[end] == t) ++end;
    float* w = dwte + static_cast<std::size_t>(t) * C;
    for (std::size_t c = threadIdx.x; c < C; c += kThreads) {
      float acc = w[c];
      for (int j = i; j < end; ++j) acc += dout[static_cast<std::size_t>(row[j]) * C + c];
      w[c] = acc;
    }
  }
}

// dwpe (T, C): one thread per (t, c), tc = t * C + c, adding dout[b][t][c] for b in order:
// the CPU's float additions exactly.
__global__ void embedding_dwpe_kernel(const float* dout, float* dwpe, int batch,
                                      std::size_t TC) {
  for (std::size_t tc = first_index(); tc < TC; tc += grid_stride()) {
    float acc = dwpe[tc];
    for (int b = 0; b < batch; ++b) acc += dout[static_cast<std::size_t>(b) * TC + tc];
    dwpe[tc] = acc;
  }
}

// One warp per row of x (rows, C): mean and variance in double, rounded once, as on the CPU;
// y with a rounded product (no fused multiply-add) before the bias, as on the CPU.
__global__ void layernorm_forward_kernel(const float* x, const float* weight, const float* bias,
                                         float* y, float* mean, float* rstd, std::size_t rows,
                                         int C) {
  const std::size_t row = warp_row();
  if (row >= rows) return;  // the whole warp: the shuffles below see every lane
  const float* xr = x + row * C;
  double sum = 0.0;
  for (int c = lane(); c < C; c += kWarp) sum += xr[c];
  const double mu = warp_sum(sum) / double(C);
  double var = 0.0;
  for (int c = lane(); c < C; c += kWarp) {
    const double d = xr[c] - mu;
    var += d * d;
  }
  var = warp_sum(var);
  const float m = static_cast<float>(mu);
  const float s = static_cast<float>(1.0 / sqrt(var / double(C) + 1e-5));
  float* yr = y + row * C;
  for (int c = lane(); c < C; c += kWarp) yr[c] = __fmul_rn((xr[c] - m) * s, weight[c]) + bias[c];
  if (lane() == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// One warp per row: dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)), g = dy * weight,
// the two means summed in double as on the CPU. __fmul_rn: rounded products, no fused
// multiply-add, as on the CPU (with C = 1, g - mean_c(g) must be exactly 0).
__global__ void layernorm_backward_dx_kernel(const float* x, const float* weight,
                                             const float* mean, const float* rstd,
                                             const float* dy, float* dx, std::size_t rows,
                                             int C) {
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
  float* dxr = dx + row * C;
  for (int c = lane(); c < C; c += kWarp) {
    const float xhat = (xr[c] - m) * s;
    dxr[c] += __fmul_rn(s, __fmul_rn(dyr[c], weight[c]) - g_mean - __fmul_rn(xhat, gx_mean));
  }
}

// Pass 1 of LayerNorm's dweight and dbias. Block (chunk, tile): rows [chunk * kLayerNormChunk,
// +kLayerNormChunk), columns [tile * 32, +32); lane = column, warp w takes rows w, w + 8, ...
// in order, then warp 0 adds the eight warps' sums in order. partials (chunks, 2, C): the
// chunk's sum of dy * xhat, then of dy, in double.
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
      dw += double(d) * ((x[i] - mean[r]) * rstd[r]);
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
// gradients (rounded once, as on the CPU).
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
  dbias[c] += static_cast<float>(db);
}

// One warp per row of `count` (T, T) matrices (row = matrix * T + i): p[j] = softmax over
// j <= i of scale * s[j], 0 above the diagonal. p may alias s: each lane reads its own
// elements of the row, and writes them only in the last pass, after its last read.
// __fmul_rn keeps scale * s a rounded product (no fused multiply-add), as on the CPU.
__global__ void causal_softmax_forward_kernel(const float* s, float* p, std::size_t rows, int T,
                                              float scale) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const int i = static_cast<int>(row % static_cast<std::size_t>(T));
  const float* sr = s + row * T;
  float* pr = p + row * T;
  float zmax = -INFINITY;
  for (int j = lane(); j <= i; j += kWarp) zmax = fmaxf(zmax, __fmul_rn(scale, sr[j]));
  zmax = warp_max(zmax);
  double sum = 0.0;
  for (int j = lane(); j <= i; j += kWarp) sum += expf(__fmul_rn(scale, sr[j]) - zmax);
  const float inv = static_cast<float>(1.0 / warp_sum(sum));
  for (int j = lane(); j < T; j += kWarp)
    pr[j] = j <= i ? expf(__fmul_rn(scale, sr[j]) - zmax) * inv : 0.0f;
}

// One warp per row: ds[j] = scale * p[j] * (dp[j] - sum over j' <= i of p[j'] dp[j']), the sum
// in double; 0 above the diagonal. ds may alias dp (same lane, read before write).
__global__ void causal_softmax_backward_kernel(const float* p, const float* dp, float* ds,
                                               std::size_t rows, int T, float scale) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const int i = static_cast<int>(row % static_cast<std::size_t>(T));
  const float* pr = p + row * T;
  const float* dpr = dp + row * T;
  float* dsr = ds + row * T;
  double dot = 0.0;
  for (int j = lane(); j <= i; j += kWarp) dot += double(pr[j]) * dpr[j];
  const float d = static_cast<float>(warp_sum(dot));
  for (int j = lane(); j < T; j += kWarp) dsr[j] = j <= i ? scale * pr[j] * (dpr[j] - d) : 0.0f;
}

// ---- Peer all-reduce ----------------------------------------------------------------------------

__global__ void peer_reduce_kernel(PeerSlices slices, int ranks, float* out, std::size_t n,
                                   bool average, float inv) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float acc = slices.src[0][i];
    for (int r = 1; r < ranks; ++r) acc += slices.src[r][i];
    if (average) acc *= inv;
    out[i] = acc;
  }
}

// ---- Launch helpers -----------------------------------------------------------------------------

unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// Blocks of the row kernels: one warp per row.
unsigned blocks_for_rows(std::size_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

int layernorm_chunks(int rows) { return (rows + kLayerNormChunk - 1) / kLayerNormChunk; }

// embedding_backward's scratch: four arrays of `rows` ints (sort keys and values, in and out),
// then the radix sort's own temporary storage, each part aligned to 256 bytes.
struct SortScratch {
  unsigned* token_in;
  unsigned* token;
  int* row_in;
  int* row;
  void* temp;
  std::size_t temp_bytes;
};

constexpr std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

std::size_t sort_temp_bytes(int rows) {
  std::size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const unsigned*>(nullptr),
                                             static_cast<unsigned*>(nullptr),
                                             static_cast<const int*>(nullptr),
                                             static_cast<int*>(nullptr), rows));
  return bytes;
}

// Bytes of each of the four arrays.
std::size_t sort_array_bytes(int rows) {
  return aligned(static_cast<std::size_t>(rows) * sizeof(int));
}

SortScratch sort_scratch(void* scratch, std::size_t scratch_bytes, int rows) {
  const std::size_t part = sort_array_bytes(rows);
  auto* base = static_cast<char*>(scratch);
  return {reinterpret_cast<unsigned*>(base), reinterpret_cast<unsigned*>(base + part),
          reinterpret_cast<int*>(base + 2 * part), reinterpret_cast<int*>(base + 3 * part),
          base + 4 * part, scratch_bytes - 4 * part};
}

}  // namespace

// ---- Launchers ----------------------------------------------------------------------------------

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

void launch_softmax_cross_entropy(cudaStream_t stream, const float* logits,
                                  const std::int32_t* labels, int rows, int classes,
                                  float* dlogits, float grad_scale, double* row_loss,
                                  int* row_correct, LossResult* result) {
  // bad_row starts above any row (0x7f7f7f7f); the row kernel lowers it with atomicMin.
  CUDA_CHECK(cudaMemsetAsync(&result->bad_row, 0x7f, sizeof(int), stream));
  if (rows > 0) {
    softmax_xent_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, labels, classes, dlogits, grad_scale, row_loss, row_correct, result);
    CUDA_CHECK(cudaGetLastError());
  }
  softmax_xent_total_kernel<<<1, kThreads, 0, stream>>>(row_loss, row_correct, labels, rows,
                                                        result);
  CUDA_CHECK(cudaGetLastError());
}

void launch_sum_squares(cudaStream_t stream, const float* x, std::size_t n, double* partials,
                        double* result) {
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream));
    return;
  }
  sum_squares_kernel<<<kReduceBlocks, kThreads, 0, stream>>>(x, n, partials);
  CUDA_CHECK(cudaGetLastError());
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(partials, kReduceBlocks, result);
  CUDA_CHECK(cudaGetLastError());
}

void launch_hash(cudaStream_t stream, const float* x, std::size_t n,
                 unsigned long long* result) {
  CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(unsigned long long), stream));
  if (n == 0) return;
  hash_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, result);
  CUDA_CHECK(cudaGetLastError());
}

void launch_sgd_step(cudaStream_t stream, float lr, float momentum, float weight_decay,
                     bool nesterov, float* params, const float* grads, float* momentum_buf,
                     std::size_t n) {
  if (n == 0) return;
  sgd_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(lr, momentum, weight_decay, nesterov,
                                                          params, grads, momentum_buf, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_adamw_step(cudaStream_t stream, const AdamWScalars& s, float* params,
                       const float* grads, float* m, float* v, std::size_t n) {
  if (n == 0) return;
  adamw_step_kernel<<<blocks_for(n), kThreads, 0, stream>>>(s, params, grads, m, v, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_add(cudaStream_t stream, const float* a, const float* b, float* y, std::size_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, y, n);
  CUDA_CHECK(cudaGetLastError());
}

void launch_embedding_forward(cudaStream_t stream, const float* ids, const float* wte,
                              const float* wpe, float* out, int batch, int T, int C) {
  const std::size_t rows = static_cast<std::size_t>(batch) * static_cast<std::size_t>(T);
  if (rows == 0 || C == 0) return;
  const auto blocks = static_cast<unsigned>(std::min(rows, kMaxBlocks));
  embedding_forward_kernel<<<blocks, kThreads, 0, stream>>>(ids, wte, wpe, out, rows,
                                                            static_cast<std::size_t>(T),
                                                            static_cast<std::size_t>(C));
  CUDA_CHECK(cudaGetLastError());
}

std::size_t embedding_backward_scratch_bytes(int batch, int T) {
  const int rows = batch * T;
  if (rows <= 0) return 0;
  return 4 * sort_array_bytes(rows) + sort_temp_bytes(rows);
}

void launch_embedding_backward(cudaStream_t stream, const float* ids, const float* dout,
                               float* dwte, float* dwpe, int batch, int T, int C,
                               void* scratch, std::size_t scratch_bytes) {
  const int rows = batch * T;
  if (rows <= 0 || C == 0) return;
  const SortScratch s = sort_scratch(scratch, scratch_bytes, rows);
  embedding_keys_kernel<<<blocks_for(static_cast<std::size_t>(rows)), kThreads, 0, stream>>>(
      ids, s.token_in, s.row_in, rows);
  CUDA_CHECK(cudaGetLastError());
  std::size_t temp_bytes = s.temp_bytes;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.temp, temp_bytes,
                                             static_cast<const unsigned*>(s.token_in), s.token,
                                             static_cast<const int*>(s.row_in), s.row, rows, 0,
                                             static_cast<int>(8 * sizeof(unsigned)), stream));
  const auto blocks = static_cast<unsigned>(std::min(static_cast<std::size_t>(rows), kMaxBlocks));
  embedding_dwte_kernel<<<blocks, kThreads, 0, stream>>>(s.token, s.row, dout, dwte, rows,
                                                         static_cast<std::size_t>(C));
  CUDA_CHECK(cudaGetLastError());
  const std::size_t tc = static_cast<std::size_t>(T) * static_cast<std::size_t>(C);
  embedding_dwpe_kernel<<<blocks_for(tc), kThreads, 0, stream>>>(dout, dwpe, batch, tc);
  CUDA_CHECK(cudaGetLastError());
}

void launch_layernorm_forward(cudaStream_t stream, const float* x, const float* weight,
                              const float* bias, float* y, float* mean, float* rstd, int rows,
                              int C) {
  if (rows == 0) return;
  layernorm_forward_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(
      x, weight, bias, y, mean, rstd, static_cast<std::size_t>(rows), C);
  CUDA_CHECK(cudaGetLastError());
}

std::size_t layernorm_backward_scratch_bytes(int rows, int C) {
  return 2 * static_cast<std::size_t>(layernorm_chunks(rows)) * static_cast<std::size_t>(C) *
         sizeof(double);
}

void launch_layernorm_backward(cudaStream_t stream, const float* x, const float* weight,
                               const float* mean, const float* rstd, const float* dy, float* dx,
                               float* dweight, float* dbias, int rows, int C, void* scratch) {
  if (rows == 0 || C == 0) return;
  layernorm_backward_dx_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(
      x, weight, mean, rstd, dy, dx, static_cast<std::size_t>(rows), C);
  CUDA_CHECK(cudaGetLastError());
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

void launch_causal_softmax_forward(cudaStream_t stream, const float* s, float* p, int count,
                                   int T, float scale) {
  const std::size_t rows = static_cast<std::size_t>(count) * static_cast<std::size_t>(T);
  if (rows == 0) return;
  causal_softmax_forward_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(s, p, rows, T,
                                                                                scale);
  CUDA_CHECK(cudaGetLastError());
}

void launch_causal_softmax_backward(cudaStream_t stream, const float* p, const float* dp,
                                    float* ds, int count, int T, float scale) {
  const std::size_t rows = static_cast<std::size_t>(count) * static_cast<std::size_t>(T);
  if (rows == 0) return;
  causal_softmax_backward_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(p, dp, ds, rows,
                                                                                 T, scale);
  CUDA_CHECK(cudaGetLastError());
}

void launch_peer_reduce(cudaStream_t stream, const PeerSlices& slices, int ranks, float* out,
                        std::size_t n, bool average) {
  if (n == 0) return;
  const float inv = 1.0f / static_cast<float>(ranks);
  peer_reduce_kernel<<<blocks_for(n), kThreads, 0, stream>>>(slices, ranks, out, n, average, inv);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::cuda
