// Causal self-attention without the (T, T) matrices: FlashAttention-2's tiled online softmax
// (CUDA runs cuDNN's instead: Note [cuDNN attention] in src/cuda/cudnn_attention.hpp).
//
// Note [Tiled attention]
// ~~~~~~~~~~~~~~~~~~~~~~
// The materialised path (src/model/attention.cpp) computes the scores q k^T of every sequence
// and head as a (T, T) matrix, keeps the probabilities for backward and writes their gradient
// into another: B H T^2 values each, which grow with the square of the context. This op never
// holds more than a tile of them (Dao, "FlashAttention-2", 2023, algorithms 1 and 2):
//  - Forward, per sequence, head and tile of query rows: the key tiles left of the diagonal in
//    order, each a product S = Q_i K_j^T (tile, tile); a running max m and sum l per row; the
//    exponentials P = exp(scale S - m) (masked above the diagonal) added into O += P V_j after O
//    and l are rescaled by exp(m_old - m_new). At the end y = O / l, and lse = m + log l is kept:
//    B H T floats, all backward needs of the probabilities.
//  - Backward, per sequence and head: D = rowsum(dy * y) (= rowsum(P * dP)); then for each key
//    tile j, over the query tiles i >= j in order, P = exp(scale S - lse) recomputed, dV_j +=
//    P^T dy_i, dP = dy_i V_j^T, dS = scale P (dP - D), dQ_i += dS K_j, dK_j += dS^T Q_i.
//  - Tiles above the diagonal are skipped: about half of the products of the materialised path,
//    which computes the full (T, T) and masks it. Tiles on the diagonal are masked per element.
//  - Every tile is kTile x kTile (smaller T: T rounded up to 8), padded with zero rows past T,
//    so the products have three shapes only, and go to OpenBLAS where it takes small products
//    (tile_library(), Note [CPU matrix products]: oneDNN's per-call cost outweighed a tile).
//  - Grouped-query attention (AttentionShape::kv_heads, Hkv dividing H, G = H / Hkv): query
//    head h reads the K and V tiles of kv head h / G where they lie in qkv, with no repeated
//    copies. Backward's dK and dV of a kv head are sums over its G query heads: its task holds
//    them for the whole sequence and runs the query heads one after another, each adding over
//    the key tiles as above. With Hkv = H (G = 1) this is the same sequence of products as
//    before grouping, bit for bit.
//  - Deterministic: oneTBB runs forward's tasks over (sequence, head, query tile) and
//    backward's over (sequence, kv head); each task owns what it writes and adds in a fixed
//    order (query heads ascending, then query tiles), so the result does not depend on the
//    thread count. Backward's dQ of a head is added over the key tiles, and dK, dV over the
//    group's heads, which is why its task is the whole kv head: B Hkv tasks, so multi-query
//    attention at batch 1 runs its backward on one thread (per-head partial sums in a second
//    buffer, added in order, would trade B H T D x 8 bytes for that parallelism).
//  - bf16 (Note [bf16 compute]): q, k, v and dy are read widened from bf16; the probabilities
//    and the score gradients are rounded to bf16 before their products, as the materialised
//    path keeps them; the products run in fp32 on those bf16 values, which is a bf16 product
//    with fp32 accumulation. The exponentials are exp_poly's (Note [One exp for both backends])
//    so that the loops vectorise.
// The two paths differ only in the order of summation (fp32: within 1e-5 relative,
// tests/cpu/test_attention.cpp; 8e-7 measured). Measured (bench/bench_attention, B 8, H 12,
// D 64, 2 shared Zen 3 cores; bench/RESULTS.md): forward + backward 1.45-1.9x the materialised
// path at T = 1024 in fp32 (1.8x bf16), 1.7x (1.6x) at 2048, 1.1x (2.0x) at 256, and no faster
// in fp32 below that (0.9-1.0x at T 64-128: the tiles' copies and calls eat the masked half),
// hence auto's fp32 threshold (choose_attention); the kept bytes drop from B H T^2 to B H T.
#include "cpu/cpu_device.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "common/bf16.hpp"
#include "common/elementwise_math.hpp"
#include "common/gemm_shape.hpp"
#include "cpu/ops/isa_dispatch.hpp"

namespace lockstep::cpu {
namespace {

constexpr int kTile = 64;  // query rows and key columns of a tile

// The tiles of a sequence of T positions.
struct Tiling {
  int tile, tiles;
  explicit Tiling(int T)
      : tile(std::min(kTile, (T + 7) / 8 * 8)), tiles((T + tile - 1) / tile) {}
};

// Where the heads sit in a qkv row of `width` columns (AttentionShape): query head h at q(h),
// the key and value heads it reads (kv head h / group) at k(h) and v(h); kv_k(g) and kv_v(g)
// by kv head g.
struct QkvColumns {
  int D, H, group;
  std::int64_t width;
  explicit QkvColumns(const AttentionShape& s)
      : D(s.head_size), H(s.heads), group(s.heads / kv_heads_of(s)), width(qkv_width(s)) {}
  std::int64_t q(int h) const { return std::int64_t(h) * D; }
  std::int64_t kv_k(int g) const { return (std::int64_t(H) + g) * D; }
  std::int64_t kv_v(int g) const { return kv_k(g) + std::int64_t(H / group) * D; }
  std::int64_t k(int h) const { return kv_k(h / group); }
  std::int64_t v(int h) const { return kv_v(h / group); }
};

// Rows [r0, r0 + count) of columns [col, col + D) of the (B T, ld) matrix m, widened to fp32,
// into dst (count, D); rows at or past `valid` are zero.
void load_rows(MatIn m, std::int64_t first_row, std::int64_t ld, std::int64_t col, int count,
               int valid, int D, float* dst) {
  for (int r = 0; r < count; ++r) {
    float* out = dst + std::size_t(r) * D;
    if (r >= valid) {
      std::fill(out, out + D, 0.0f);
      continue;
    }
    const std::int64_t at = (first_row + r) * ld + col;
    // Plain loops, not std::copy: a row is a few hundred bytes, less than a memmove call costs.
    if (m.bf16) {
      for (int d = 0; d < D; ++d) out[d] = detail::bf16_to_float(m.bf16[at + d]);
    } else {
      for (int d = 0; d < D; ++d) out[d] = m.f32[at + d];
    }
  }
}

// The rows of a tile are `tile` floats, a multiple of kLanes; the first `valid` are unmasked.
// Maxima and sums go lane by lane, then over the lanes in order: the same values whatever the
// vector width (Note [Wide vectors for the CPU kernels]).
constexpr int kLanes = 8;

// The larger of `init` and the largest scale * s[c] for first <= c < valid.
float row_max(const float* s, float scale, int first, int valid, int tile, float init) {
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, init);
  for (int c = 0; c < tile; c += kLanes)
    for (int l = 0; l < kLanes; ++l)
      lanes[l] = std::max(lanes[l], c + l < valid && c + l >= first ? scale * s[c + l] : init);
  for (int l = 1; l < kLanes; ++l) lanes[0] = std::max(lanes[0], lanes[l]);
  return lanes[0];
}

// p[c] = exp(scale s[c] - shift) for first <= c < valid, 0 elsewhere; returns their sum.
float exp_row(const float* s, float scale, float shift, int first, int valid, int tile,
              float* p) {
  float lanes[kLanes] = {};
  for (int c = 0; c < tile; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float e = detail::exp_poly(scale * s[c + l] - shift);
      p[c + l] = c + l < valid && c + l >= first ? e : 0.0f;
      lanes[l] += p[c + l];
    }
  for (int l = 1; l < kLanes; ++l) lanes[0] += lanes[l];
  return lanes[0];
}

void round_to_bf16(float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] = detail::round_to_bf16(x[i]);
}

// The three products of a tile, for tiles of `tile` rows and D channels, all (tile, D) or
// (tile, tile) row-major:  scores = A B^T;  add_product: C += A B;  add_product_t: C += A^T B.
struct TileProducts {
  GemmCall nt, nn, tn;
  TileProducts(int tile, int D)
      : nt{.bt = true, .m = tile, .n = tile, .k = D, .lda = D, .ldb = D, .ldc = tile},
        nn{.m = tile, .n = D, .k = tile, .lda = tile, .ldb = D, .ldc = D, .beta = 1.0f},
        tn{.at = true, .m = tile, .n = D, .k = tile, .lda = tile, .ldb = D, .ldc = D,
           .beta = 1.0f} {}
  void prepare(Matmul& mm) const {
    mm.prepare(nt);
    mm.prepare(nn);
    mm.prepare(tn);
  }
};

// What one thread holds for a task, reused across tasks.
struct TileBuffers {
  std::vector<float> q, k, v, dy, s, p, o, dq, dk, dv, m, l, rowsum_dy_y;
};
TileBuffers& buffers() {
  thread_local TileBuffers b;
  return b;
}

// The first key column of tile column c0 that row `row` of sequence `seq` may read: 0, or for
// packed sequences (AttentionShape::positions) the start of its own, row - position, relative
// to c0 (Note [Packed attention] in src/model/attention.hpp).
int first_key(const AttentionShape& s, std::int64_t seq, int row, int c0) {
  if (!s.positions) return 0;
  return std::max(0, row - s.positions[seq + row] - c0);
}

}  // namespace

void CpuDevice::attention_forward(const AttentionShape& shape, MatIn qkv, MatOut y, float* lse) {
  detail::check_attention_shape("attention_forward", shape);
  const QkvColumns cols(shape);
  const int T = shape.T, H = shape.heads, D = shape.head_size, C = H * D;
  const Tiling tl(T);
  const int tile = tl.tile;
  const TileProducts prod(tile, D);
  prod.prepare(tiles_);
  const float scale = 1.0f / std::sqrt(float(D));
  const bool bf16 = qkv.bf16 != nullptr;
  const std::size_t tasks = std::size_t(shape.batch) * H * tl.tiles;
  for_blocks(tasks, vectorized([&, T, H, D, C, tile, scale, bf16](std::size_t task) {
    const int i = int(task % tl.tiles), h = int(task / tl.tiles % H), b = int(task / tl.tiles / H);
    const std::int64_t seq = std::int64_t(b) * T;
    const int r0 = i * tile, rows = std::min(tile, T - r0);
    const std::size_t td = std::size_t(tile) * D, tt = std::size_t(tile) * tile;
    TileBuffers& w = buffers();
    w.q.resize(td), w.k.resize(td), w.v.resize(td), w.o.assign(td, 0.0f);
    w.s.resize(tt), w.p.resize(tt);
    w.m.assign(tile, -std::numeric_limits<float>::infinity());
    w.l.assign(tile, 0.0f);
    load_rows(qkv, seq + r0, cols.width, cols.q(h), tile, rows, D, w.q.data());
    for (int j = 0; j <= i; ++j) {
      const int c0 = j * tile, valid_cols = std::min(tile, T - c0);
      load_rows(qkv, seq + c0, cols.width, cols.k(h), tile, valid_cols, D, w.k.data());
      load_rows(qkv, seq + c0, cols.width, cols.v(h), tile, valid_cols, D, w.v.data());
      tiles_.run(prod.nt, w.q.data(), w.k.data(), w.s.data());
      for (int r = 0; r < tile; ++r) {
        // Keys c0 .. r0 + r (the causal mask), from its sequence's start when packed; none for
        // a padding row.
        int valid = r < rows ? std::min(tile, r0 + r - c0 + 1) : 0;
        const int first = r < rows ? first_key(shape, seq, r0 + r, c0) : 0;
        if (first >= valid) valid = 0;
        const float* sr = w.s.data() + std::size_t(r) * tile;
        float* pr = w.p.data() + std::size_t(r) * tile;
        const float m = row_max(sr, scale, first, valid, tile, w.m[r]);
        const float sum = exp_row(sr, scale, m, first, valid, tile, pr);
        if (valid == 0) continue;
        const float alpha = detail::exp_poly(w.m[r] - m);
        w.l[r] = alpha * w.l[r] + sum;
        w.m[r] = m;
        float* orow = w.o.data() + std::size_t(r) * D;
        for (int d = 0; d < D; ++d) orow[d] *= alpha;
      }
      if (bf16) round_to_bf16(w.p.data(), tt);
      tiles_.run(prod.nn, w.p.data(), w.v.data(), w.o.data());
    }
    float* lse_row = lse + (std::size_t(b) * H + h) * T + r0;
    for (int r = 0; r < rows; ++r) {
      const float inv = 1.0f / w.l[r];
      const std::int64_t at = (seq + r0 + r) * C + h * D;
      const float* orow = w.o.data() + std::size_t(r) * D;
      if (y.bf16) {
        for (int d = 0; d < D; ++d) detail::store_value(&y.bf16[at + d], orow[d] * inv);
      } else {
        for (int d = 0; d < D; ++d) y.f32[at + d] = orow[d] * inv;
      }
      lse_row[r] = w.m[r] + std::log(w.l[r]);
    }
  }));
}

void CpuDevice::attention_backward(const AttentionShape& shape, MatIn qkv, MatIn y, MatIn dy,
                                   const float* lse, float* dqkv) {
  detail::check_attention_shape("attention_backward", shape);
  const QkvColumns cols(shape);
  const int T = shape.T, H = shape.heads, D = shape.head_size, C = H * D;
  const int kv_heads = kv_heads_of(shape), group = cols.group;
  const Tiling tl(T);
  const int tile = tl.tile, padded = tl.tiles * tile;
  const TileProducts prod(tile, D);
  prod.prepare(tiles_);
  const float scale = 1.0f / std::sqrt(float(D));
  const bool bf16 = qkv.bf16 != nullptr;
  const std::size_t tasks = std::size_t(shape.batch) * kv_heads;
  for_blocks(tasks, vectorized([&, T, H, D, C, kv_heads, group, tile, padded, scale,
                                bf16](std::size_t task) {
    const int g = int(task % kv_heads), b = int(task / kv_heads);
    const std::int64_t seq = std::int64_t(b) * T;
    const std::size_t tt = std::size_t(tile) * tile, whole = std::size_t(padded) * D;
    TileBuffers& w = buffers();
    w.q.resize(whole), w.k.resize(whole), w.v.resize(whole), w.dy.resize(whole);
    w.dq.resize(whole), w.s.resize(tt), w.p.resize(tt);
    w.dk.assign(whole, 0.0f), w.dv.assign(whole, 0.0f);
    load_rows(qkv, seq, cols.width, cols.kv_k(g), padded, T, D, w.k.data());
    load_rows(qkv, seq, cols.width, cols.kv_v(g), padded, T, D, w.v.data());
    // The query heads of kv head g in order, each adding into dK and dV (Note [Tiled attention]).
    for (int h = g * group; h < (g + 1) * group; ++h) {
      load_rows(qkv, seq, cols.width, cols.q(h), padded, T, D, w.q.data());
      load_rows(dy, seq, C, h * D, padded, T, D, w.dy.data());
      std::fill(w.dq.begin(), w.dq.end(), 0.0f);
      // D_r = rowsum(dy * y), y widened as stored, dy as the products read it.
      w.rowsum_dy_y.assign(padded, 0.0f);
      w.o.resize(D);
      for (int r = 0; r < T; ++r) {
        load_rows(y, seq + r, C, h * D, 1, 1, D, w.o.data());
        const float* dyr = w.dy.data() + std::size_t(r) * D;
        double dot = 0.0;
        for (int d = 0; d < D; ++d) dot += double(dyr[d]) * w.o[d];
        w.rowsum_dy_y[r] = static_cast<float>(dot);
      }
      const float* lse_head = lse + (std::size_t(b) * H + h) * T;
      for (int j = 0; j < tl.tiles; ++j) {
        const int c0 = j * tile;
        const float* kj = w.k.data() + std::size_t(c0) * D;
        const float* vj = w.v.data() + std::size_t(c0) * D;
        float* dkj = w.dk.data() + std::size_t(c0) * D;
        float* dvj = w.dv.data() + std::size_t(c0) * D;
        for (int i = j; i < tl.tiles; ++i) {
          const int r0 = i * tile, rows = std::min(tile, T - r0);
          const float* qi = w.q.data() + std::size_t(r0) * D;
          const float* dyi = w.dy.data() + std::size_t(r0) * D;
          tiles_.run(prod.nt, qi, kj, w.s.data());
          for (int r = 0; r < tile; ++r) {
            const int valid = r < rows ? std::min(tile, r0 + r - c0 + 1) : 0;
            const int first = r < rows ? first_key(shape, seq, r0 + r, c0) : 0;
            const float row_lse = r < rows ? lse_head[r0 + r] : 0.0f;
            exp_row(w.s.data() + std::size_t(r) * tile, scale, row_lse, first, valid, tile,
                    w.p.data() + std::size_t(r) * tile);
          }
          if (bf16) round_to_bf16(w.p.data(), tt);
          tiles_.run(prod.tn, w.p.data(), dyi, dvj);
          tiles_.run(prod.nt, dyi, vj, w.s.data());  // dP, over the scores
          for (int r = 0; r < tile; ++r) {
            const float d_r = w.rowsum_dy_y[r0 + r];
            float* dpr = w.s.data() + std::size_t(r) * tile;
            const float* pr = w.p.data() + std::size_t(r) * tile;
            for (int c = 0; c < tile; ++c) dpr[c] = scale * pr[c] * (dpr[c] - d_r);
          }
          if (bf16) round_to_bf16(w.s.data(), tt);
          tiles_.run(prod.nn, w.s.data(), kj, w.dq.data() + std::size_t(r0) * D);
          tiles_.run(prod.tn, w.s.data(), qi, dkj);
        }
      }
      for (int r = 0; r < T; ++r) {
        float* row = dqkv + (seq + r) * cols.width + cols.q(h);
        const float* dq = w.dq.data() + std::size_t(r) * D;
        for (int d = 0; d < D; ++d) row[d] = dq[d];
      }
    }
    for (int r = 0; r < T; ++r) {
      float* row = dqkv + (seq + r) * cols.width;
      const float *dk = w.dk.data() + std::size_t(r) * D, *dv = w.dv.data() + std::size_t(r) * D;
      for (int d = 0; d < D; ++d) row[cols.kv_k(g) + d] = dk[d], row[cols.kv_v(g) + d] = dv[d];
    }
  }));
}

}  // namespace lockstep::cpu
