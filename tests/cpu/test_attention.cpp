// The CPU's tiled attention (Device::attention_forward/backward, Note [Tiled attention] in
// src/cpu/ops/attention.cpp) against the materialised attention a GPT block runs otherwise
// (model/attention.hpp): the output and the gradients of q, k and v, in fp32 (only the order of summation differs: within 1e-5 of each tensor's largest
// value) and in bf16 (bf16's tolerance). The finite-difference check of the tiled backward is in
// tests/model/test_gpt.cpp, through a block.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "common/bf16.hpp"
#include "lockstep/device.hpp"
#include "model/attention.hpp"
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
using lockstep::test::on_device;
using lockstep::test::random_floats;

// What both paths produce: y widened to fp32, and the gradients of q, k, v.
struct Attention {
  std::vector<float> y, dqkv;
};

// The operands, on the device: qkv (B T, 3C) and dy (B T, C) in fp32 or bf16 (rounded from the
// same draws), as the block's products read them.
struct Inputs {
  DeviceArray<float> qkv32, dy32;
  DeviceArray<std::uint16_t> qkv16, dy16;
  MatIn qkv() const { return qkv16.size() ? MatIn{nullptr, qkv16.data()} : MatIn{qkv32.data()}; }
  MatIn dy() const { return dy16.size() ? MatIn{nullptr, dy16.data()} : MatIn{dy32.data()}; }
};

Inputs make_inputs(Device& dev, AttentionShape s, bool bf16, std::uint64_t seed) {
  const std::size_t n = std::size_t(s.batch) * s.T, c = std::size_t(s.heads) * s.head_size;
  // Scores of a few units, so that the rows' maxima move from tile to tile.
  Inputs in{on_device(dev, random_floats(n * 3 * c, seed, -2.0, 2.0)),
            on_device(dev, random_floats(n * c, seed + 1)), {}, {}};
  if (bf16) {
    in.qkv16 = DeviceArray<std::uint16_t>(dev, n * 3 * c);
    in.dy16 = DeviceArray<std::uint16_t>(dev, n * c);
    dev.to_bf16(in.qkv32.data(), in.qkv16.data(), n * 3 * c);
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
  auto dqkv = on_device(dev, random_floats(n * 3 * c, 99));  // overwritten
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

// max |a - b| over max |b|: the error relative to the tensor's scale.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double err = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    err = std::max(err, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return scale > 0.0 ? err / scale : err;
}

// The gradient of q, k or v (which = 0, 1, 2) out of dqkv (B T, 3C).
std::vector<float> part(const std::vector<float>& dqkv, int which, int C) {
  std::vector<float> out;
  for (std::size_t row = 0; row < dqkv.size() / (3 * C); ++row)
    out.insert(out.end(), dqkv.begin() + row * 3 * C + which * C,
               dqkv.begin() + row * 3 * C + (which + 1) * C);
  return out;
}

void check_case(AttentionShape s, bool bf16, double tol) {
  auto dev = lockstep::make_cpu_device(0, 2);
  const Inputs in = make_inputs(*dev, s, bf16, 1000 + s.T * 7 + s.heads * 3 + s.head_size);
  const Attention got = tiled(*dev, s, in),
                  want = run_path(*dev, s, in, AttentionKind::materialized);
  const int C = s.heads * s.head_size;
  INFO(fmt::format("{} B={} T={} H={} D={}", bf16 ? "bf16" : "fp32", s.batch, s.T, s.heads,
                   s.head_size));
  CHECK(relative_error(got.y, want.y) <= tol);
  const char* names[] = {"dq", "dk", "dv"};
  for (int which = 0; which < 3; ++which) {
    INFO(names[which]);
    CHECK(relative_error(part(got.dqkv, which, C), part(want.dqkv, which, C)) <= tol);
  }
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

constexpr double kFp32Tolerance = 1e-5;
// bf16 operands round to 2^-9 relative; the two paths round the probabilities at different
// points (after normalising, or before), so their products differ by a few such roundings.
constexpr double kBf16Tolerance = 2e-2;

}  // namespace

TEST_CASE("tiled attention matches the materialised attention in fp32") {
  for (const AttentionShape& s : cases(false)) check_case(s, false, kFp32Tolerance);
}

TEST_CASE("tiled attention matches the materialised attention in bf16") {
  for (const AttentionShape& s : cases(true)) check_case(s, true, kBf16Tolerance);
}

// J(qkv) = sum(y * r) for a random r, so dy = r: dJ/dqkv by backward against central differences,
// at T = 70 (two tiles of 64, the second of six rows) and 130 (three), on every fifth element.
TEST_CASE("tiled attention's backward matches finite differences of its forward") {
  for (const int T : {70, 130}) {
    if (lockstep::test::kSanitized && T > 70) continue;  // a forward per element, twice
    INFO("T = ", T);
    const AttentionShape s{1, T, 2, 8};
    const std::size_t n = std::size_t(T) * 16;
    auto dev = lockstep::make_cpu_device(0, 2);
    std::vector<float> qkv = random_floats(3 * n, 31);
    const std::vector<float> r = random_floats(n, 32);
    auto qkv_d = on_device(*dev, qkv), r_d = on_device(*dev, r);
    DeviceArray<float> y(*dev, n), lse(*dev, std::size_t(2) * T), dqkv(*dev, 3 * n);
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
  const AttentionShape s{3, 130, 4, 32};
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

TEST_CASE("tiled attention refuses a bad shape") {
  auto dev = lockstep::make_cpu_device(0, 1);
  CHECK_THROWS_AS(dev->attention_forward({1, 0, 1, 16}, {}, {}, nullptr), std::invalid_argument);
  CHECK_THROWS_AS(dev->attention_backward({1, 4, 0, 16}, {}, {}, {}, nullptr, nullptr),
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
