// The CPU's tiled attention (Device::attention_forward/backward, Note [Tiled attention] in
// src/cpu/ops/attention.cpp) against the materialised attention a GPT block runs otherwise
// (model/attention.hpp): the output and the gradients of q, k and v, element by element (Note
// [Comparing element by element] in tests/compare.hpp), in fp32 (only the order of summation
// differs) and in bf16 (the paths round at different points). In bf16 also against a plain
// reference that rounds where the note says, within fp32's tolerance: skipping any one of the
// three roundings fails it. Grouped-query attention (AttentionShape::kv_heads: 1, 2 and H kv
// heads) in each of these, in a finite-difference check of the tiled backward, and in a closed
// form (one kv head read by equal query heads).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "common/bf16.hpp"
#include "common/elementwise_math.hpp"
#include "lockstep/device.hpp"
#include "model/attention.hpp"
#include "../compare.hpp"
#include "../model/gradcheck.hpp"
#include "../random_data.hpp"
#include "sanitized.hpp"

namespace {

using lockstep::AttentionKind;
using lockstep::AttentionShape;
using lockstep::Device;
using lockstep::DeviceArray;
using lockstep::MatIn;
using lockstep::MatOut;
using lockstep::test::check_close;
using lockstep::test::on_device;
using lockstep::test::random_floats;
using lockstep::test::Tolerance;

// What both paths produce: y widened to fp32, and the gradients of q, k, v.
struct Attention {
  std::vector<float> y, dqkv;
};

// The operands, on the device: qkv (B T, (H + 2 Hkv) D) and dy (B T, H D) in fp32 or bf16
// (rounded from the same draws), as the block's products read them.
struct Inputs {
  DeviceArray<float> qkv32, dy32;
  DeviceArray<std::uint16_t> qkv16, dy16;
  MatIn qkv() const { return qkv16.size() ? MatIn{nullptr, qkv16.data()} : MatIn{qkv32.data()}; }
  MatIn dy() const { return dy16.size() ? MatIn{nullptr, dy16.data()} : MatIn{dy32.data()}; }
};

// The elements of qkv (and dqkv): B T (H + 2 Hkv) D.
std::size_t qkv_size(AttentionShape s) {
  return std::size_t(s.batch) * s.T * std::size_t(lockstep::qkv_width(s));
}

Inputs make_inputs(Device& dev, AttentionShape s, bool bf16, std::uint64_t seed) {
  const std::size_t n = std::size_t(s.batch) * s.T, c = std::size_t(s.heads) * s.head_size;
  const std::size_t w = qkv_size(s);
  // Scores of a few units, so that the rows' maxima move from tile to tile.
  Inputs in{on_device(dev, random_floats(w, seed, -2.0, 2.0)),
            on_device(dev, random_floats(n * c, seed + 1)), {}, {}};
  if (bf16) {
    in.qkv16 = DeviceArray<std::uint16_t>(dev, w);
    in.dy16 = DeviceArray<std::uint16_t>(dev, n * c);
    dev.to_bf16(in.qkv32.data(), in.qkv16.data(), w);
    dev.to_bf16(in.dy32.data(), in.dy16.data(), n * c);
  }
  return in;
}

// y on the host, widened from bf16 when stored so.
std::vector<float> widened(Device& dev, MatOut m, std::size_t n) {
  std::vector<float> out(n);
  if (!m.bf16) {
    dev.copy_to_host(out.data(), m.f32, n * sizeof(float));
    return out;
  }
  std::vector<std::uint16_t> bits(n);
  dev.copy_to_host(bits.data(), m.bf16, n * sizeof(std::uint16_t));
  for (std::size_t i = 0; i < n; ++i) out[i] = lockstep::detail::bf16_to_float(bits[i]);
  return out;
}

// Forward, then backward, along `path` (model/attention.hpp: the block's own code).
Attention run_path(Device& dev, AttentionShape s, const Inputs& in, AttentionKind path) {
  const std::size_t n = std::size_t(s.batch) * s.T, c = std::size_t(s.heads) * s.head_size;
  const std::size_t rows = std::size_t(s.batch) * s.heads * s.T;
  const std::size_t squares = path == AttentionKind::fused ? 0 : rows * s.T;
  const bool bf16 = in.qkv16.size() > 0;
  DeviceArray<float> y32(dev, bf16 ? 0 : n * c), lse(dev, rows), sq(dev, squares);
  DeviceArray<float> p32(dev, bf16 ? 0 : squares), y_product(dev, bf16 ? n * c : 0);
  DeviceArray<std::uint16_t> y16(dev, bf16 ? n * c : 0), p16(dev, bf16 ? squares : 0);
  DeviceArray<std::uint16_t> sq16(dev, bf16 ? squares : 0);
  auto dqkv = on_device(dev, random_floats(qkv_size(s), 99));  // overwritten
  const lockstep::detail::AttentionBuffers buf{.path = path, .lse = lse.data(),
                                               .probs = {p32.data(), p16.data()},
                                               .squares = sq.data(), .squares16 = sq16.data(),
                                               .y_product = y_product.data()};
  const MatOut y{y32.data(), y16.data()};
  lockstep::detail::attention_forward(dev, s, in.qkv(), y, buf);
  lockstep::detail::attention_backward(dev, s, in.qkv(), y.input(), in.dy(), buf, dqkv.data());
  return {widened(dev, y, n * c), dqkv.download()};
}

Attention tiled(Device& dev, AttentionShape s, const Inputs& in) {
  return run_path(dev, s, in, AttentionKind::fused);
}

// The gradient of q, k or v (which = 0, 1, 2) out of dqkv (B T, (H + 2 Hkv) D), row by row.
std::vector<float> part(const std::vector<float>& dqkv, int which, AttentionShape s) {
  const std::size_t width = std::size_t(lockstep::qkv_width(s)), d = std::size_t(s.head_size);
  const std::size_t q = s.heads * d, kv = std::size_t(lockstep::kv_heads_of(s)) * d;
  const std::size_t begin = which == 0 ? 0 : q + (which - 1) * kv;
  const std::size_t end = which == 0 ? q : begin + kv;
  std::vector<float> out;
  for (std::size_t row = 0; row < dqkv.size() / width; ++row)
    out.insert(out.end(), dqkv.begin() + row * width + begin, dqkv.begin() + row * width + end);
  return out;
}

std::string describe(AttentionShape s, bool bf16) {
  return fmt::format("{} B={} T={} H={} Hkv={} D={}", bf16 ? "bf16" : "fp32", s.batch, s.T,
                     s.heads, lockstep::kv_heads_of(s), s.head_size);
}

// What the tiled path may differ by from the materialised one, element by element within a
// row of C (one position, every head).
Tolerance path_tolerance(AttentionShape s, bool bf16) {
  const Tolerance sums = lockstep::test::fp32_sums(s.T + s.head_size,
                                                   std::size_t(s.heads) * s.head_size);
  if (!bf16) return sums;
  // The probabilities rounded at different points (after normalising, or before), and the
  // score gradients computed from them and rounded again: a few bf16 roundings of the row's
  // largest terms.
  return {sums.rel + 4 * lockstep::test::kBf16Ulp, sums.abs + 4 * lockstep::test::kBf16Ulp,
          sums.row};
}

void check_case(AttentionShape s, bool bf16) {
  const Tolerance tol = path_tolerance(s, bf16);
  auto dev = lockstep::make_cpu_device(0, 2);
  const Inputs in = make_inputs(*dev, s, bf16, 1000 + s.T * 7 + s.heads * 3 + s.head_size);
  const Attention got = tiled(*dev, s, in),
                  want = run_path(*dev, s, in, AttentionKind::materialized);
  INFO(describe(s, bf16));
  check_close(got.y, want.y, tol);
  // A position's gradients of q, k and v together: its dq is 0 (position 0's, for one) where
  // its dk or dv are not, and the floor scales with them.
  check_close(got.dqkv, want.dqkv, {tol.rel, tol.abs, 3 * tol.row});
}

// T = 1, 7, 64, 65, 257 at heads 1 and 12 and head sizes 16, 64, 128; T = 1024 at a few, to
// keep the suite quick (the larger products are the same tiles, more of them).
// Under a sanitizer (ten to a hundred times slower: the T = 1024 cases ran for minutes under
// TSan) only T up to 65, where every kind of tile (partial, whole, on the diagonal) still occurs.
std::vector<AttentionShape> cases(bool bf16) {
  std::vector<AttentionShape> out;
  for (int T : {1, 7, 64, 65, 257}) {
    if (lockstep::test::kSanitized && T > 65) continue;
    for (int heads : {1, 12})
      for (int d : {16, 64, 128}) out.push_back({T < 64 ? 3 : 2, T, heads, d});
  }
  if (lockstep::test::kSanitized) return out;
  out.push_back({1, 1024, 1, 128});
  out.push_back({1, 1024, 12, 16});
  if (!bf16) out.push_back({1, 1024, 12, 64});
  return out;
}

// Grouped-query attention: 6 query heads on 1 (multi-query), 2 and 3 kv heads (6, multi-head,
// is in cases()), at one partial tile, one whole and three; batch 1 and 3, so that the
// materialised path batches its products both ways (per query head over the sequences, per
// sequence over the kv heads) and sums dK and dV over the group in each.
std::vector<AttentionShape> grouped_cases() {
  std::vector<AttentionShape> out;
  for (int T : {7, 64, 130}) {
    if (lockstep::test::kSanitized && T > 65) continue;
    for (int kv_heads : {1, 2, 3})
      for (int batch : {1, 3}) out.push_back({batch, T, 6, 16, kv_heads});
  }
  out.push_back({2, 65, 4, 64, 2});
  return out;
}

}  // namespace

TEST_CASE("tiled attention matches the materialised attention in fp32") {
  for (const AttentionShape& s : cases(false)) check_case(s, false);
}

TEST_CASE("tiled attention matches the materialised attention in bf16") {
  for (const AttentionShape& s : cases(true)) check_case(s, true);
}

TEST_CASE("grouped-query attention: tiled matches materialised in fp32 and bf16") {
  for (const bool bf16 : {false, true})
    for (const AttentionShape& s : grouped_cases()) check_case(s, bf16);
}

// Multi-query attention whose query heads are all equal (and so their dy): every head's y and
// dq is the one head's of plain attention over the same q, k, v, bit for bit (the same products
// on the same values), and dk, dv are H times its (a sum of H equal terms; within a rounding of
// each addition).
TEST_CASE("multi-query attention with equal query heads: every head is the one-head attention") {
  const int H = 4, T = 70, D = 16;
  for (const AttentionKind path : {AttentionKind::fused, AttentionKind::materialized}) {
    INFO((path == AttentionKind::fused ? "tiled" : "materialised"));
    const AttentionShape one{2, T, 1, D}, mqa{2, T, H, D, 1};
    auto dev = lockstep::make_cpu_device(0, 2);
    const std::size_t n = std::size_t(one.batch) * T;
    const std::vector<float> qkv1 = random_floats(n * 3 * D, 41, -2.0, 2.0);
    const std::vector<float> dy1 = random_floats(n * D, 42);
    // The one head's q repeated H times, then its k and v: (B T, (H + 2) D); dy likewise.
    std::vector<float> qkv, dy;
    for (std::size_t r = 0; r < n; ++r) {
      for (int h = 0; h < H; ++h) {
        qkv.insert(qkv.end(), qkv1.begin() + r * 3 * D, qkv1.begin() + r * 3 * D + D);
        dy.insert(dy.end(), dy1.begin() + r * D, dy1.begin() + (r + 1) * D);
      }
      qkv.insert(qkv.end(), qkv1.begin() + r * 3 * D + D, qkv1.begin() + (r + 1) * 3 * D);
    }
    const auto run = [&](AttentionShape s, const std::vector<float>& x,
                         const std::vector<float>& g) {
      Inputs in{on_device(*dev, x), on_device(*dev, g), {}, {}};
      return run_path(*dev, s, in, path);
    };
    const Attention want = run(one, qkv1, dy1), got = run(mqa, qkv, dy);
    const std::vector<float> dq1 = part(want.dqkv, 0, one), dq = part(got.dqkv, 0, mqa);
    for (std::size_t r = 0; r < n; ++r)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) {
          const std::size_t at = (r * H + h) * D + d;
          REQUIRE(got.y[at] == want.y[r * D + d]);
          REQUIRE(dq[at] == dq1[r * D + d]);
        }
    for (const int which : {1, 2}) {
      INFO((which == 1 ? "dk" : "dv"));
      std::vector<float> scaled = part(want.dqkv, which, one);
      for (float& x : scaled) x *= H;
      // dK and dV add H T products each; the sums' partial values may exceed the row's largest.
      check_close(part(got.dqkv, which, mqa), scaled, lockstep::test::fp32_sums(H * T, D));
    }
  }
}

namespace {

// Note [Tiled attention]'s bf16 path in plain loops, in double but for what the note rounds:
// the probabilities of forward (exp(scale s - m), m the running maximum over the key tiles of
// `tile`, before they multiply v), those of backward (exp(scale s - lse)), and the score
// gradients scale p (dp - D) before their products, each rounded to bf16. Backward reads the
// forward's y and lse as given, as the kernel's backward does.
struct Reference {
  std::vector<float> y, lse, dqkv;
};
Reference rounded_reference(AttentionShape s, int tile, const std::vector<float>& qkv,
                            const std::vector<float>& dy, const std::vector<float>& y,
                            const std::vector<float>& lse) {
  using lockstep::detail::exp_poly;
  using lockstep::detail::round_to_bf16;
  const int T = s.T, H = s.heads, D = s.head_size, C = H * D;
  const int kv_heads = lockstep::kv_heads_of(s);
  const std::size_t width = std::size_t(lockstep::qkv_width(s));
  const float scale = 1.0f / std::sqrt(float(D));
  Reference out{std::vector<float>(y.size()), std::vector<float>(lse.size()),
                std::vector<float>(qkv.size(), 0.0f)};
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < H; ++h) {
      // q (part 0) of head h, k (1) and v (2) of its kv head, at position t; dy and y likewise.
      const int g = h / (H / kv_heads);
      const auto at = [&](int t, int part) {
        const std::size_t column =
            part == 0 ? std::size_t(h) * D : C + std::size_t((part - 1) * kv_heads + g) * D;
        return (std::size_t(b) * T + t) * width + column;
      };
      const auto row = [&](int t) { return (std::size_t(b) * T + t) * C + h * D; };
      const auto dot = [&](std::size_t x, std::size_t z, const std::vector<float>& xs,
                           const std::vector<float>& zs) {
        double sum = 0.0;
        for (int d = 0; d < D; ++d) sum += double(xs[x + d]) * zs[z + d];
        return sum;
      };
      const auto score = [&](int r, int c) { return float(dot(at(r, 0), at(c, 1), qkv, qkv)); };
      for (int r = 0; r < T; ++r) {
        float m = -INFINITY;
        double l = 0.0;
        std::vector<double> o(D, 0.0);
        for (int c0 = 0; c0 <= r; c0 += tile) {
          const int c1 = std::min(c0 + tile, r + 1);
          float m_new = m;
          for (int c = c0; c < c1; ++c) m_new = std::max(m_new, scale * score(r, c));
          const float alpha = exp_poly(m - m_new);
          l *= alpha;
          for (double& od : o) od *= alpha;
          for (int c = c0; c < c1; ++c) {
            const float e = exp_poly(scale * score(r, c) - m_new);
            l += e;
            const double p = round_to_bf16(e);  // rounding point 1
            for (int d = 0; d < D; ++d) o[d] += p * qkv[at(c, 2) + d];
          }
          m = m_new;
        }
        for (int d = 0; d < D; ++d) out.y[row(r) + d] = float(o[d] / l);
        out.lse[(std::size_t(b) * H + h) * T + r] = float(m + std::log(l));
      }
      const float* lse_head = lse.data() + (std::size_t(b) * H + h) * T;
      for (int r = 0; r < T; ++r) {
        const float d_r = float(dot(row(r), row(r), dy, y));
        for (int c = 0; c <= r; ++c) {
          const float p = round_to_bf16(exp_poly(scale * score(r, c) - lse_head[r]));  // 2
          const float dp = float(dot(row(r), at(c, 2), dy, qkv));
          const float ds = round_to_bf16(scale * p * (dp - d_r));  // rounding point 3
          for (int d = 0; d < D; ++d) {
            out.dqkv[at(r, 0) + d] += ds * qkv[at(c, 1) + d];
            out.dqkv[at(c, 1) + d] += ds * qkv[at(r, 0) + d];
            out.dqkv[at(c, 2) + d] += p * dy[row(r) + d];
          }
        }
      }
    }
  return out;
}

// n values in [-2, 2], multiples of 1/16: exact in bf16, and with D = 16 every score and every
// dp is exact in fp32 in any order of summation, so every value the kernel rounds is the
// reference's bit for bit, and only the sums of the products differ (in fp32's last bits).
std::vector<float> sixteenths(std::size_t n, std::uint64_t seed) {
  std::vector<float> x = random_floats(n, seed, -2.0, 2.0);
  for (float& v : x) v = std::round(v * 16.0f) / 16.0f;
  return x;
}

}  // namespace

// Where the roundings fall shows: a probability rounded or not moves y and the gradients by
// about 2^-9 of a term, hundreds of times fp32's tolerance.
TEST_CASE("tiled attention in bf16 rounds where Note [Tiled attention] says, and nowhere else") {
  // One partial tile, one whole tile, and three tiles of 64 (the running maximum moves); then
  // grouped-query attention, whose reference here reads kv head h / (H / Hkv) in plain loops.
  for (const AttentionShape s :
       {AttentionShape{2, 7, 2, 16}, AttentionShape{2, 64, 2, 16}, AttentionShape{1, 130, 2, 16},
        AttentionShape{2, 70, 4, 16, 2}, AttentionShape{1, 70, 3, 16, 1}}) {
    INFO(describe(s, true));
    const std::size_t n = std::size_t(s.batch) * s.T, c = std::size_t(s.heads) * s.head_size;
    const std::size_t rows = std::size_t(s.batch) * s.heads * s.T;
    const std::vector<float> qkv = sixteenths(qkv_size(s), 11 + s.T), dy = sixteenths(n * c, 12);
    auto dev = lockstep::make_cpu_device(0, 2);
    auto qkv16 = on_device(*dev, lockstep::test::to_bits(qkv));
    auto dy16 = on_device(*dev, lockstep::test::to_bits(dy));
    // y kept in fp32, so that forward's rounding is not hidden by y's own.
    DeviceArray<float> y(*dev, n * c), lse(*dev, rows), dqkv(*dev, qkv_size(s));
    dev->attention_forward(s, {nullptr, qkv16.data()}, {y.data()}, lse.data());
    dev->attention_backward(s, {nullptr, qkv16.data()}, {y.data()}, {nullptr, dy16.data()},
                            lse.data(), dqkv.data());
    const int tile = std::min(64, (s.T + 7) / 8 * 8);  // Note [Tiled attention]'s tiles
    const std::vector<float> got_y = y.download(), got_lse = lse.download();
    const Reference want = rounded_reference(s, tile, qkv, dy, got_y, got_lse);
    const Tolerance tol = lockstep::test::fp32_sums(s.T, c);
    {
      INFO("y");
      check_close(got_y, want.y, tol);
    }
    {
      INFO("lse");
      check_close(got_lse, want.lse, lockstep::test::fp32_sums(s.T));
    }
    const std::vector<float> got = dqkv.download();
    const char* names[] = {"dq", "dk", "dv"};
    for (int which = 0; which < 3; ++which) {
      INFO(names[which]);
      check_close(part(got, which, s), part(want.dqkv, which, s), tol);
    }
  }
}

// J(qkv) = sum(y * r) for a random r, so dy = r: dJ/dqkv by backward against central differences,
// at T = 70 (two tiles of 64, the second of six rows) and 130 (three), on every fifth element;
// and with grouped-query attention (4 query heads on 2 kv heads, and on 1), where dk and dv
// are sums over the query heads of a group.
TEST_CASE("tiled attention's backward matches finite differences of its forward") {
  for (const AttentionShape s : {AttentionShape{1, 70, 2, 8}, AttentionShape{1, 130, 2, 8},
                                 AttentionShape{1, 70, 4, 8, 2}, AttentionShape{1, 70, 4, 8, 1}}) {
    if (lockstep::test::kSanitized && s.T > 70) continue;  // a forward per element, twice
    INFO(describe(s, false));
    const std::size_t n = std::size_t(s.T) * s.heads * s.head_size;
    auto dev = lockstep::make_cpu_device(0, 2);
    std::vector<float> qkv = random_floats(qkv_size(s), 31);
    const std::vector<float> r = random_floats(n, 32);
    auto qkv_d = on_device(*dev, qkv), r_d = on_device(*dev, r);
    DeviceArray<float> y(*dev, n), lse(*dev, std::size_t(s.heads) * s.T),
        dqkv(*dev, qkv.size());
    const auto objective = [&] {
      qkv_d.upload(qkv);
      dev->attention_forward(s, {qkv_d.data()}, {y.data()}, lse.data());
      const std::vector<float> out = y.download();
      double j = 0.0;
      for (std::size_t i = 0; i < n; ++i) j += double(out[i]) * r[i];
      return j;
    };
    objective();
    dev->attention_backward(s, {qkv_d.data()}, {y.data()}, {r_d.data()}, lse.data(),
                            dqkv.data());
    const std::vector<float> all = dqkv.download();
    std::vector<float> analytic;
    std::vector<double> fd;
    for (std::size_t i = 0; i < qkv.size(); i += lockstep::test::kSanitized ? 25 : 5) {
      analytic.push_back(all[i]);
      fd.push_back(lockstep::test::central_difference(qkv, i, objective));
    }
    const std::string miss = lockstep::test::mismatch(fd, analytic);
    CHECK_MESSAGE(miss.empty(), miss);
  }
}

TEST_CASE("tiled attention is bit-identical at every thread count") {
  // Multi-head, and grouped-query (dK and dV summed over 3 query heads a kv head).
  for (const AttentionShape s : {AttentionShape{3, 130, 4, 32}, AttentionShape{3, 130, 6, 32, 2}}) {
    INFO(describe(s, false));
    std::vector<Attention> runs;
    for (int threads : {1, 2, 3}) {
      auto dev = lockstep::make_cpu_device(0, threads);
      runs.push_back(tiled(*dev, s, make_inputs(*dev, s, false, 5)));
    }
    for (std::size_t i = 1; i < runs.size(); ++i) {
      CHECK(runs[i].y == runs[0].y);
      CHECK(runs[i].dqkv == runs[0].dqkv);
    }
  }
}

TEST_CASE("tiled attention refuses a bad shape") {
  auto dev = lockstep::make_cpu_device(0, 1);
  CHECK_THROWS_AS(dev->attention_forward({1, 0, 1, 16}, {}, {}, nullptr), std::invalid_argument);
  CHECK_THROWS_AS(dev->attention_backward({1, 4, 0, 16}, {}, {}, {}, nullptr, nullptr),
                  std::invalid_argument);
  // kv_heads must divide heads (0 means heads).
  CHECK_THROWS_WITH_AS(dev->attention_forward({1, 4, 6, 16, 4}, {}, {}, nullptr),
                       doctest::Contains("kv_heads=4"), std::invalid_argument);
  CHECK_THROWS_AS(dev->attention_backward({1, 4, 6, 16, -1}, {}, {}, {}, nullptr, nullptr),
                  std::invalid_argument);
  // The materialised path refuses it as well, before any product.
  const lockstep::detail::AttentionBuffers buf{.path = AttentionKind::materialized};
  CHECK_THROWS_AS(lockstep::detail::attention_forward(*dev, {1, 4, 6, 16, 4}, {}, {}, buf),
                  std::invalid_argument);
}

TEST_CASE("model.attention: auto runs the fused path on the CPU, and fp32 on CUDA the "
          "materialised one") {
  using lockstep::choose_attention;
  using lockstep::Precision;
  const auto path = [](AttentionKind requested, const char* backend, Precision p, int context) {
    return choose_attention(requested, backend, p, context).path;
  };
  CHECK(path(AttentionKind::automatic, "cpu", Precision::bf16, 64) == AttentionKind::fused);
  CHECK(path(AttentionKind::automatic, "cpu", Precision::fp32, 256) == AttentionKind::fused);
  // fp32 below kFusedAttentionContext: the tiled path measured slower (bench/RESULTS.md).
  CHECK(path(AttentionKind::automatic, "cpu", Precision::fp32, 255) ==
        AttentionKind::materialized);
  CHECK(path(AttentionKind::fused, "cpu", Precision::fp32, 8) == AttentionKind::fused);
  CHECK(path(AttentionKind::materialized, "cpu", Precision::bf16, 4096) ==
        AttentionKind::materialized);
  // On cuda fp32 keeps the materialised path in every build (cuDNN's fused attention takes
  // half-precision inputs; tests/cuda/test_cudnn_attention.cpp has the rest of cuda's choice).
  const auto cuda = choose_attention(AttentionKind::automatic, "cuda", Precision::fp32, 1024);
  CHECK(cuda.path == AttentionKind::materialized);
  CHECK_THROWS_WITH_AS(choose_attention(AttentionKind::fused, "cuda", Precision::fp32, 1024),
                       doctest::Contains("model.attention: fused"), lockstep::InputError);
}
