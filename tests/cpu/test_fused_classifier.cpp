// The fused classifier's reference (Note [Fused classifier] in src/cpu/ops/softmax.cpp), which
// the CUDA kernel is held to: softmax_cross_entropy with bf16 logits against its definition in
// double on the widened logits (the loss, the correct count, and the gradient rounded once to
// bf16), the same bits in place or not; and its loss within the logits' bf16 rounding of the
// unfused fp32 path's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "../compare.hpp"
#include "../linear_cases.hpp"
#include "common/elementwise_math.hpp"
#include "../random_data.hpp"
#include "lockstep/device.hpp"

using namespace lockstep;
using namespace lockstep::test;

namespace {

// Logits (rows, classes) in [-8, 8], the last `padding` columns -inf as a GPT's padded
// vocabulary has them, and labels among the real classes.
struct ClassifierCase {
  int rows, classes, padding;
  std::vector<float> logits;
  std::vector<std::int32_t> labels;
  ClassifierCase(int r, int c, int pad, std::uint64_t seed)
      : rows(r), classes(c), padding(pad),
        logits(random_floats(std::size_t(r) * c, seed, -8.0, 8.0)), labels(std::size_t(r)) {
    for (int i = 0; i < r; ++i) {
      for (int j = c - pad; j < c; ++j)
        logits[std::size_t(i) * c + j] = -std::numeric_limits<float>::infinity();
      labels[std::size_t(i)] = static_cast<std::int32_t>((seed + 7 * std::uint64_t(i)) % (c - pad));
    }
  }
};

struct Result {
  LossStats stats;
  std::vector<std::uint16_t> dlogits;
};

// The fused form on the logits rounded to bf16, writing the gradient over them.
Result fused(Device& dev, const ClassifierCase& c, float grad_scale) {
  DeviceArray<std::uint16_t> z = on_device(dev, to_bits(c.logits));
  DeviceArray<std::int32_t> y = on_device(dev, c.labels);
  DeviceArray<LossStats> stats(dev, 1);
  dev.softmax_cross_entropy(z.data(), y.data(), c.rows, c.classes, z.data(), grad_scale,
                            stats.data());
  return {stats.download().front(), z.download()};
}

// The unfused form with bf16 dlogits, on the given fp32 logits.
Result unfused(Device& dev, const ClassifierCase& c, const std::vector<float>& logits,
               float grad_scale) {
  DeviceArray<float> z = on_device(dev, logits);
  DeviceArray<std::int32_t> y = on_device(dev, c.labels);
  DeviceArray<std::uint16_t> d(dev, logits.size());
  DeviceArray<LossStats> stats(dev, 1);
  dev.softmax_cross_entropy(z.data(), y.data(), c.rows, c.classes, d.data(), grad_scale,
                            stats.data());
  return {stats.download().front(), d.download()};
}

// softmax_cross_entropy by its definition, in double, on logits z: per row the loss
// log(sum_j exp z_j) - z_label and whether the first of the largest logits is the label's, and
// the gradient (softmax(z) - onehot(label)) grad_scale before it is rounded.
struct Definition {
  double loss_sum = 0.0;
  int correct = 0;
  std::vector<float> dlogits;
};
Definition by_definition(const ClassifierCase& c, const std::vector<float>& z, float grad_scale) {
  Definition out;
  out.dlogits.resize(z.size());
  for (int r = 0; r < c.rows; ++r) {
    const float* row = z.data() + std::size_t(r) * c.classes;
    const int label = c.labels[std::size_t(r)];
    const int argmax = int(std::max_element(row, row + c.classes) - row);
    double sum = 0.0;
    for (int j = 0; j < c.classes; ++j) sum += std::exp(double(row[j]) - row[argmax]);
    out.loss_sum += std::log(sum) + row[argmax] - row[label];
    out.correct += argmax == label ? 1 : 0;
    for (int j = 0; j < c.classes; ++j) {
      const double p = std::exp(double(row[j]) - row[argmax]) / sum - (j == label ? 1.0 : 0.0);
      out.dlogits[std::size_t(r) * c.classes + j] = static_cast<float>(p * grad_scale);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("fused classifier: its definition on the widened logits, in place or not") {
  auto dev = make_cpu_device(0, 2);
  for (auto [rows, classes, padding] : {std::tuple{1, 1, 0}, {37, 256, 0}, {64, 320, 63},
                                        {300, 1001, 0}}) {
    CAPTURE(rows);
    CAPTURE(classes);
    const ClassifierCase c(rows, classes, padding, 40 + rows);
    const float grad_scale = 1.0f / float(rows);
    const Result got = fused(*dev, c, grad_scale);
    const Definition want = by_definition(c, widened(to_bits(c.logits)), grad_scale);
    // The rows' losses summed in another order.
    CHECK(got.stats.loss_sum == doctest::Approx(want.loss_sum).epsilon(1e-12));
    CHECK(got.stats.correct == want.correct);
    CHECK(got.stats.label_error == 0);
    // Each gradient rounded once to bf16: within half a bf16 ulp, 2^-8 of its size.
    check_close(widened(got.dlogits), want.dlogits, {.rel = 0x1p-8});
    // Not in place: the same gradient, the logits left alone.
    DeviceArray<std::uint16_t> z = on_device(*dev, to_bits(c.logits)), d(*dev, c.logits.size());
    DeviceArray<std::int32_t> y = on_device(*dev, c.labels);
    DeviceArray<LossStats> stats(*dev, 1);
    dev->softmax_cross_entropy(z.data(), y.data(), rows, classes, d.data(), grad_scale,
                               stats.data());
    CHECK(d.download() == got.dlogits);
    CHECK(z.download() == to_bits(c.logits));
  }
}

// Each row's loss, logsumexp(z) - z[label], moves by at most twice the largest change of a
// logit, and rounding to bf16 changes a logit by at most 2^-9 of its size.
TEST_CASE("fused classifier: the loss within the logits' bf16 rounding of the fp32 path's") {
  auto dev = make_cpu_device(0, 2);
  const ClassifierCase c(512, 320, 63, 77);
  const Result got = fused(*dev, c, 1.0f);
  const Result want = unfused(*dev, c, c.logits, 1.0f);
  const double bound = c.rows * 2.0 * 8.0 / 512.0;
  CHECK(std::abs(got.stats.loss_sum - want.stats.loss_sum) <= bound);
  CHECK(std::abs(got.stats.loss_sum - want.stats.loss_sum) / want.stats.loss_sum < 1e-3);
  // The argmax may change only where rounding ties two logits: rarely.
  CHECK(std::abs(got.stats.correct - want.stats.correct) <= 2);
  // The padding gets exactly zero gradient.
  for (int r = 0; r < c.rows; ++r)
    for (int j = c.classes - c.padding; j < c.classes; ++j)
      REQUIRE(got.dlogits[std::size_t(r) * c.classes + j] == 0);
}

TEST_CASE("fused classifier: a label outside the classes writes nothing and is recorded") {
  auto dev = make_cpu_device(0, 1);
  ClassifierCase c(6, 40, 0, 5);
  c.labels[3] = 40;
  DeviceArray<std::uint16_t> z = on_device(*dev, to_bits(c.logits));
  DeviceArray<std::int32_t> y = on_device(*dev, c.labels);
  DeviceArray<LossStats> stats(*dev, 1);
  dev->softmax_cross_entropy(z.data(), y.data(), c.rows, c.classes, z.data(), 1.0f,
                             stats.data());
  const LossStats s = stats.download().front();
  CHECK(s.label_error == detail::label_error_key(3, 40));
  CHECK(s.loss_sum == 0.0);
  CHECK(z.download() == to_bits(c.logits));
}
