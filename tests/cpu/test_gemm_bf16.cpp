// The CPU device's bf16 matrix products (gemm_bf16, gemm_batched_bf16) against the exact product
// of the same bf16 values in double precision, on fresh random inputs. Inputs in bf16 are exact
// in fp32 and so is each product of two (8 + 8 significant bits), so the only error allowed is
// that of summing in fp32: element (i, j) may be off by
//     |alpha| (k + 2) 2^-23 sum_p |a_ip b_pj|  +  2^-22 |beta c_ij|
// (k roundings of a running sum, then alpha's and beta's). Accumulating in bf16, or rounding C
// to bf16, misses it by far (2^-8 relative). Also: oneDNN's bf16 kernel and OpenBLAS on the
// widened inputs (Note [CPU matrix products]) both keep to it, and devices of 1 and 2 threads
// give the same bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "../random_data.hpp"
#include "common/bf16.hpp"
#include "cpu/matmul.hpp"
#include "lockstep/device.hpp"

namespace {

using lockstep::Device;
using lockstep::Transpose;
using lockstep::cpu::GemmCall;
using lockstep::test::on_device;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Random values in [-1, 1) rounded to bf16: the bits a kernel reads and the floats they are.
struct Bf16Values {
  std::vector<std::uint16_t> bits;
  std::vector<float> values;
};

Bf16Values random_bf16(std::size_t n, std::uint64_t seed) {
  Bf16Values x;
  for (float v : lockstep::test::random_floats(n, seed)) {
    x.bits.push_back(lockstep::detail::float_to_bf16(v));
    x.values.push_back(lockstep::detail::bf16_to_float(x.bits.back()));
  }
  return x;
}

// `count` products C (m, n) = alpha op(A) (m, k) op(B) (k, n) + beta C, `stride_*` apart.
// batched: through gemm_batched_bf16 (count 1 too), else gemm_bf16.
struct Case {
  Transpose ta, tb;
  int m, n, k, lda, ldb, ldc;
  int count = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  bool batched = false;
  float alpha = 0.75f, beta = -0.5f;

  bool at() const { return ta == Transpose::yes; }
  bool bt() const { return tb == Transpose::yes; }
  // Elements each buffer spans: the last matrix's rows plus the strides before it.
  std::size_t a_size() const { return span(stride_a, at() ? k : m, lda); }
  std::size_t b_size() const { return span(stride_b, bt() ? n : k, ldb); }
  std::size_t c_size() const { return span(stride_c, m, ldc); }
  std::size_t span(std::int64_t stride, int rows, int ld) const {
    return std::size_t(count - 1) * std::size_t(stride) + std::size_t(rows) * std::size_t(ld);
  }
  GemmCall call() const {
    return {.bf16 = true, .at = at(), .bt = bt(), .m = m, .n = n, .k = k, .lda = lda,
            .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta, .count = count,
            .stride_a = stride_a, .stride_b = stride_b, .stride_c = stride_c};
  }
};

// The inputs of a case: A and B in bf16, C in fp32 with a marker (7) in the padding columns and
// in the gaps between matrices, which no product may touch.
struct Inputs {
  Bf16Values a, b;
  std::vector<float> c;
};

bool in_matrix(const Case& g, std::size_t i) {
  const std::size_t s = g.count == 1 ? g.c_size() : std::size_t(g.stride_c);
  const std::size_t matrix = i / s, r = i % s;
  return matrix < std::size_t(g.count) && r < std::size_t(g.m) * g.ldc &&
         r % std::size_t(g.ldc) < std::size_t(g.n);
}

Inputs inputs_of(const Case& g, std::uint64_t seed) {
  Inputs x{random_bf16(g.a_size(), seed), random_bf16(g.b_size(), seed + 1),
           lockstep::test::random_floats(g.c_size(), seed + 2)};
  for (std::size_t i = 0; i < x.c.size(); ++i)
    if (!in_matrix(g, i)) x.c[i] = 7.0f;
    else if (g.beta == 0.0f) x.c[i] = kNaN;  // beta = 0 must not read C
  return x;
}

// The exact result of each element of C, and how far from it fp32 accumulation may land (0
// outside the matrices: unchanged).
struct Expected {
  std::vector<double> c, bound;
};

Expected expected_of(const Case& g, const Inputs& x) {
  Expected e{std::vector<double>(x.c.begin(), x.c.end()), std::vector<double>(x.c.size(), 0.0)};
  const auto& a = x.a.values;
  const auto& b = x.b.values;
  for (int q = 0; q < g.count; ++q) {
    const std::size_t oa = std::size_t(q) * g.stride_a, ob = std::size_t(q) * g.stride_b;
    for (int i = 0; i < g.m; ++i)
      for (int j = 0; j < g.n; ++j) {
        double sum = 0.0, magnitude = 0.0;
        for (int p = 0; p < g.k; ++p) {
          const double ab = double(a[oa + (g.at() ? std::size_t(p) * g.lda + i
                                                  : std::size_t(i) * g.lda + p)]) *
                            double(b[ob + (g.bt() ? std::size_t(j) * g.ldb + p
                                                  : std::size_t(p) * g.ldb + j)]);
          sum += ab;
          magnitude += std::abs(ab);
        }
        const std::size_t ci = std::size_t(q) * g.stride_c + std::size_t(i) * g.ldc + j;
        const double old = g.beta == 0.0f ? 0.0 : double(g.beta) * x.c[ci];
        e.c[ci] = double(g.alpha) * sum + old;
        e.bound[ci] = std::abs(double(g.alpha)) * (g.k + 2) * std::ldexp(magnitude, -23) +
                      std::ldexp(std::abs(old), -22) + 1e-30;
      }
  }
  return e;
}

// Every element within its bound; reports the first miss only.
void check_within(const std::vector<float>& got, const Expected& e) {
  REQUIRE(got.size() == e.c.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - e.c[i]) <= e.bound[i])) {
      FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << e.c[i] << " within "
                            << e.bound[i]);
      return;
    }
}

std::vector<float> run_device(Device& dev, const Case& g, const Inputs& x) {
  auto a = on_device(dev, x.a.bits), b = on_device(dev, x.b.bits);
  auto c = on_device(dev, x.c);
  if (g.batched)
    dev.gemm_batched_bf16(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), g.lda, g.stride_a,
                          b.data(), g.ldb, g.stride_b, g.beta, c.data(), g.ldc, g.stride_c,
                          g.count);
  else
    dev.gemm_bf16(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), g.lda, b.data(), g.ldb, g.beta,
                  c.data(), g.ldc);
  return c.download();
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

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
    const GemmCall call = g.call();
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
