// Elementwise kernels: fill, scale, add, the bias and its gradient, activations and SwiGLU. The
// activation math is common/elementwise_math.hpp, shared with the CPU device
// (src/cpu/ops/elementwise.cpp). add, add_bias, the activations and SwiGLU move 8 elements per
// thread and step where their pointers allow (Note [Wide loads in the element-wise kernels] in
// common.cuh).
#include "common/bf16.hpp"
#include "common/elementwise_math.hpp"
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

__global__ void fill_kernel(float* x, float value, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] = value;
}

__global__ void scale_kernel(float* x, float alpha, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] *= alpha;
}

// y (rows, cols) = x + bias (cols), stored as Y (float: x may be y; bf16: rounded), the bias
// B float or bf16 (widened); n = rows * cols. Grid-stride over packs of W elements (Note [Wide
// loads in the element-wise kernels]; W = kPack needs cols % kPack == 0, so that a pack lies in
// one row); each thread carries its column along instead of taking i % cols per pack (a 64-bit
// division): the stride moves the column by stride % cols, so one subtraction brings it back
// below cols.
template <int W, class B, class Y>
__device__ void add_bias_packs(const float* x, const B* bias, Y* y, std::size_t cols,
                               std::size_t n) {
  const std::size_t stride = grid_stride() * W, step = stride % cols;
  std::size_t i = first_index() * W, c = i % cols;
  for (; i < n; i += stride) {
    float v[W], b[W];
    load(x + i, v);
    load(bias + c, b);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] += b[k];
    store(y + i, v);
    c += step;
    if (c >= cols) c -= cols;
  }
}

template <class B, class Y>
__global__ void add_bias_kernel(const float* x, const B* bias, Y* y, std::size_t cols,
                                std::size_t n, bool wide) {
  if (wide)
    add_bias_packs<kPack>(x, bias, y, cols, n);
  else
    add_bias_packs<1>(x, bias, y, cols, n);
}

__device__ float activate(ActivationKind f, float x) {
  switch (f) {
    case ActivationKind::relu: return detail::relu(x);
    case ActivationKind::tanh: return detail::tanh_act(x);
    case ActivationKind::gelu: return detail::gelu(x);
  }
  return x;
}

__device__ float activate_grad(ActivationKind f, float x) {
  switch (f) {
    case ActivationKind::relu: return detail::relu_grad(x);
    case ActivationKind::tanh: return detail::tanh_grad(x);
    case ActivationKind::gelu: return detail::gelu_grad(x);
  }
  return 1.0f;
}

// T: the storage of x and y, float or bf16 (std::uint16_t).
template <class T>
__global__ void activation_forward_kernel(ActivationKind f, const T* x, T* y, std::size_t n,
                                          bool wide) {
  for_each_pack(n, wide, [=](std::size_t i, auto width) {
    float v[decltype(width)::value];
    load(x + i, v);
    for (float& e : v) e = activate(f, e);
    store(y + i, v);
  });
}

// X: the storage of x. dx_bf16, when not null, receives dx rounded. dx may alias dy (each
// element is read, then written, by one thread).
template <class X>
__global__ void activation_backward_kernel(ActivationKind f, const X* x, const float* dy,
                                           float* dx, std::uint16_t* dx_bf16, std::size_t n,
                                           bool wide) {
  for_each_pack(n, wide, [=](std::size_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float v[W], g[W];
    load(x + i, v);
    load(dy + i, g);
#pragma unroll
    for (int k = 0; k < W; ++k) g[k] = g[k] * activate_grad(f, v[k]);
    store(dx + i, g);
    if (dx_bf16) store(dx_bf16 + i, g);
  });
}

// SwiGLU (Note [SwiGLU] in src/cpu/ops/elementwise.cpp) over y (rows, F), element i at row
// i / F, column i % F of y and of h's gate and up halves. A pack of kPack needs F % kPack == 0,
// so that it lies in one row of each half. H: the storage of h and y (float, or bf16).
template <class H>
__global__ void swiglu_forward_kernel(const H* h, H* y, std::size_t F, std::size_t n,
                                      bool wide) {
  for_each_pack(n, wide, [=](std::size_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const H* gate = h + (i / F) * 2 * F + i % F;
    float g[W], u[W];
    load(gate, g);
    load(gate + F, u);
#pragma unroll
    for (int k = 0; k < W; ++k) g[k] = detail::silu(g[k]) * u[k];
    store(y + i, g);
  });
}

// dgate = (dy * up) * silu'(gate), dup = dy * silu(gate) into dh in h's layout, and rounded
// into dh_bf16 too when that is not null.
template <class H>
__global__ void swiglu_backward_kernel(const H* h, const float* dy, float* dh,
                                       std::uint16_t* dh_bf16, std::size_t F, std::size_t n,
                                       bool wide) {
  for_each_pack(n, wide, [=](std::size_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const std::size_t at = (i / F) * 2 * F + i % F;  // gate's; up's is at + F
    float g[W], u[W], d[W], dgate[W], dup[W];
    load(h + at, g);
    load(h + at + F, u);
    load(dy + i, d);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      dgate[k] = d[k] * u[k] * detail::silu_grad(g[k]);
      dup[k] = d[k] * detail::silu(g[k]);
    }
    store(dh + at, dgate);
    store(dh + at + F, dup);
    if (dh_bf16) {
      store(dh_bf16 + at, dgate);
      store(dh_bf16 + at + F, dup);
    }
  });
}

// y = a + b; y may alias a or b (each element is read, then written, by one thread).
__global__ void add_kernel(const float* a, const float* b, float* y, std::size_t n, bool wide) {
  for_each_pack(n, wide, [=](std::size_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float u[W], v[W];
    load(a + i, u);
    load(b + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) u[k] = u[k] + v[k];
    store(y + i, u);
  });
}

// y[i] (+)= x[i] / (1 - p) where the mask keeps i (Note [LoRA dropout] in src/model/lora.cpp):
// the keep of element i is dropout_keeps(key, i), as on the CPU.
__global__ void dropout_kernel(const float* x, float* y, std::size_t n, std::uint64_t key,
                               std::uint32_t threshold, float scale, bool accumulate, bool wide) {
  for_each_pack(n, wide, [=](std::size_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float u[W], v[W];
    load(x + i, u);
    if (accumulate) load(y + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float kept = detail::dropout_keeps(key, i + k, threshold) ? u[k] * scale : 0.0f;
      u[k] = accumulate ? v[k] + kept : kept;
    }
    store(y + i, u);
  });
}

// dbias[c] += the sum of column c of dy (rows, cols), in double. A block takes 32 neighbouring
// columns (a warp reads 128 contiguous bytes of a row) and kBiasRowGroups groups of rows: thread
// (g, c) adds rows g, g + kBiasRowGroups, ... in order, eight loads in flight; the groups'
// partials are then added in a fixed tree, and the total to dbias[c] once. The order depends on
// the shape alone: the same bits on every run. The CPU adds the rows in order instead; both sums
// carry double rounding errors only, so the floats agree or are neighbours (unless the column
// nearly cancels to zero). One block per 32 columns, as wide as a block goes, needs no second
// pass and no scratch; for GPT-2's 768 columns that is 24 blocks of 1024 threads.
constexpr int kBiasRowGroups = 32;
constexpr int kBiasThreads = kWarp * kBiasRowGroups;

// G: dy's storage, float or bf16 (widened as read).
template <class G>
__global__ void bias_grad_kernel(float* dbias, const G* dy, int rows, int cols) {
  __shared__ double partial[kBiasRowGroups][kWarp];
  const int x = static_cast<int>(threadIdx.x % kWarp), g = static_cast<int>(threadIdx.x / kWarp);
  const int c = static_cast<int>(blockIdx.x) * kWarp + x;
  const std::size_t nc = static_cast<std::size_t>(cols);
  double acc = 0.0;
  if (c < cols) {
    constexpr int kInFlight = 8;
    int r = g;
    for (; rows - r > (kInFlight - 1) * kBiasRowGroups; r += kInFlight * kBiasRowGroups) {
      float v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u)
        v[u] = detail::load_value(dy[(r + u * kBiasRowGroups) * nc + c]);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) acc += v[u];
    }
    for (; r < rows; r += kBiasRowGroups) acc += detail::load_value(dy[r * nc + c]);
  }
  partial[g][x] = acc;
  __syncthreads();
  for (int stride = kBiasRowGroups / 2; stride > 0; stride /= 2) {
    if (g < stride) partial[g][x] += partial[g + stride][x];
    __syncthreads();
  }
  if (g == 0 && c < cols) dbias[c] = static_cast<float>(double(dbias[c]) + partial[0][x]);
}

}  // namespace

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

template <class B, class Y>
void add_bias_of(cudaStream_t stream, const float* x, const B* bias, Y* y, int rows, int cols) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (n == 0) return;
  const bool wide = cols % kPack == 0 && aligned16(x, bias, y);
  add_bias_kernel<<<blocks_for_packs(n, wide), kThreads, 0, stream>>>(x, bias, y, cols, n, wide);
  CUDA_CHECK(cudaGetLastError());
}

void launch_add_bias(cudaStream_t stream, float* y, const float* bias, int rows, int cols) {
  add_bias_of(stream, y, bias, y, rows, cols);
}

void launch_add_bias_bf16(cudaStream_t stream, const float* x, const std::uint16_t* bias,
                          std::uint16_t* y, int rows, int cols) {
  add_bias_of(stream, x, bias, y, rows, cols);
}

void launch_add(cudaStream_t stream, const float* a, const float* b, float* y, std::size_t n) {
  if (n == 0) return;
  const bool wide = aligned16(a, b, y);
  add_kernel<<<blocks_for_packs(n, wide), kThreads, 0, stream>>>(a, b, y, n, wide);
  CUDA_CHECK(cudaGetLastError());
}

void launch_dropout(cudaStream_t stream, const float* x, float* y, std::size_t n,
                    std::uint64_t key, float p, bool accumulate) {
  if (n == 0) return;
  const bool wide = aligned16(x, y);
  dropout_kernel<<<blocks_for_packs(n, wide), kThreads, 0, stream>>>(
      x, y, n, key, detail::dropout_threshold(p), detail::dropout_scale(p), accumulate, wide);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void activation_forward_of(cudaStream_t stream, ActivationKind f, const T* x, T* y,
                           std::size_t n) {
  if (n == 0) return;
  const bool wide = aligned16(x, y);
  activation_forward_kernel<<<blocks_for_packs(n, wide), kThreads, 0, stream>>>(f, x, y, n, wide);
  CUDA_CHECK(cudaGetLastError());
}

template <class X>
void activation_backward_of(cudaStream_t stream, ActivationKind f, const X* x, const float* dy,
                            float* dx, std::uint16_t* dx_bf16, std::size_t n) {
  if (n == 0) return;
  const bool wide = aligned16(x, dy, dx, dx_bf16);  // a null dx_bf16 is aligned
  activation_backward_kernel<<<blocks_for_packs(n, wide), kThreads, 0, stream>>>(
      f, x, dy, dx, dx_bf16, n, wide);
  CUDA_CHECK(cudaGetLastError());
}

void launch_activation_forward(cudaStream_t stream, ActivationKind f, const float* x, float* y,
                               std::size_t n) {
  activation_forward_of(stream, f, x, y, n);
}

void launch_activation_forward_bf16(cudaStream_t stream, ActivationKind f,
                                    const std::uint16_t* x, std::uint16_t* y, std::size_t n) {
  activation_forward_of(stream, f, x, y, n);
}

void launch_activation_backward(cudaStream_t stream, ActivationKind f, const float* x,
                                const float* dy, float* dx, std::size_t n) {
  activation_backward_of(stream, f, x, dy, dx, static_cast<std::uint16_t*>(nullptr), n);
}

void launch_activation_backward_bf16(cudaStream_t stream, ActivationKind f,
                                     const std::uint16_t* x, const float* dy, float* dx,
                                     std::uint16_t* dx_bf16, std::size_t n) {
  activation_backward_of(stream, f, x, dy, dx, dx_bf16, n);
}

template <class H>
void swiglu_forward_of(cudaStream_t stream, const H* h, H* y, int rows, int F) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(F);
  if (n == 0) return;
  const bool wide = F % kPack == 0 && aligned16(h, y);
  swiglu_forward_kernel<<<blocks_for_packs(n, wide), kThreads, 0, stream>>>(
      h, y, static_cast<std::size_t>(F), n, wide);
  CUDA_CHECK(cudaGetLastError());
}

template <class H>
void swiglu_backward_of(cudaStream_t stream, const H* h, const float* dy, float* dh,
                        std::uint16_t* dh_bf16, int rows, int F) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(F);
  if (n == 0) return;
  const bool wide = F % kPack == 0 && aligned16(h, dy, dh, dh_bf16);  // a null dh_bf16 is aligned
  swiglu_backward_kernel<<<blocks_for_packs(n, wide), kThreads, 0, stream>>>(
      h, dy, dh, dh_bf16, static_cast<std::size_t>(F), n, wide);
  CUDA_CHECK(cudaGetLastError());
}

void launch_swiglu_forward(cudaStream_t stream, const float* h, float* y, int rows, int F) {
  swiglu_forward_of(stream, h, y, rows, F);
}

void launch_swiglu_forward_bf16(cudaStream_t stream, const std::uint16_t* h, std::uint16_t* y,
                                int rows, int F) {
  swiglu_forward_of(stream, h, y, rows, F);
}

void launch_swiglu_backward(cudaStream_t stream, const float* h, const float* dy, float* dh,
                            int rows, int F) {
  swiglu_backward_of(stream, h, dy, dh, static_cast<std::uint16_t*>(nullptr), rows, F);
}

void launch_swiglu_backward_bf16(cudaStream_t stream, const std::uint16_t* h, const float* dy,
                                 float* dh, std::uint16_t* dh_bf16, int rows, int F) {
  swiglu_backward_of(stream, h, dy, dh, dh_bf16, rows, F);
}

template <class G>
void bias_grad_of(cudaStream_t stream, float* dbias, const G* dy, int rows, int cols) {
  if (rows <= 0 || cols <= 0) return;  // no rows add nothing
  const unsigned blocks = static_cast<unsigned>((cols + kWarp - 1) / kWarp);
  bias_grad_kernel<<<blocks, kBiasThreads, 0, stream>>>(dbias, dy, rows, cols);
  CUDA_CHECK(cudaGetLastError());
}

void launch_bias_grad(cudaStream_t stream, float* dbias, const float* dy, int rows, int cols) {
  bias_grad_of(stream, dbias, dy, rows, cols);
}

void launch_bias_grad_bf16(cudaStream_t stream, float* dbias, const std::uint16_t* dy, int rows,
                           int cols) {
  bias_grad_of(stream, dbias, dy, rows, cols);
}

}  // namespace lockstep::cuda
