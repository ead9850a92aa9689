// The CUDA fused classifier (softmax_cross_entropy with bf16 logits, in place) against the CPU
// device's, which defines it (Note [Fused classifier] in src/cpu/ops/softmax.cpp), on fresh
// random logits: packed rows (a multiple of 8 classes, GPT-2's padded 50304 among them) and
// unpacked ones, with a padded vocabulary's -inf columns. Skips without a GPU.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "../linear_cases.hpp"
#include "common/random.hpp"
#include "gpu_vs_cpu.hpp"

using namespace lockstep;
using namespace lockstep::test;

TEST_SUITE("cuda") {
  TEST_CASE("cuda: the fused classifier against the CPU device") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    auto gpu = backend->create_device(0, 1, 0);
    std::uint64_t seed = 900;
    for (auto [rows, classes, padding] : {std::tuple{1, 8, 0}, {37, 1001, 0}, {64, 256, 0},
                                          {300, 50304, 47}, {5, 50257, 0}}) {
      CAPTURE(rows);
      CAPTURE(classes);
      std::vector<float> logits =
          random_floats(std::size_t(rows) * classes, seed += 2, -12.0, 12.0);
      std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
      for (int r = 0; r < rows; ++r) {
        for (int j = classes - padding; j < classes; ++j)
          logits[std::size_t(r) * classes + j] = -std::numeric_limits<float>::infinity();
        labels[std::size_t(r)] =
            static_cast<std::int32_t>(detail::uniform_below(seed, classes - padding));
      }
      const float scale = 1.0f / static_cast<float>(rows);
      LossStats stats[2];
      int which = 0;
      // dlogits within a bf16 neighbour each (both round once), and the row's sums of exp in
      // float behind the floor.
      compare(*gpu, [&](Device& d) {
        DeviceArray<std::uint16_t> z = on_device(d, to_bits(logits));
        DeviceArray<std::int32_t> y = on_device(d, labels);
        DeviceArray<LossStats> acc(d, 1);
        d.softmax_cross_entropy(z.data(), y.data(), rows, classes, z.data(), scale, acc.data());
        // Without a gradient (evaluation): the same sums, the logits untouched.
        DeviceArray<std::uint16_t> z2 = on_device(d, to_bits(logits));
        DeviceArray<LossStats> acc2(d, 1);
        d.softmax_cross_entropy(z2.data(), y.data(), rows, classes,
                                static_cast<std::uint16_t*>(nullptr), 0.0f, acc2.data());
        const LossStats s = acc.download()[0], s2 = acc2.download()[0];
        CHECK(s2.loss_sum == s.loss_sum);
        CHECK(s2.correct == s.correct);
        CHECK(z2.download() == to_bits(logits));
        stats[which++] = s;
        return Outputs{widened(z.download())};
      }, bf16_rounded(fp32_sums(classes, std::size_t(classes))));
      CHECK(stats[1].loss_sum == doctest::Approx(stats[0].loss_sum).epsilon(1e-6));
      CHECK(stats[1].correct == stats[0].correct);
      CHECK(stats[1].label_error == 0);
    }
  }
}
