// A GPT block's attention, fused or materialised (attention.hpp).
#include "model/attention.hpp"

#include <cmath>

#include "model/ops.hpp"

namespace lockstep::detail {
namespace {

// One operand of the materialised path's products: the matrix of sequence b and head h starts
// at base + b * batch_stride + h * head_stride. P is float* for an output, MatIn for an input.
template <class P>
struct PerHead {
  P base;
  std::int64_t batch_stride, head_stride;
  int ld;
};

// The operands, for sequences of T positions: q, k, v in qkv (B T, 3C) and y in (B T, C) with
// head h at columns h D; the (B, H, T, T) matrices.
template <class P>
PerHead<P> in_qkv(const AttentionShape& s, P qkv, int which) {
  const int c = s.heads * s.head_size;
  return {qkv + which * c, std::int64_t(s.T) * 3 * c, s.head_size, 3 * c};
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

// C(b, h) = op(A(b, h)) op(B(b, h)) for every sequence b and head h, as few batched GEMM calls
// as the layout allows: one per head (B matrices each) or one per sequence (H each), whichever
// is fewer. Every operand is uniformly strided both ways.
void per_head_gemm(Device& dev, const AttentionShape& s, Transpose ta, Transpose tb, int m,
                   int n, int k, PerHead<MatIn> a, PerHead<MatIn> b, PerHead<float*> c) {
  if (s.batch >= s.heads) {
    for (int h = 0; h < s.heads; ++h)
      matmul_batched(dev, ta, tb, m, n, k, a.base + h * a.head_stride, a.ld, a.batch_stride,
                     b.base + h * b.head_stride, b.ld, b.batch_stride, c.base + h * c.head_stride,
                     c.ld, c.batch_stride, s.batch);
  } else {
    for (int q = 0; q < s.batch; ++q)
      matmul_batched(dev, ta, tb, m, n, k, a.base + q * a.batch_stride, a.ld, a.head_stride,
                     b.base + q * b.batch_stride, b.ld, b.head_stride, c.base + q * c.batch_stride,
                     c.ld, c.head_stride, s.heads);
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
  const int t = s.T, dh = s.head_size;
  float* scores = buf.probs.bf16 ? buf.squares : buf.probs.f32;
  per_head_gemm(dev, s, Transpose::no, Transpose::yes, t, t, dh, in_qkv(s, qkv, 0),
                in_qkv(s, qkv, 1), in_squares(s, scores));
  if (buf.probs.bf16)
    dev.causal_softmax_forward(scores, buf.probs.bf16, s.batch * s.heads, t, scale_of(s));
  else
    dev.causal_softmax_forward(scores, buf.probs.f32, s.batch * s.heads, t, scale_of(s));
  float* product = y.bf16 ? buf.y_product : y.f32;
  per_head_gemm(dev, s, Transpose::no, Transpose::no, t, dh, t, in_squares(s, buf.probs.input()),
                in_qkv(s, qkv, 2), in_rows(s, product));
  if (y.bf16)
    dev.to_bf16(product, y.bf16, std::size_t(s.batch) * t * s.heads * dh);
}

// Materialised, from dy: d att = dy v^T; d v = att^T dy; d scores by the softmax's backward
// (scaled); d q = d scores k; d k = d scores^T q. Under bf16 the softmax's backward reads the
// bf16 probabilities and writes d scores rounded into squares16.
void attention_backward(Device& dev, const AttentionShape& s, MatIn qkv, MatIn y, MatIn dy,
                        const AttentionBuffers& buf, float* dqkv) {
  if (buf.path == AttentionKind::fused)
    return dev.attention_backward(s, qkv, y, dy, buf.lse, dqkv);
  const int t = s.T, dh = s.head_size;
  per_head_gemm(dev, s, Transpose::no, Transpose::yes, t, t, dh, in_rows(s, dy),
                in_qkv(s, qkv, 2), in_squares(s, buf.squares));
  per_head_gemm(dev, s, Transpose::yes, Transpose::no, t, dh, t,
                in_squares(s, buf.probs.input()), in_rows(s, dy), in_qkv(s, dqkv, 2));
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
                in_qkv(s, qkv, 1), in_qkv(s, dqkv, 0));
  per_head_gemm(dev, s, Transpose::yes, Transpose::no, t, dh, t, in_squares(s, datt),
                in_qkv(s, qkv, 0), in_qkv(s, dqkv, 1));
}

}  // namespace lockstep::detail
