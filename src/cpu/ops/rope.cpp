// Rotary position embeddings, forward and backward (CUDA: src/cuda/ops/rope.cu).
#include "cpu/cpu_device.hpp"

#include "common/bf16.hpp"
#include "common/elementwise_math.hpp"
#include "common/gemm_shape.hpp"

namespace lockstep::cpu {

// Note [RoPE]
// ~~~~~~~~~~~
// Llama-family decoders rotate each q and k head by its position before attention, in Hugging
// Face's rotate-half layout: a head's channel i pairs with channel i + D/2 (not 2i with 2i + 1,
// Meta's original layout), so checkpoints load without permuting q_proj and k_proj. With c, s
// the cos and sin of p * inv_freq[i] (RopeTable, made once per run by model/rope.hpp),
//   y[i] = x[i] c - x[i + D/2] s,  y[i + D/2] = x[i + D/2] c + x[i] s    (i < D/2),
// transformers' q * cos + rotate_half(q) * sin with its roundings (detail::rope_rotate).
// The op works in place on the qkv product's output (B T, (H + 2 Hkv) D): the q block's H heads
// and the k block's Hkv heads are its first H + Hkv heads, so each row rotates those and skips
// v; no copy of q or k is made, and attention then reads qkv as before. Backward is the inverse
// rotation (by -s; the rotation is orthogonal, so its transpose) of dq and dk, in place on the
// attention's dqkv, which under bf16 the same pass rounds whole (v included) into the qkv
// product's input (dqkv_bf16). A bf16 qkv (kept for backward, Note [bf16 compute]) is widened,
// rotated in fp32 and rounded once: bit for bit from_bf16, the fp32 op, to_bf16. No fused
// multiply-add on either backend, so the CUDA kernel computes the same bits.

// Rotates the first H + Hkv heads of every row of x (B T, (H + 2 Hkv) D), Q float or bf16, by
// the table's angles times `sign` (+1 forward, -1 backward); copies each row rounded into
// x_bf16 (the whole row) when that is not null.
template <class Q>
void CpuDevice::rope_rotate_of(const RopeShape& shape, const RopeTable& table, Q* x, float sign,
                               std::uint16_t* x_bf16) {
  const std::size_t half = static_cast<std::size_t>(shape.head_size / 2);
  const std::size_t rotated = static_cast<std::size_t>(shape.heads + shape.kv_heads);
  const std::size_t width = (rotated + static_cast<std::size_t>(shape.kv_heads)) * 2 * half;
  const std::size_t nr = static_cast<std::size_t>(shape.batch) * std::size_t(shape.T);
  const std::size_t T = static_cast<std::size_t>(shape.T);
  const std::size_t first = static_cast<std::size_t>(shape.position);
  const float* cos = table.cos;
  const float* sin = table.sin;
  const std::int32_t* positions = shape.positions;
  for_rows(nr, width, [=](std::size_t r) {
    const std::size_t p =
        positions ? static_cast<std::size_t>(positions[r]) : first + r % T;  // packed: its own
    const float* cr = cos + p * half;
    const float* sr = sin + p * half;
    Q* row = x + r * width;
    for (std::size_t h = 0; h < rotated; ++h) {
      Q* lo = row + h * 2 * half;
      Q* hi = lo + half;
      for (std::size_t i = 0; i < half; ++i) {
        const detail::RotatedPair y = detail::rope_rotate(
            detail::load_value(lo[i]), detail::load_value(hi[i]), cr[i], sign * sr[i]);
        detail::store_value(&lo[i], y.first);
        detail::store_value(&hi[i], y.second);
      }
    }
    if (x_bf16)
      for (std::size_t c = 0; c < width; ++c)
        x_bf16[r * width + c] = detail::float_to_bf16(detail::load_value(row[c]));
  });
}

void CpuDevice::rope_forward(const RopeShape& shape, const RopeTable& table, float* qkv) {
  detail::check_rope_shape("rope_forward", shape, table);
  rope_rotate_of(shape, table, qkv, 1.0f, nullptr);
}

void CpuDevice::rope_forward(const RopeShape& shape, const RopeTable& table,
                             std::uint16_t* qkv) {
  detail::check_rope_shape("rope_forward", shape, table);
  rope_rotate_of(shape, table, qkv, 1.0f, nullptr);
}

void CpuDevice::rope_backward(const RopeShape& shape, const RopeTable& table, float* dqkv,
                              std::uint16_t* dqkv_bf16) {
  detail::check_rope_shape("rope_backward", shape, table);
  rope_rotate_of(shape, table, dqkv, -1.0f, dqkv_bf16);
}

}  // namespace lockstep::cpu
