// A GPT block's attention, fused or materialised (attention.hpp).
#include "model/attention.hpp"

#include <cmath>

#include "common/gemm_shape.hpp"
#include "model/ops.hpp"

namespace lockstep::detail {
namespace {

// One operand of the materialised path's products: the matrix of sequence b and head h starts
// at base + b * batch_stride + (h / group) * head_stride, where group is 1 for an operand of the
// query heads (q, y, the (T, T) matrices) and H / Hkv for one of the key/value heads (k, v, and
// their gradients). P is float* for an output, MatIn for an input.
template <class P>
struct PerHead {
  P base;
  std::int64_t batch_stride, head_stride;
  int ld;
  int group = 1;
};

// The operands, for sequences of T positions: q, k, v in qkv (B T, (H + 2 Hkv) D) with head h
// at columns h D of its block (AttentionShape); y in (B T, H D); the (B, H, T, T) matrices.
enum class Part { q, k, v };
template <class P>
PerHead<P> in_qkv(const AttentionShape& s, P qkv, Part part) {
  const std::int64_t width = qkv_width(s), d = s.head_size, kv = kv_heads_of(s);
  const std::int64_t column = part == Part::q ? 0 : (s.heads + (part == Part::v ? kv : 0)) * d;
  return {qkv + column, s.T * width, d, int(width), part == Part::q ? 1 : s.heads / int(kv)};
}
template <class P>
PerHead<P> in_rows(const AttentionShape& s, P y) {
  const int c = s.heads * s.head_size;
  return {y, std::int64_t(s.T) * c, s.head_size, c};
}
template <class P>
PerHead<P> in_squares(const AttentionShape& s, P att) {
  const std::int64_t tt = std::int64_t(s.T) * s.T;
  return {att, s.heads * tt, tt, s.T};
}

// C(b, h) = op(A(b, h)) op(B(b, h)) for every sequence b and query head h, as few batched GEMM
// calls as the layout allows, each over uniformly strided operands: one per query head (B
// matrices each), or one per sequence and place in the group (Hkv each: query heads g, g + G,
// g + 2G, ... with kv heads 0, 1, 2, ...), whichever is fewer; without grouping (G = 1) one per
// head or one per sequence. A C of the kv heads (dK, dV) is the sum over the group's query
// heads: its first head's call writes it, the others add to it (beta 1), in the heads' order.
void per_head_gemm(Device& dev, const AttentionShape& s, Transpose ta, Transpose tb, int m,
                   int n, int k, PerHead<MatIn> a, PerHead<MatIn> b, PerHead<float*> c) {
  const int group = s.heads / kv_heads_of(s);
  const auto at = [](const auto& x, int h) { return x.base + (h / x.group) * x.head_stride; };
  const auto beta = [&](int h) { return c.group > 1 && h % c.group != 0 ? 1.0f : 0.0f; };
  if (s.heads <= s.batch * group) {
    for (int h = 0; h < s.heads; ++h)
      matmul_batched(dev, ta, tb, m, n, k, at(a, h), a.ld, a.batch_stride, at(b, h), b.ld,
                     b.batch_stride, at(c, h), c.ld, c.batch_stride, s.batch, beta(h));
  } else {
    // Within one call consecutive matrices are G query heads apart: one kv head apart.
    const auto step = [&](const auto& x) { return x.head_stride * (group / x.group); };
    for (int q = 0; q < s.batch; ++q)
      for (int g = 0; g < group; ++g)
        matmul_batched(dev, ta, tb, m, n, k, at(a, g) + q * a.batch_stride, a.ld, step(a),
                       at(b, g) + q * b.batch_stride, b.ld, step(b),
                       at(c, g) + q * c.batch_stride, c.ld, step(c), kv_heads_of(s), beta(g));
  }
}

float scale_of(const AttentionShape& s) { return 1.0f / std::sqrt(float(s.head_size)); }

}  // namespace

// Materialised: att = causal_softmax(q k^T / sqrt(D)) (T, T); y = att v (T, D); per sequence
// and head. Under bf16 the scores and y are computed in fp32 working memory (squares,
// y_product); the softmax rounds the probabilities as it stores them, y is rounded after its
// product.
void attention_forward(Device& dev, const AttentionShape& s, MatIn qkv, MatOut y,
                       const AttentionBuffers& buf) {
  if (buf.path == AttentionKind::fused) return dev.attention_forward(s, qkv, y, buf.lse);
  check_attention_shape("attention_forward (materialized)", s);
  const int t = s.T, dh = s.head_size;
  float* scores = buf.probs.bf16 ? buf.squares : buf.probs.f32;
  per_head_gemm(dev, s, Transpose::no, Transpose::yes, t, t, dh, in_qkv(s, qkv, Part::q),
                in_qkv(s, qkv, Part::k), in_squares(s, scores));
  if (s.positions) dev.mask_packed_scores(scores, s.positions, s.batch, s.heads, t);
  if (buf.probs.bf16)
    dev.causal_softmax_forward(scores, buf.probs.bf16, s.batch * s.heads, t, scale_of(s));
  else
    dev.causal_softmax_forward(scores, buf.probs.f32, s.batch * s.heads, t, scale_of(s));
  float* product = y.bf16 ? buf.y_product : y.f32;
  per_head_gemm(dev, s, Transpose::no, Transpose::no, t, dh, t, in_squares(s, buf.probs.input()),
                in_qkv(s, qkv, Part::v), in_rows(s, product));
  if (y.bf16)
    dev.to_bf16(product, y.bf16, std::size_t(s.batch) * t * s.heads * dh);
}

// Materialised, from dy: d att = dy v^T; d v = att^T dy; d scores by the softmax's backward
// (scaled); d q = d scores k; d k = d scores^T q; a kv head's d k and d v summed over the query
// heads that read it (per_head_gemm). Under bf16 the softmax's backward reads the bf16
// probabilities and writes d scores rounded into squares16.
void attention_backward(Device& dev, const AttentionShape& s, MatIn qkv, MatIn y, MatIn dy,
                        const AttentionBuffers& buf, float* dqkv) {
  if (buf.path == AttentionKind::fused)
    return dev.attention_backward(s, qkv, y, dy, buf.lse, dqkv);
  check_attention_shape("attention_backward (materialized)", s);
  const int t = s.T, dh = s.head_size;
  per_head_gemm(dev, s, Transpose::no, Transpose::yes, t, t, dh, in_rows(s, dy),
                in_qkv(s, qkv, Part::v), in_squares(s, buf.squares));
  per_head_gemm(dev, s, Transpose::yes, Transpose::no, t, dh, t,
                in_squares(s, buf.probs.input()), in_rows(s, dy), in_qkv(s, dqkv, Part::v));
  MatIn datt{buf.squares, nullptr};
  if (buf.probs.bf16) {
    dev.causal_softmax_backward(buf.probs.bf16, buf.squares, buf.squares16, s.batch * s.heads, t,
                                scale_of(s));
    datt = {nullptr, buf.squares16};
  } else {
    dev.causal_softmax_backward(buf.probs.f32, buf.squares, buf.squares, s.batch * s.heads, t,
                                scale_of(s));
  }
  per_head_gemm(dev, s, Transpose::no, Transpose::no, t, dh, t, in_squares(s, datt),
                in_qkv(s, qkv, Part::k), in_qkv(s, dqkv, Part::q));
  per_head_gemm(dev, s, Transpose::yes, Transpose::no, t, dh, t, in_squares(s, datt),
                in_qkv(s, qkv, Part::q), in_qkv(s, dqkv, Part::k));
}

// Query head h = kv G + g reads kv head kv (G = H / Hkv): for each g one batched product over
// the kv heads, matrices G query heads (one kv head) apart, as per_head_gemm's second form.
void cached_attention(Device& dev, const AttentionShape& s, const float* cache, int start,
                      int count, float* scores, float* y) {
  const int kv = kv_heads_of(s), group = s.heads / kv, d = s.head_size, keys = start + count;
  const int width = int(qkv_width(s)), yw = s.heads * d;
  const std::int64_t square = std::int64_t(count) * keys;
  const float* q = cache + std::int64_t(start) * width;
  const float* k = cache + std::int64_t(s.heads) * d;
  const float* v = k + std::int64_t(kv) * d;
  for (int g = 0; g < group; ++g)
    matmul_batched(dev, Transpose::no, Transpose::yes, count, keys, d, {q + g * d, nullptr},
                   width, std::int64_t(group) * d, {k, nullptr}, width, d, scores + g * square,
                   keys, group * square, kv);
  dev.causal_softmax_tail_forward(scores, scores, s.heads, count, keys, scale_of(s));
  for (int g = 0; g < group; ++g)
    matmul_batched(dev, Transpose::no, Transpose::no, count, d, keys,
                   {scores + g * square, nullptr}, keys, group * square, {v, nullptr}, width, d,
                   y + g * d, yw, std::int64_t(group) * d, kv);
}

}  // namespace lockstep::detail
