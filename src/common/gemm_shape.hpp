// The shape checks every device makes before running a kernel: gemm and gemm_batched, the
// softmax cross-entropy, the fused attention and the rotary embeddings.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

#include "lockstep/device.hpp"

namespace lockstep::detail {

// Row-major op(A) (m, k), op(B) (k, n), C (m, n), with leading dimensions at least the rows'
// widths; std::invalid_argument naming `kernel` otherwise.
inline void check_gemm_shape(const char* kernel, Transpose ta, Transpose tb, int m, int n, int k,
                             int lda, int ldb, int ldc) {
  const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, at ? m : k) || ldb < std::max(1, bt ? k : n) ||
      ldc < std::max(1, n))
    throw std::invalid_argument(fmt::format("{}: bad shape m={} n={} k={} lda={} ldb={} ldc={}",
                                            kernel, m, n, k, lda, ldb, ldc));
}

// logits (rows, classes): std::invalid_argument unless rows >= 0 and classes >= 1.
inline void check_loss_shape(int rows, int classes) {
  if (rows < 0 || classes < 1)
    throw std::invalid_argument(
        fmt::format("softmax_cross_entropy: bad shape rows={} classes={}", rows, classes));
}

// Attention (AttentionOps, and the materialised path): std::invalid_argument naming `op`
// unless batch >= 0, T, heads and head_size >= 1, and kv_heads 0 (= heads) or a divisor of
// heads (grouped-query attention).
inline void check_attention_shape(const char* op, const AttentionShape& s) {
  if (s.batch < 0 || s.T < 1 || s.heads < 1 || s.head_size < 1 || s.kv_heads < 0 ||
      (s.kv_heads > 0 && s.heads % s.kv_heads != 0))
    throw std::invalid_argument(
        fmt::format("{}: bad shape batch={} T={} heads={} head_size={} kv_heads={} (kv_heads: 0 "
                    "for heads, or a divisor of heads)",
                    op, s.batch, s.T, s.heads, s.head_size, s.kv_heads));
}

// Rotary embeddings (LayerOps::rope_forward): std::invalid_argument naming `op` unless batch,
// T and position >= 0, heads and kv_heads >= 1, head_size even and >= 2, and the table holds
// every position the rows reach (position + T).
inline void check_rope_shape(const char* op, const RopeShape& s, const RopeTable& table) {
  if (s.batch < 0 || s.T < 0 || s.position < 0 || s.heads < 1 || s.kv_heads < 1 ||
      s.head_size < 2 || s.head_size % 2 != 0 ||
      std::int64_t{s.position} + s.T > std::int64_t{table.positions})
    throw std::invalid_argument(fmt::format(
        "{}: bad shape batch={} T={} heads={} kv_heads={} head_size={} position={} with a table "
        "of {} positions",
        op, s.batch, s.T, s.heads, s.kv_heads, s.head_size, s.position, table.positions));
}

}  // namespace lockstep::detail
