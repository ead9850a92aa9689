// GEMM through oneDNN or OpenBLAS (cpu/matmul.hpp, Note [CPU matrix products]); the CUDA device
// calls cuBLAS from src/cuda/cuda_device.cpp.
#include <type_traits>

#include "common/gemm_shape.hpp"
#include "cpu/cpu_device.hpp"

namespace lockstep::cpu {
namespace {

constexpr int kGemmRowBlock = 64;  // fewest rows of C per call in a row-blocked GEMM
constexpr int kGemmBlocks = 8;     // a row-blocked GEMM has at most about this many blocks
constexpr std::uint64_t kGemmBlockedAbove = std::uint64_t{1} << 20;  // m * n * k
constexpr int kBatchChunk = 16;    // matrices per call of a batched GEMM

using detail::check_gemm_shape;

// C = beta C: a product with k = 0, which oneDNN would leave alone.
void scale_rows(float* c, int m, int n, int ldc, float beta) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float& x = c[static_cast<std::size_t>(i) * ldc + j];
      x = beta == 0.0f ? 0.0f : beta * x;
    }
}

}  // namespace

// C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, with A and B float or bf16 bits
// (std::uint16_t). Large products run one call per block of rows of C; the blocking depends on
// the shape only, not on the input type.
template <class T>
void CpuDevice::gemm_of(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const T* a,
                        int lda, const T* b, int ldb, float beta, float* c, int ldc) {
  constexpr bool bf16 = std::is_same_v<T, std::uint16_t>;
  const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
  check_gemm_shape(bf16 ? "gemm_bf16" : "gemm", ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) return scale_rows(c, m, n, ldc, beta);
  const GemmCall call{.bf16 = bf16, .at = at, .bt = bt, .m = m, .n = n, .k = k, .lda = lda,
                      .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta};
  // Each call packs all of op(B) again: blocks of at least kGemmRowBlock rows, and no more
  // than about kGemmBlocks of them (rows rounded up to a multiple of 16), keep that in check.
  const int rows = std::max(kGemmRowBlock, (m + 16 * kGemmBlocks - 1) / (16 * kGemmBlocks) * 16);
  const std::uint64_t work = std::uint64_t(m) * std::uint64_t(n) * std::uint64_t(k);
  if (work <= kGemmBlockedAbove || m <= rows) {
    matmul_.prepare(call);
    return matmul_.run(call, a, b, c);
  }
  const std::size_t blocks = blocks_of(m, rows);
  GemmCall full = call, last = call;
  full.m = rows;
  last.m = m - static_cast<int>(blocks - 1) * rows;
  matmul_.prepare(full);
  matmul_.prepare(last);
  for_blocks(blocks, [&](std::size_t blk) {
    // Row `row0` of op(A) starts at a + row0 * lda when A is (m, k), at a + row0 when (k, m).
    const std::size_t r0 = blk * static_cast<std::size_t>(rows);
    matmul_.run(blk + 1 < blocks ? full : last, a + (at ? r0 : r0 * lda), b, c + r0 * ldc);
  });
}

// Chunks of kBatchChunk matrices spread over the arena, one call each; a single matrix goes
// through gemm_of() and its row blocking. Either way the split depends on the shape only.
template <class T>
void CpuDevice::gemm_batched_of(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                                const T* a, int lda, std::int64_t stride_a, const T* b, int ldb,
                                std::int64_t stride_b, float beta, float* c, int ldc,
                                std::int64_t stride_c, int count) {
  constexpr bool bf16 = std::is_same_v<T, std::uint16_t>;
  const char* what = bf16 ? "gemm_batched_bf16" : "gemm_batched";
  if (count < 0) throw std::invalid_argument(fmt::format("{}: count {} < 0", what, count));
  if (count == 1) return gemm_of(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  check_gemm_shape(what, ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0 || count == 0) return;
  if (k == 0) {
    for (int i = 0; i < count; ++i) scale_rows(c + i * stride_c, m, n, ldc, beta);
    return;
  }
  GemmCall full{.bf16 = bf16, .at = ta == Transpose::yes, .bt = tb == Transpose::yes, .m = m, .n = n, .k = k,
                .lda = lda, .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta,
                .count = std::min(count, kBatchChunk), .stride_a = stride_a,
                .stride_b = stride_b, .stride_c = stride_c};
  const std::size_t chunks = blocks_of(count, kBatchChunk);
  GemmCall last = full;
  last.count = count - static_cast<int>(chunks - 1) * kBatchChunk;
  matmul_.prepare(full);
  matmul_.prepare(last);  // the same call when kBatchChunk divides count
  for_blocks(chunks, [&](std::size_t i) {
    const auto first = static_cast<std::int64_t>(i) * kBatchChunk;
    matmul_.run(i + 1 < chunks ? full : last, a + first * stride_a, b + first * stride_b,
                c + first * stride_c);
  });
}

void CpuDevice::gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a,
                     int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_of(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CpuDevice::gemm_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                          const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb,
                          float beta, float* c, int ldc) {
  gemm_of(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CpuDevice::gemm_batched(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                             const float* a, int lda, std::int64_t stride_a, const float* b,
                             int ldb, std::int64_t stride_b, float beta, float* c, int ldc,
                             std::int64_t stride_c, int count) {
  gemm_batched_of(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                  stride_c, count);
}

void CpuDevice::gemm_batched_bf16(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                                  const std::uint16_t* a, int lda, std::int64_t stride_a,
                                  const std::uint16_t* b, int ldb, std::int64_t stride_b,
                                  float beta, float* c, int ldc, std::int64_t stride_c,
                                  int count) {
  gemm_batched_of(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                  stride_c, count);
}

}  // namespace lockstep::cpu
