// The CPU device's bf16 matrix products (gemm_bf16, gemm_batched_bf16) against the exact product
// of the same bf16 values in double precision, on fresh random inputs, within the bound of fp32
// accumulation (bf16_gemm_reference.hpp). Also: oneDNN's bf16 kernel and OpenBLAS on the widened
// inputs (Note [CPU matrix products]) both keep to it, and devices of 1 and 2 threads give the
// same bits.
#include <doctest/doctest.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "bf16_gemm_reference.hpp"
#include "cpu/matmul.hpp"
#include "lockstep/device.hpp"

namespace {

using lockstep::Transpose;
using namespace lockstep::test::bf16_gemm;

// The case on devices of 1 and 2 threads: within the bound, and the same bits.
void check_case(const Case& g, std::uint64_t seed) {
  CAPTURE(int(g.ta));
  CAPTURE(int(g.tb));
  CAPTURE(g.m);
  CAPTURE(g.n);
  CAPTURE(g.k);
  CAPTURE(g.count);
  CAPTURE(g.beta);
  const Inputs x = inputs_of(g, seed);
  auto one = lockstep::make_cpu_device(0, 1), two = lockstep::make_cpu_device(1, 2);
  const auto got = run_device(*one, g, x);
  check_within(got, expected_of(g, x));
  CHECK(same_bits(got, run_device(*two, g, x)));
}

constexpr Transpose kBoth[] = {Transpose::no, Transpose::yes};

}  // namespace

TEST_SUITE("cpu device") {
  TEST_CASE("gemm_bf16: every transpose, odd shapes, padded leading dimensions, alpha and beta") {
    std::uint64_t seed = 200;
    for (Transpose ta : kBoth)
      for (Transpose tb : kBoth) {
        const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
        // Small products (OpenBLAS on widened inputs), 64 x 48 x 70 (one oneDNN call), and
        // 300 x 70 x 90 > 2^20 multiply-adds (row-blocked, a partial last block).
        for (auto [m, n, k] : {std::tuple{1, 1, 1}, {7, 5, 3}, {13, 17, 11}, {3, 1, 9},
                               {64, 48, 70}, {300, 70, 90}})
          for (float beta : {-0.5f, 0.0f}) {
            Case g{ta, tb, m, n, k, (at ? m : k) + 2, (bt ? k : n) + 3, n + 1};
            g.beta = beta;
            check_case(g, seed += 3);
          }
      }
  }

  TEST_CASE("gemm_batched_bf16: strided batches of 1, 3 and 37 matrices, every transpose") {
    // 37 matrices: chunks of 16, 16 and 5. Gaps between the matrices of A, B and C.
    std::uint64_t seed = 300;
    for (Transpose ta : kBoth)
      for (Transpose tb : kBoth)
        for (int count : {1, 3, 37}) {
          const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
          const int m = 19, n = 13, k = 21;
          const int lda = (at ? m : k) + 1, ldb = (bt ? k : n) + 2, ldc = n + 3;
          Case g{ta, tb, m, n, k, lda, ldb, ldc, count};
          g.stride_a = std::int64_t(at ? k : m) * lda + 5;
          g.stride_b = std::int64_t(bt ? n : k) * ldb + 7;
          g.stride_c = std::int64_t(m) * ldc + 11;
          g.batched = true;
          check_case(g, seed += 3);
        }
    // A single matrix of the batched call takes gemm_bf16's row blocking.
    Case big{Transpose::no, Transpose::yes, 300, 70, 90, 90, 90, 70, 1};
    big.batched = true;
    check_case(big, seed += 3);
  }

  TEST_CASE("gemm_bf16 and gemm_batched_bf16 with k = 0 give beta C and never read A or B") {
    for (bool batched : {false, true})
      for (float beta : {-0.5f, 0.0f}) {
        Case g{Transpose::no, Transpose::yes, 70, 9, 0, 1, 1, 10, batched ? 3 : 1};
        g.stride_c = batched ? 70 * 10 + 2 : 0;
        g.batched = batched;
        g.beta = beta;
        Inputs x = inputs_of(g, 400);
        x.a = {{0x7FC0}, {kNaN}};  // NaN: would poison C if read
        x.b = x.a;
        auto dev = lockstep::make_cpu_device(0, 2);
        check_within(run_device(*dev, g, x), expected_of(g, x));
      }
  }
}

TEST_CASE("matmul: oneDNN's bf16 product and OpenBLAS on widened inputs both sum in fp32") {
  using lockstep::cpu::GemmLibrary;
  using lockstep::cpu::Matmul;
  // Large enough that oneDNN computes (more than 2^17 multiply-adds, or a batch): the large
  // MLP's backward shapes scaled down, and a batch of 20 attention-like products.
  Case single{Transpose::yes, Transpose::no, 96, 80, 130, 97, 81, 82};
  Case batch{Transpose::no, Transpose::yes, 16, 16, 24, 0, 0, 17, 20};
  batch.lda = batch.ldb = 20 * 24;  // 20 heads of 24 columns side by side
  batch.stride_a = 24;
  batch.stride_b = 24;
  batch.stride_c = 16 * 17;
  std::uint64_t seed = 500;
  for (const Case& g : {single, batch}) {
    CAPTURE(g.count);
    const Inputs x = inputs_of(g, seed += 3);
    const Expected e = expected_of(g, x);
    const lockstep::cpu::GemmCall call{
        .bf16 = true, .at = g.at(), .bt = g.bt(), .m = g.m, .n = g.n, .k = g.k, .lda = g.lda,
        .ldb = g.ldb, .ldc = g.ldc, .alpha = g.alpha, .beta = g.beta, .count = g.count,
        .stride_a = g.stride_a, .stride_b = g.stride_b, .stride_c = g.stride_c};
    for (GemmLibrary library : {GemmLibrary::onednn, GemmLibrary::openblas}) {
      CAPTURE(int(library));
      std::vector<float> c = x.c;
      Matmul mm(library);
      mm.prepare(call);
      mm.run(call, x.a.bits.data(), x.b.bits.data(), c.data());
      check_within(c, e);
    }
  }
}
