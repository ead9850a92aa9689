// The CUDA tests' comparison with the CPU (gpu_vs_cpu.hpp, Note [Comparing with the CPU]) fed
// the CPU device's own outputs, as the GPU tests' seeds and shapes make them, and broken copies
// of them: what a kernel that skips rows, writes nothing or computes a little wrong would give.
// It runs on every machine, so a comparison that accepts garbage fails in CI, GPU or not.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <tuple>
#include <vector>

#include "gpu_vs_cpu.hpp"

using namespace lockstep;
using namespace lockstep::test;

namespace {

// The rows (of `row` elements) that hold a mismatch.
std::set<std::size_t> rows_failing(const std::vector<float>& got, const std::vector<float>& want,
                                   const Tolerance& tol) {
  std::set<std::size_t> rows;
  for (const Mismatch& m : mismatches(got, want, tol)) rows.insert(m.index / tol.row);
  return rows;
}

// `v` with the odd rows of `row` elements set to `value`; the rows changed.
std::set<std::size_t> set_odd_rows(std::vector<float>& v, std::size_t row, float value) {
  std::set<std::size_t> rows;
  for (std::size_t r = 1; r * row < v.size(); r += 2) {
    std::fill_n(v.begin() + static_cast<std::ptrdiff_t>(r * row), row, value);
    rows.insert(r);
  }
  return rows;
}

// The bf16 neighbour of x away from zero (x itself when 0, infinite or NaN).
float next_bf16(float x) {
  if (x == 0.0f || !std::isfinite(x)) return x;
  return detail::bf16_to_float(static_cast<std::uint16_t>(detail::float_to_bf16(x) + 1));
}

}  // namespace

// test_cuda_bf16.cpp's causal softmax: count 2, T 1024, its seeds.
TEST_CASE("gpu_vs_cpu: the bf16 causal softmax check fails rows left zero or unwritten") {
  const int count = 2, T = 1024;
  const std::size_t n = std::size_t(count) * T * T, nt = std::size_t(T);
  const auto s = random_floats(n, 720 + n, -8.0, 8.0), dp = random_floats(n, 721 + n);
  auto cpu = make_cpu_device(0, 1);
  auto sd = on_device(*cpu, s), dpd = on_device(*cpu, dp);
  auto pd = poisoned_bf16(*cpu, n), dsd = poisoned_bf16(*cpu, n);
  cpu->causal_softmax_forward(sd.data(), pd.data(), count, T, 0.125f);
  cpu->causal_softmax_backward(pd.data(), dpd.data(), dsd.data(), count, T, 0.125f);
  const std::vector<float> p = widened(pd.download()), ds = widened(dsd.download());
  const SoftmaxTolerance tol = softmax_tolerance(T, /*bf16=*/true);

  // What each side's rounding may give passes: every value one bf16 ulp away.
  std::vector<float> p_next(p), ds_next(ds);
  for (float& x : p_next) x = next_bf16(x);
  for (float& x : ds_next) x = next_bf16(x);
  CHECK(mismatches(p_next, p, tol.p).empty());
  CHECK(mismatches(ds_next, ds, tol.ds).empty());

  // Half the rows left as a zero-filled buffer had them, or as the poisoned one has them: every
  // such row fails, p and ds alike. Most of those rows hold no probability above 1/128 of the
  // largest, 1, which a bound scaled by the array's largest value let pass (issue 30).
  std::size_t faint_rows = 0;
  for (std::size_t r = 1; r < n / nt; r += 2)
    if (*std::max_element(p.begin() + std::ptrdiff_t(r * nt),
                          p.begin() + std::ptrdiff_t((r + 1) * nt)) < 1.0f / 128)
      ++faint_rows;
  CHECK(faint_rows > 500);
  for (const float left : {0.0f, kNaN}) {
    CAPTURE(left);
    std::vector<float> p_skipped(p), ds_skipped(ds);
    const std::set<std::size_t> skipped = set_odd_rows(p_skipped, nt, left);
    set_odd_rows(ds_skipped, nt, left);
    const std::set<std::size_t> p_rows = rows_failing(p_skipped, p, tol.p);
    const std::set<std::size_t> ds_rows = rows_failing(ds_skipped, ds, tol.ds);
    CHECK_MESSAGE(p_rows == skipped, "p: " << p_rows.size() << " of " << skipped.size()
                                           << " skipped rows fail");
    CHECK_MESSAGE(ds_rows == skipped, "ds: " << ds_rows.size() << " of " << skipped.size()
                                             << " skipped rows fail");
  }
}

// test_cuda_transformer.cpp's causal softmax: count 2, T 1024, its seeds (400, 3 apart).
TEST_CASE("gpu_vs_cpu: the fp32 causal softmax check fails probabilities 0.9% off") {
  const int count = 2, T = 1024;
  const std::size_t n = std::size_t(count) * T * T;
  const auto s = random_floats(n, 433, -8.0, 8.0);
  auto cpu = make_cpu_device(0, 1);
  auto sd = on_device(*cpu, s), pd = poisoned(*cpu, n);
  cpu->causal_softmax_forward(sd.data(), pd.data(), count, T, 0.125f);
  const std::vector<float> p = pd.download();
  const Tolerance tol = softmax_tolerance(T, /*bf16=*/false).p;
  REQUIRE(mismatches(p, p, tol).empty());
  // Summation in another order: a few ulps per term at most, passes.
  std::vector<float> near(p), off(p);
  for (float& x : near) x *= 1.0f + 64 * float(kFp32Ulp);
  CHECK(mismatches(near, p, tol).empty());
  // 0.9% off, which the bound of 1e-5 of the largest value (p = 1) let through: every nonzero
  // probability fails.
  for (float& x : off) x *= 1.009f;
  std::size_t nonzero = 0;
  for (float x : p) nonzero += x != 0.0f ? 1 : 0;
  CHECK(mismatches(off, p, tol).size() == nonzero);
}

TEST_CASE("gpu_vs_cpu: NaN passes only where the CPU has it and the test expects it") {
  const Tolerance tol = fp32_sums(1);
  const float inf = std::numeric_limits<float>::infinity();
  // NaN in the CPU's output: an element the reference never wrote, refused by default.
  CHECK(mismatches({1.0f, kNaN}, {1.0f, kNaN}, tol).size() == 1);
  CHECK(mismatches({1.0f, kNaN}, {1.0f, kNaN}, tol, NaNs::where_cpu_has_them).empty());
  // Expected NaN must be NaN on the GPU too; NaN elsewhere always fails.
  CHECK(mismatches({1.0f, 2.0f}, {1.0f, kNaN}, tol, NaNs::where_cpu_has_them).size() == 1);
  CHECK(mismatches({kNaN, 2.0f}, {1.0f, 2.0f}, tol, NaNs::where_cpu_has_them).size() == 1);
  // An infinity is met exactly; the floor scales with the row's largest value, not the array's.
  CHECK(mismatches({-inf, 1.0f}, {-inf, 1.0f}, tol).empty());
  CHECK(mismatches({inf, 1.0f}, {-inf, 1.0f}, tol).size() == 1);
  CHECK(mismatches({1000.0f, 0.0f}, {1000.0f, 1e-4f}, tol).empty());  // one row: the output
  CHECK(mismatches({1000.0f, 0.0f}, {1000.0f, 1e-4f}, fp32_sums(1, 1)).size() == 1);
  // Different lengths fail.
  CHECK(mismatches({1.0f}, {1.0f, 2.0f}, tol).size() == 1);
}

// test_cudnn_attention.cpp's bounds for dq and dk (attention_tolerance), on the CPU's own bf16
// attention over packed windows: window 0 one sequence, window 1 cut at 10 and 11, so position
// 10 is a sequence of one. What the H200 gave where the value is 0 and each side holds fp32
// noise of about 1e-7 (2026-12-04, bench/GPU.md): dq at each sequence's first position, dk at
// the sequence of one. It passes only with the whole array's term; rows left zero still fail.
TEST_CASE("gpu_vs_cpu: attention's dq and dk checks pass noise where the value is 0, fail rows "
          "of zeros") {
  AttentionShape s{2, 64, 4, 64, 2};
  const std::size_t n = std::size_t(s.batch) * s.T, c = std::size_t(s.heads) * s.head_size;
  const std::size_t width = std::size_t(qkv_width(s)), ckv = std::size_t(kv_heads_of(s)) * 64;
  std::vector<std::int32_t> positions(n);
  for (std::size_t t = 0; t < std::size_t(s.T); ++t) {
    positions[t] = std::int32_t(t);
    positions[std::size_t(s.T) + t] = std::int32_t(t < 10 ? t : t == 10 ? 0 : t - 11);
  }
  auto cpu = make_cpu_device(0, 1);
  auto pos = on_device(*cpu, positions);
  s.positions = pos.data();
  auto qkv = on_device(*cpu, to_bits(random_floats(n * width, 564, -2.0, 2.0)));
  auto dy = on_device(*cpu, to_bits(random_floats(n * c, 664)));
  auto y = poisoned_bf16(*cpu, n * c);
  auto lse = poisoned(*cpu, std::size_t(s.batch) * s.heads * s.T);
  auto dqkv = poisoned(*cpu, n * width);
  cpu->attention_forward(s, {nullptr, qkv.data()}, {nullptr, y.data()}, lse.data());
  cpu->attention_backward(s, {nullptr, qkv.data()}, {nullptr, y.data()}, {nullptr, dy.data()},
                          lse.data(), dqkv.data());
  const std::vector<float> all = dqkv.download();
  std::vector<float> dq, dk;
  for (std::size_t r = 0; r < n; ++r) {
    const auto row = all.begin() + std::ptrdiff_t(r * width);
    dq.insert(dq.end(), row, row + std::ptrdiff_t(c));
    dk.insert(dk.end(), row + std::ptrdiff_t(c), row + std::ptrdiff_t(c + ckv));
  }
  const AttentionTolerance tol = attention_tolerance(s);
  const std::size_t one = std::size_t(s.T) + 10;  // the sequence of one position
  const std::set<std::size_t> dq_zero{0, std::size_t(s.T), one, one + 1}, dk_zero{one};
  for (auto [got, tight, loose, width_of, zero] :
       {std::tuple{&dq, tol.y, tol.dq, c, dq_zero}, std::tuple{&dk, tol.kv, tol.kv, ckv, dk_zero}}) {
    const std::vector<float>& want = *got;
    REQUIRE(mismatches(want, want, loose).empty());
    std::vector<float> noisy(want);
    for (const std::size_t r : zero)
      for (std::size_t i = 0; i < width_of; ++i) {
        CHECK(std::abs(want[r * width_of + i]) < 1e-6f);
        noisy[r * width_of + i] = (i % 2 ? 1.0f : -1.0f) * 1.1e-7f;
      }
    CHECK(mismatches(noisy, want, loose).empty());
    tight.whole = 0.0;  // the row's own bound alone refuses it
    CHECK(rows_failing(noisy, want, tight) == zero);
    // Odd positions left zero: each fails but those that are 0.
    std::vector<float> zeros(want);
    std::set<std::size_t> skipped = set_odd_rows(zeros, width_of, 0.0f);
    for (const std::size_t r : zero) skipped.erase(r);
    CHECK(rows_failing(zeros, want, loose) == skipped);
  }
}

// The GPU GPT-step comparisons (test_cudnn_attention.cpp, test_cuda_linear.cpp) check each
// parameter tensor's gradient on its own. What one bound of 4 bf16 ulps of the model's largest
// gradient, a std::max of the differences, let through (issue 40): a NaN (std::max drops it),
// and zeros in a tensor of gradients far below the model's largest (dq and dk never written).
TEST_CASE("gpu_vs_cpu: each gradient tensor on its own, where NaN and a tensor of zeros fail") {
  const Model model = Model::gpt({.vocab_size = 64, .context = 8, .n_layer = 1, .n_head = 2,
                                  .d_model = 16});
  std::vector<float> want(model.param_count());
  std::uint64_t seed = 11;
  for (float& w : want) w = static_cast<float>(1e-3 * (2.0 * detail::uniform01(seed) - 1.0));
  want[0] = 1.0f;  // the model's largest, in wte
  const Tolerance tol{4 * kBf16Ulp, 4 * kBf16Ulp, 0};
  CHECK(tensor_mismatches(model, want, want, tol).empty());
  const auto find = [&](const std::string& suffix) {
    for (const ParamTensor& t : model.param_tensors())
      if (t.name.ends_with(suffix)) return t;
    FAIL("no tensor named *" << suffix);
    return ParamTensor{};
  };
  const ParamTensor attn = find("attn.c_attn.weight");
  // The old bound: every difference within 4 bf16 ulps of the largest gradient, 1.0.
  const auto old_bound_passes = [&](const std::vector<float>& got) {
    double err = 0.0, largest = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, std::abs(double(got[i]) - want[i]));
      largest = std::max(largest, std::abs(double(want[i])));
    }
    return err <= 4 * kBf16Ulp * largest;
  };
  // dq and dk not written: c_attn's weight gradient zero where q and k come from.
  std::vector<float> zeros = want;
  std::fill_n(zeros.begin() + static_cast<std::ptrdiff_t>(attn.offset), attn.numel() * 2 / 3,
              0.0f);
  CHECK(old_bound_passes(zeros));
  const std::vector<TensorMismatch> bad = tensor_mismatches(model, zeros, want, tol);
  REQUIRE(bad.size() == 1);
  CHECK(bad.front().tensor == attn.name);
  // A NaN anywhere.
  std::vector<float> nan = want;
  nan[attn.offset + 5] = kNaN;
  CHECK(old_bound_passes(nan));
  REQUIRE(tensor_mismatches(model, nan, want, tol).size() == 1);
  CHECK(tensor_mismatches(model, nan, want, tol).front().count == 1);
}

// Note [CUDA toolkit, backend not built]: a build without the CUDA backend skips its CUDA cases
// as "gpu" (accepted) only where the machine has no CUDA toolkit; beside nvcc, as "unbuilt",
// which scripts/test.sh refuses.
TEST_CASE("gpu_vs_cpu: no CUDA backend skips as gpu without the toolkit, unbuilt beside it") {
  CHECK(without_cuda_backend("").kind == Skip::gpu);
  const SkipReason beside = without_cuda_backend("/opt/cuda/bin/nvcc");
  CHECK(beside.kind == Skip::unbuilt);
  CHECK(beside.why.find("/opt/cuda/bin/nvcc") != std::string::npos);
  CHECK(skip_kind_name(Skip::unbuilt) == "unbuilt");
  // This build: the CUDA backend is built wherever the configure found the toolkit.
  if (!std::string_view(LOCKSTEP_TEST_CUDA_TOOLKIT).empty()) CHECK_FALSE(cuda_support().built);
}
