// A GPT block's causal self-attention, both ways model.attention offers (AttentionKind):
//
//   const detail::AttentionBuffers buf{.path = AttentionKind::fused, .lse = lse};
//   detail::attention_forward(dev, shape, qkv, y, buf);          // y = attention(q, k, v)
//   detail::attention_backward(dev, shape, qkv, y, dy, buf, dqkv);
//
// fused: Device::attention_forward/backward, which keep the log-sum-exp (B, H, T) only (Note
// [Tiled attention] in src/cpu/ops/attention.cpp). materialized: the reference, composed of
// batched products around the causal softmax over (B, H, T, T) matrices kept for backward.
//
// Shapes (AttentionShape): qkv (B T, (H + 2 Hkv) D) with the H query heads, then the Hkv key
// heads, then the Hkv value heads, head h at columns h D of its block ((B T, 3C) with C = H D
// without grouping); query head h reads kv head h / (H / Hkv); y and dy (B T, H D), heads side
// by side; dqkv in qkv's layout, overwritten. bf16 (qkv stored in bf16): the rounding points of
// Note [bf16 compute] in model/ops.hpp.
//
// Note [Packed attention]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A packed window holds several sequences (Note [Packed windows] in src/data/chat.cpp), each of
// its rows tagged with its position in its own sequence (AttentionShape::positions, from
// LayerWorkspace::positions). Sequences are contiguous and a position counts up from 0 where one
// starts, so the query of row t at position p belongs to the sequence of rows t - p .. t: it
// reads those keys and no other. Both paths take the bound per row: the materialised one sets
// the scores of earlier keys to -inf before its causal softmax (mask_packed_scores), whose
// probabilities, and so gradients, are then 0 there; the tiled one masks the same keys in its
// tiles. RoPE's angles (RopeShape::positions) restart likewise. A packed window thus computes
// what its sequences would each in a window of its own, up to the order of summation. On CUDA
// the fused path (cuDNN) takes the same bound as an additive score bias (Note [cuDNN packed
// mask] in src/cuda/cudnn_attention.hpp), and model.attention auto chooses as for unpacked
// data (attention_choice).
#pragma once

#include <cstddef>
#include <cstdint>

#include "lockstep/device.hpp"

namespace lockstep::detail {

// What each path keeps from forward to backward, and its working memory.
struct AttentionBuffers {
  AttentionKind path = AttentionKind::materialized;  // fused or materialized
  // fused: (B, H, T) log-sum-exp, kept.
  float* lse = nullptr;
  // materialized: (B, H, T, T) probabilities, kept, in y's storage (fp32 or bf16).
  MatOut probs{};
  // materialized: fp32 (B, H, T, T) working memory: the scores under bf16, then dP, and dS in
  // fp32.
  float* squares = nullptr;
  // materialized, bf16: (B, H, T, T) bf16 working memory for dS (it may hold dy's bf16, which
  // the products have read by then), and fp32 (B T, C) for y's product before it is rounded.
  std::uint16_t* squares16 = nullptr;
  float* y_product = nullptr;
};

// y = softmax_causal(q k^T / sqrt(D)) v per sequence and head, in y's storage.
void attention_forward(Device& dev, const AttentionShape& shape, MatIn qkv, MatOut y,
                       const AttentionBuffers& buf);
// dqkv from dy as the products read it (fp32, or rounded to bf16), y as forward stored it.
void attention_backward(Device& dev, const AttentionShape& shape, MatIn qkv, MatIn y, MatIn dy,
                        const AttentionBuffers& buf, float* dqkv);

// Attention of the newest `count` positions of one sequence against a key/value cache (Note
// [KV cache] in src/model/kv_cache.cpp), fp32: `cache` holds the qkv rows (start + count, (H +
// 2 Hkv) D) of the sequence so far in forward's layout (shape.batch 1, shape.T the model's
// context, unused here), the queries being rows [start, start + count); y (count, H D) =
// softmax(q k^T / sqrt(D)) v over keys 0 .. each query's own position; `scores` is (H, count,
// start + count) working memory.
void cached_attention(Device& dev, const AttentionShape& shape, const float* cache, int start,
                      int count, float* scores, float* y);

}  // namespace lockstep::detail
