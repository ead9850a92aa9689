// Shared by the CPU and CUDA tests of gemm_bf16 and gemm_batched_bf16: random bf16 inputs for
// a product, its exact result in double precision, and the bound fp32 accumulation keeps to.
// Inputs in bf16 are exact in fp32 and so is each product of two (8 + 8 significant bits), so
// the only error allowed is that of summing in fp32: element (i, j) may be off by
//     |alpha| (k + 2) 2^-23 sum_p |a_ip b_pj|  +  2^-22 |beta c_ij|
// (k roundings of a running sum, then alpha's and beta's). Accumulating in bf16, or rounding C
// to bf16, misses it by far (2^-8 relative).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../random_data.hpp"
#include "common/bf16.hpp"
#include "lockstep/device.hpp"

namespace lockstep::test::bf16_gemm {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Random values in [-1, 1) rounded to bf16: the bits a kernel reads and the floats they are.
struct Bf16Values {
  std::vector<std::uint16_t> bits;
  std::vector<float> values;
};

inline Bf16Values random_bf16(std::size_t n, std::uint64_t seed) {
  Bf16Values x;
  for (float v : random_floats(n, seed)) {
    x.bits.push_back(detail::float_to_bf16(v));
    x.values.push_back(detail::bf16_to_float(x.bits.back()));
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
};

// The inputs of a case: A and B in bf16, C in fp32 with a marker (7) in the padding columns and
// in the gaps between matrices, which no product may touch.
struct Inputs {
  Bf16Values a, b;
  std::vector<float> c;
};

inline bool in_matrix(const Case& g, std::size_t i) {
  const std::size_t s = g.count == 1 ? g.c_size() : std::size_t(g.stride_c);
  const std::size_t matrix = i / s, r = i % s;
  return matrix < std::size_t(g.count) && r < std::size_t(g.m) * g.ldc &&
         r % std::size_t(g.ldc) < std::size_t(g.n);
}

inline Inputs inputs_of(const Case& g, std::uint64_t seed) {
  Inputs x{random_bf16(g.a_size(), seed), random_bf16(g.b_size(), seed + 1),
           random_floats(g.c_size(), seed + 2)};
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

inline Expected expected_of(const Case& g, const Inputs& x) {
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
inline void check_within(const std::vector<float>& got, const Expected& e) {
  REQUIRE(got.size() == e.c.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - e.c[i]) <= e.bound[i])) {
      FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << e.c[i] << " within "
                            << e.bound[i]);
      return;
    }
}

inline std::vector<float> run_device(Device& dev, const Case& g, const Inputs& x) {
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

inline bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace lockstep::test::bf16_gemm
