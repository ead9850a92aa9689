// Token and position embeddings, forward and backward (CUDA: src/cuda/ops/embedding.cu).
#include <algorithm>

#include "common/bf16.hpp"
#include "cpu/cpu_device.hpp"
#include "cpu/ops/isa_dispatch.hpp"

namespace lockstep::cpu {

// out (B, T, C) = wte[ids] + wpe[t or positions[b, t]] (wte[ids] without wpe), a block of rows
// at a time.
void CpuDevice::embedding_forward(const float* ids, const float* wte, const float* wpe, float* out,
                                  int batch, int T, int C, const std::int32_t* positions) {
  const std::size_t nc = static_cast<std::size_t>(C), rows = std::size_t(batch) * T;
  const std::size_t block = rows_per_block(nc);
  for_blocks(blocks_of(rows, block), vectorized([=](std::size_t blk) {
    for (std::size_t r = blk * block; r < std::min(rows, (blk + 1) * block); ++r) {
      const float* tok = wte + static_cast<std::size_t>(ids[r]) * nc;
      if (!wpe) {
        std::copy(tok, tok + nc, out + r * nc);
        continue;
      }
      const std::size_t p = positions ? static_cast<std::size_t>(positions[r])
                                      : r % static_cast<std::size_t>(T);
      const float* pos = wpe + p * nc;
      for (std::size_t c = 0; c < nc; ++c) out[r * nc + c] = tok[c] + pos[c];
    }
  }));
}

// The same from bf16 tables: out (B, T, C) = widened wte[ids] (+ widened wpe[p]), the sum in
// fp32 as above.
void CpuDevice::embedding_forward(const float* ids, const std::uint16_t* wte,
                                  const std::uint16_t* wpe, float* out, int batch, int T, int C,
                                  const std::int32_t* positions) {
  const std::size_t nc = static_cast<std::size_t>(C), rows = std::size_t(batch) * T;
  const std::size_t block = rows_per_block(nc);
  for_blocks(blocks_of(rows, block), vectorized([=](std::size_t blk) {
    for (std::size_t r = blk * block; r < std::min(rows, (blk + 1) * block); ++r) {
      const std::uint16_t* tok = wte + static_cast<std::size_t>(ids[r]) * nc;
      if (!wpe) {
        for (std::size_t c = 0; c < nc; ++c) out[r * nc + c] = detail::bf16_to_float(tok[c]);
        continue;
      }
      const std::size_t p = positions ? static_cast<std::size_t>(positions[r])
                                      : r % static_cast<std::size_t>(T);
      const std::uint16_t* pos = wpe + p * nc;
      for (std::size_t c = 0; c < nc; ++c)
        out[r * nc + c] = detail::bf16_to_float(tok[c]) + detail::bf16_to_float(pos[c]);
    }
  }));
}

// Deterministic without atomics: each block of channels walks every row in order, so a token's
// (and a position's) rows are summed in row order whatever the arena.
void CpuDevice::embedding_backward(const float* ids, const float* dout, float* dwte, float* dwpe,
                                   int batch, int T, int C, const std::int32_t* positions) {
  constexpr std::size_t kCols = 64;
  const std::size_t nc = static_cast<std::size_t>(C), nt = static_cast<std::size_t>(T);
  const std::size_t rows = static_cast<std::size_t>(batch) * nt;
  for_blocks(blocks_of(nc, kCols), vectorized([=](std::size_t blk) {
    const std::size_t c0 = blk * kCols, c1 = std::min(nc, c0 + kCols);
    for (std::size_t r = 0; r < rows; ++r) {
      float* tok = dwte + static_cast<std::size_t>(ids[r]) * nc;
      const float* d = dout + r * nc;
      if (!dwpe) {
        for (std::size_t c = c0; c < c1; ++c) tok[c] += d[c];
        continue;
      }
      float* pos = dwpe + (positions ? static_cast<std::size_t>(positions[r]) : r % nt) * nc;
      for (std::size_t c = c0; c < c1; ++c) {
        tok[c] += d[c];
        pos[c] += d[c];
      }
    }
  }));
}

}  // namespace lockstep::cpu
