// GEMM through OpenBLAS (the CUDA device calls cuBLAS from src/cuda/cuda_device.cpp).
#include "cpu/cpu_device.hpp"

#include <cblas.h>

#include "common/gemm_shape.hpp"

namespace lockstep::cpu {
namespace {

constexpr int kGemmRowBlock = 64;  // fewest rows of C per sgemm call in a row-blocked GEMM
constexpr int kGemmBlocks = 8;     // a row-blocked GEMM has at most about this many blocks
constexpr std::uint64_t kGemmBlockedAbove = std::uint64_t{1} << 20;  // m * n * k

using detail::check_gemm_shape;

}  // namespace

// C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C. Large products run one sgemm per
// block of rows of C; the blocking depends on the shape only.
void CpuDevice::gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a,
                     int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
  check_gemm_shape("gemm", ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  const auto sgemm = [&](int row0, int rows) {
    // Row `row0` of op(A) starts at a + row0 * lda when A is (m, k), at a + row0 when (k, m).
    const std::size_t r0 = static_cast<std::size_t>(row0);
    cblas_sgemm(CblasRowMajor, at ? CblasTrans : CblasNoTrans, bt ? CblasTrans : CblasNoTrans,
                rows, n, k, alpha, a + (at ? r0 : r0 * lda), lda, b, ldb, beta, c + r0 * ldc,
                ldc);
  };
  const std::uint64_t work = std::uint64_t(m) * std::uint64_t(n) * std::uint64_t(k);
  if (work <= kGemmBlockedAbove) return sgemm(0, m);
  // Each call packs all of op(B) again: blocks of at least kGemmRowBlock rows, and no more
  // than about kGemmBlocks of them (rows rounded up to a multiple of 16), keep that in check.
  const int rows = std::max(kGemmRowBlock, (m + 16 * kGemmBlocks - 1) / (16 * kGemmBlocks) * 16);
  for_blocks(blocks_of(m, rows), [&](std::size_t blk) {
    const int row0 = static_cast<int>(blk) * rows;
    sgemm(row0, std::min(rows, m - row0));
  });
}

// One unblocked sgemm per matrix, the matrices spread over the arena; a single matrix goes
// through gemm() and its row blocking. Either way the split depends on the shape only.
void CpuDevice::gemm_batched(Transpose ta, Transpose tb, int m, int n, int k, float alpha,
                             const float* a, int lda, std::int64_t stride_a, const float* b,
                             int ldb, std::int64_t stride_b, float beta, float* c, int ldc,
                             std::int64_t stride_c, int count) {
  if (count < 0) throw std::invalid_argument(fmt::format("gemm_batched: count {} < 0", count));
  if (count == 1) return gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
  check_gemm_shape("gemm_batched", ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  for_blocks(static_cast<std::size_t>(count), [&](std::size_t i) {
    const auto s = static_cast<std::int64_t>(i);
    cblas_sgemm(CblasRowMajor, at ? CblasTrans : CblasNoTrans, bt ? CblasTrans : CblasNoTrans,
                m, n, k, alpha, a + s * stride_a, lda, b + s * stride_b, ldb, beta,
                c + s * stride_c, ldc);
  });
}

}  // namespace lockstep::cpu
