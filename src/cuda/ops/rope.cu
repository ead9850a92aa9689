// Rotary position embeddings, forward and backward (CPU: src/cpu/ops/rope.cpp, Note [RoPE]).
// Compiled with --fmad=false: the rotation's products and sums are rounded one by one, as on
// the CPU, so both compute the same bits (detail::rope_rotate).
#include "common/bf16.hpp"
#include "common/elementwise_math.hpp"
#include "cuda/ops/common.cuh"

namespace lockstep::cuda {
namespace {

// One block per row of x (rows, width): its threads take the pairs (i, i + half) of the first
// `rotated` heads in turn and rotate them by the angles of position `position` + row % T,
// times `sign`, in place; with x_bf16 not null each thread also writes the rounding of the two
// values it rotated, and the block that of the columns it does not rotate (v's), so x_bf16
// receives the whole row rounded. Q: float or bf16 (widened, rounded).
template <class Q>
__global__ void rope_kernel(Q* x, const float* cos, const float* sin, int T, int position,
                            const std::int32_t* positions, int rotated, int half, int width,
                            float sign, std::uint16_t* x_bf16) {
  const std::size_t row = blockIdx.x;
  const int at = positions ? positions[row] : position + static_cast<int>(row % T);
  const std::size_t angles = static_cast<std::size_t>(at) * half;
  Q* xr = x + row * width;
  for (int j = static_cast<int>(threadIdx.x); j < rotated * half; j += blockDim.x) {
    const int h = j / half, i = j % half;
    const int lo = h * 2 * half + i, hi = lo + half;
    const detail::RotatedPair y =
        detail::rope_rotate(detail::load_value(xr[lo]), detail::load_value(xr[hi]),
                            cos[angles + i], sign * sin[angles + i]);
    detail::store_value(&xr[lo], y.first);
    detail::store_value(&xr[hi], y.second);
    if (x_bf16) {
      x_bf16[row * width + lo] = detail::float_to_bf16(y.first);
      x_bf16[row * width + hi] = detail::float_to_bf16(y.second);
    }
  }
  if (x_bf16)
    for (int c = rotated * 2 * half + static_cast<int>(threadIdx.x); c < width; c += blockDim.x)
      x_bf16[row * width + c] = detail::float_to_bf16(detail::load_value(xr[c]));
}

}  // namespace

template <class Q>
void rope_of(cudaStream_t stream, Q* x, const float* cos, const float* sin, int rows, int T,
             int position, const std::int32_t* positions, int heads, int kv_heads, int head_size,
             float sign, std::uint16_t* x_bf16) {
  if (rows == 0 || T == 0) return;
  const int half = head_size / 2;
  rope_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, cos, sin, T, position, positions, heads + kv_heads, half, (heads + 2 * kv_heads) * head_size, sign,
      x_bf16);
  CUDA_CHECK(cudaGetLastError());
}

void launch_rope_forward(cudaStream_t stream, float* qkv, const float* cos, const float* sin,
                         int rows, int T, int position, const std::int32_t* positions, int heads,
                         int kv_heads, int head_size) {
  rope_of(stream, qkv, cos, sin, rows, T, position, positions, heads, kv_heads, head_size, 1.0f,
          nullptr);
}

void launch_rope_forward_bf16(cudaStream_t stream, std::uint16_t* qkv, const float* cos,
                              const float* sin, int rows, int T, int position,
                              const std::int32_t* positions, int heads, int kv_heads,
                              int head_size) {
  rope_of(stream, qkv, cos, sin, rows, T, position, positions, heads, kv_heads, head_size, 1.0f,
          nullptr);
}

void launch_rope_backward(cudaStream_t stream, float* dqkv, const float* cos, const float* sin,
                          int rows, int T, int position, const std::int32_t* positions, int heads,
                          int kv_heads, int head_size, std::uint16_t* dqkv_bf16) {
  rope_of(stream, dqkv, cos, sin, rows, T, position, positions, heads, kv_heads, head_size,
          -1.0f, dqkv_bf16);
}

}  // namespace lockstep::cuda
