// Comparing computed arrays with their reference, element by element, so that a NaN fails
// (Note [Comparing element by element]). For the CPU's tests; the CUDA tests' gpu_vs_cpu.hpp
// holds the same checker.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace lockstep::test {

// Note [Comparing element by element]
// A summary such as max |got - want| drops a NaN: std::max(x, NaN) is x, and NaN < tol is false
// in one spelling and `!(NaN > tol)` true in the other. So each element is held to its own bound,
// written so that a NaN fails:
//   |got - want| <= rel |want| + abs m + whole M,
// m the largest finite |want| of the element's row (`row` elements; the whole array when 0), M
// that of the whole array. `whole` is for a row that is a difference of nearly equal terms, so
// that its values are noise of its terms' size, not of its own: a causal attention's dq at a
// sequence's first position (exactly 0: one key, probability 1), a cross-entropy's p - 1 for p
// within ulps of 1. It stays at fp32 ulps, so that a row left zero still fails (issue 30). An infinity must be met exactly; NaN in `want` fails
// unless the test says it is expected there (NaNs::where_want_has_them), and `got` must then
// have NaN there too. rel and abs come from the dtype:
//   fp32   4 ulps (2^-23 each) per term of the sums behind the value, each side adding in its
//          own order: fp32_sums(K); an element-wise op has K = 1.
//   bf16   one bf16 ulp (2^-7 of the value: both sides round, and may land on neighbours) on
//          top of the fp32 tolerance of the value rounded.
struct Tolerance {
  double rel = 0.0;
  double abs = 0.0;
  std::size_t row = 0;
  double whole = 0.0;
};
inline constexpr double kFp32Ulp = 0x1p-23, kBf16Ulp = 0x1p-7;
constexpr Tolerance fp32_sums(double terms, std::size_t row = 0) {
  return {4 * kFp32Ulp * terms, 4 * kFp32Ulp * terms, row};
}
constexpr Tolerance bf16_rounded(Tolerance fp32) {
  return {fp32.rel + kBf16Ulp, fp32.abs, fp32.row, fp32.whole};
}

// Whether NaN may appear in `want` (then `got` must have it there too): the CUDA tests' CPU
// output, where padding both sides leave alone holds NaN.
enum class NaNs { refused, where_want_has_them, where_cpu_has_them = where_want_has_them };

// The elements of `got` that fail against `want`, each with its bound.
struct Mismatch {
  std::size_t index;
  float got, want;
  double allowed;
};
inline std::vector<Mismatch> mismatches(const std::vector<float>& got,
                                        const std::vector<float>& want, const Tolerance& tol,
                                        NaNs nans = NaNs::refused) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  std::vector<Mismatch> bad;
  const std::size_t n = want.size(), row = tol.row == 0 ? std::max<std::size_t>(n, 1) : tol.row;
  if (got.size() != n) return {{n, kNaN, kNaN, 0.0}};
  double array_largest = 0.0;
  for (const float w : want)
    if (std::isfinite(w)) array_largest = std::max(array_largest, std::abs(double(w)));
  for (std::size_t r0 = 0; r0 < n; r0 += row) {
    const std::size_t r1 = std::min(n, r0 + row);
    double largest = 0.0;
    for (std::size_t i = r0; i < r1; ++i)
      if (std::isfinite(want[i])) largest = std::max(largest, std::abs(double(want[i])));
    for (std::size_t i = r0; i < r1; ++i) {
      const float g = got[i], w = want[i];
      if (std::isnan(w)) {
        if (nans == NaNs::refused || !std::isnan(g)) bad.push_back({i, g, w, 0.0});
        continue;
      }
      if (std::isinf(w)) {
        if (g != w) bad.push_back({i, g, w, 0.0});
        continue;
      }
      const double allowed =
          tol.rel * std::abs(double(w)) + tol.abs * largest + tol.whole * array_largest;
      if (!(std::abs(double(g) - double(w)) <= allowed)) bad.push_back({i, g, w, allowed});
    }
  }
  return bad;
}

// One CHECK for the whole array, naming how many elements fail and the first of them.
inline void check_close(const std::vector<float>& got, const std::vector<float>& want,
                        const Tolerance& tol, NaNs nans = NaNs::refused) {
  REQUIRE(got.size() == want.size());
  const std::vector<Mismatch> bad = mismatches(got, want, tol, nans);
  if (bad.empty()) return;
  const Mismatch& m = bad.front();
  FAIL_CHECK(bad.size() << " of " << got.size() << " elements differ; the first, " << m.index
                        << ": got " << m.got << ", want " << m.want << ", within " << m.allowed
                        << std::string(std::isnan(m.want)
                                                           ? " (NaN in the reference: never "
                                                             "written, or NaN where none is "
                                                             "expected)"
                                                           : ""));
}

// The larger of two errors, NaN when either is (std::max would keep the first, dropping a NaN
// that comes second): for a loop that keeps the worst error of many.
inline double worse(double a, double b) {
  if (std::isnan(a)) return a;
  return std::isnan(b) || b > a ? b : a;
}

// ||a - b|| / ||b|| over the entries that differ (an LM head's -inf padding equals itself): a
// bf16 result against its fp32 one, where element bounds do not fit (errors that grow through a
// layer's products); NaN when either has one.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return diff == 0.0 ? 0.0 : std::sqrt(diff / norm);
}

}  // namespace lockstep::test
