// Supervised fine-tuning's kernels on the GPU against the CPU device (Note [Comparing with the
// CPU] in gpu_vs_cpu.hpp): the cross-entropy with ignored labels (kIgnoreLabel rows add nothing
// and get a zero gradient; fp32 and the fused bf16 classifier), the packed-sequence mask of the
// attention scores, and RoPE at packed positions. Skip without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gpu_vs_cpu.hpp"

using namespace lockstep;
using namespace lockstep::test;

TEST_SUITE("cuda") {
  TEST_CASE("cuda: the cross-entropy skips kIgnoreLabel rows as the CPU device does") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    const int rows = 37, classes = 1001;
    const std::vector<float> logits = random_floats(std::size_t(rows) * classes, 950, -8.0, 8.0);
    std::vector<std::int32_t> labels = random_labels(std::size_t(rows), classes, 951);
    for (int r = 0; r < rows; r += 3) labels[std::size_t(r)] = kIgnoreLabel;
    LossStats stats[2];
    int which = 0;
    compare(*gpu, [&](Device& d) {
      auto z = on_device(d, logits);
      auto y = on_device(d, labels);
      DeviceArray<float> dz = poisoned(d, logits.size());
      DeviceArray<LossStats> acc(d, 1);
      d.softmax_cross_entropy(z.data(), y.data(), rows, classes, dz.data(), 0.25f, acc.data());
      auto z16 = on_device(d, to_bits(logits));
      DeviceArray<LossStats> acc16(d, 1);
      d.softmax_cross_entropy(z16.data(), y.data(), rows, classes, z16.data(), 0.25f,
                              acc16.data());
      stats[which++] = acc.download()[0];
      return Outputs{dz.download(), widened(z16.download())};
    }, bf16_rounded(fp32_sums(classes, std::size_t(classes))));
    CHECK(stats[1].loss_sum == doctest::Approx(stats[0].loss_sum).epsilon(1e-6));
    CHECK(stats[1].correct == stats[0].correct);
    CHECK(stats[1].label_error == 0);
  }

  TEST_CASE("cuda: packed scores are masked, and RoPE turns at packed positions, as on the CPU") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    const int batch = 2, heads = 3, T = 40, half = 4;
    // Sequences of 7, 20 and 13 positions in the first row; 40 in the second.
    std::vector<std::int32_t> positions;
    for (int len : {7, 20, 13, 40})
      for (int p = 0; p < len; ++p) positions.push_back(p);
    const std::size_t squares = std::size_t(batch) * heads * T * T;
    const auto scores = random_floats(squares, 960, -3.0, 3.0);
    compare(*gpu, [&](Device& d) {
      auto s = on_device(d, scores);
      auto pos = on_device(d, positions);
      d.mask_packed_scores(s.data(), pos.data(), batch, heads, T);
      std::vector<float> out = s.download();
      for (float& v : out) v = std::isinf(v) ? -1e30f : v;  // compared as a number
      return Outputs{out};
    }, kSameBits);

    const RopeShape shape{batch, T, 4, 2, 2 * half, 0, nullptr};
    const std::size_t n = std::size_t(batch) * T * (4 + 2 * 2) * 2 * half;
    std::vector<float> cos, sin;
    for (float angle : random_floats(std::size_t(T) * half, 961, -4.0, 4.0)) {
      cos.push_back(static_cast<float>(std::cos(double(angle))));
      sin.push_back(static_cast<float>(std::sin(double(angle))));
    }
    const auto x = random_floats(n, 962, -3.0, 3.0);
    compare(*gpu, [&](Device& d) {
      auto cd = on_device(d, cos), sd = on_device(d, sin);
      auto pos = on_device(d, positions);
      RopeShape packed = shape;
      packed.positions = pos.data();
      auto q = on_device(d, x), dq = on_device(d, x);
      d.rope_forward(packed, {cd.data(), sd.data(), T}, q.data());
      d.rope_backward(packed, {cd.data(), sd.data(), T}, dq.data(), nullptr);
      return Outputs{q.download(), dq.download()};
    }, kSameBits);
  }
}
