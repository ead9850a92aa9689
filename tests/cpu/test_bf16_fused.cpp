// The CPU device's bf16-storage overloads (Note [bf16 compute] in src/model/ops.hpp): each must
// give the bits of its fp32 op between from_bf16 and to_bf16 passes, the composition the model
// ran before they were fused, on fresh random inputs past one block of the arena (kGrain).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "../random_data.hpp"
#include "device_passes.hpp"
#include "lockstep/device.hpp"

using namespace lockstep;
using lockstep::test::on_device;
using lockstep::test::random_floats;
using lockstep::test::require_same_floats;
using lockstep::test::rounded;
using lockstep::test::widened;

// The bias in bf16, as a bf16 output's bias epilogue reads it (LinearForward::bias).
TEST_CASE("cpu device: add_bias into bf16 is to_bf16 of add_bias with the bias widened") {
  auto dev = make_cpu_device(0, 2);
  for (auto [rows, cols] : {std::pair{1, 1}, {3, 5}, {300, 77}, {1024, 384}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    const std::size_t n = std::size_t(rows) * cols, nc = std::size_t(cols);
    auto x = on_device(*dev, random_floats(n, 11 + n, -40.0, 40.0));
    auto bias = on_device(*dev, random_floats(nc, 12 + n, -2.0, 2.0));
    DeviceArray<std::uint16_t> fused(*dev, n), bias16(*dev, nc);
    dev->to_bf16(bias.data(), bias16.data(), nc);
    dev->from_bf16(bias16.data(), bias.data(), nc);  // the fp32 op reads the widened bias
    dev->add_bias(x.data(), bias16.data(), fused.data(), rows, cols);
    dev->add_bias(x.data(), bias.data(), rows, cols);
    CHECK(fused.download() == rounded(*dev, x));
  }
}

TEST_CASE("cpu device: bias_grad of bf16 dy is bias_grad of the widened dy") {
  auto dev = make_cpu_device(0, 2);
  for (auto [rows, cols] : {std::pair{1, 1}, {3, 5}, {300, 77}, {1024, 384}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    const std::size_t n = std::size_t(rows) * cols;
    auto dy = on_device(*dev, random_floats(n, 13 + n, -3.0, 3.0));
    DeviceArray<std::uint16_t> dy16(*dev, n);
    dev->to_bf16(dy.data(), dy16.data(), n);
    dev->from_bf16(dy16.data(), dy.data(), n);
    const std::vector<float> start = random_floats(std::size_t(cols), 14 + n);
    auto from16 = on_device(*dev, start), from32 = on_device(*dev, start);
    dev->bias_grad(from16.data(), dy16.data(), rows, cols);
    dev->bias_grad(from32.data(), dy.data(), rows, cols);
    require_same_floats(from16.download(), from32.download());
    CHECK(from16.download() != start);
  }
}

TEST_CASE("cpu device: activations on bf16 storage are the fp32 ones between conversions") {
  auto dev = make_cpu_device(0, 2);
  const std::size_t n = 40000;
  // Inputs already bf16, as the model keeps them; dy fp32, as backward computes it.
  DeviceArray<std::uint16_t> x(*dev, n);
  auto x32 = on_device(*dev, random_floats(n, 21, -6.0, 6.0));
  dev->to_bf16(x32.data(), x.data(), n);
  const std::vector<float> dy = random_floats(n, 22, -3.0, 3.0);
  for (Activation f : {Activation::relu, Activation::gelu, Activation::tanh}) {
    CAPTURE(int(f));
    DeviceArray<float> wide = widened(*dev, x);
    // Forward: y = to_bf16(f(from_bf16(x))).
    DeviceArray<std::uint16_t> y(*dev, n);
    dev->activation_forward(f, x.data(), y.data(), n);
    DeviceArray<float> y32(*dev, n);
    dev->activation_forward(f, wide.data(), y32.data(), n);
    CHECK(y.download() == rounded(*dev, y32));
    // Backward: dx = dy * f'(from_bf16(x)), and its rounding; out of place and in place.
    auto dyd = on_device(*dev, dy), want = on_device(*dev, dy);
    dev->activation_backward(f, wide.data(), want.data(), want.data(), n);
    DeviceArray<float> dx(*dev, n);
    DeviceArray<std::uint16_t> dx16(*dev, n);
    dev->activation_backward(f, x.data(), dyd.data(), dx.data(), dx16.data(), n);
    require_same_floats(dx.download(), want.download());
    CHECK(dx16.download() == rounded(*dev, want));
    dev->activation_backward(f, x.data(), dyd.data(), dyd.data(), nullptr, n);
    require_same_floats(dyd.download(), want.download());
  }
}

TEST_CASE("cpu device: layernorm_forward into bf16 is to_bf16 of its fp32 output") {
  auto dev = make_cpu_device(0, 2);
  for (auto [rows, C] : {std::pair{1, 1}, {7, 31}, {600, 128}}) {
    CAPTURE(rows);
    CAPTURE(C);
    const std::size_t n = std::size_t(rows) * C;
    auto x = on_device(*dev, random_floats(n, 31 + n, -2.0, 3.0));
    auto w = on_device(*dev, random_floats(std::size_t(C), 32 + n));
    auto b = on_device(*dev, random_floats(std::size_t(C), 33 + n));
    DeviceArray<float> y32(*dev, n), mean32(*dev, rows), rstd32(*dev, rows);
    DeviceArray<float> mean(*dev, rows), rstd(*dev, rows);
    DeviceArray<std::uint16_t> y(*dev, n);
    dev->layernorm_forward(x.data(), w.data(), b.data(), y32.data(), mean32.data(), rstd32.data(),
                           rows, C);
    dev->layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows,
                           C);
    CHECK(y.download() == rounded(*dev, y32));
    require_same_floats(mean.download(), mean32.download());
    require_same_floats(rstd.download(), rstd32.download());
  }
}

TEST_CASE("cpu device: causal softmax on bf16 probabilities is the fp32 one between conversions") {
  auto dev = make_cpu_device(0, 2);
  for (auto [count, T] : {std::pair{1, 1}, {2, 37}, {8, 64}, {1, 300}}) {
    CAPTURE(count);
    CAPTURE(T);
    const std::size_t n = std::size_t(count) * T * T;
    const float scale = 0.125f;
    auto s = on_device(*dev, random_floats(n, 41 + n, -8.0, 8.0));
    const std::vector<float> dp = random_floats(n, 42 + n);
    // Forward: p = to_bf16(softmax(s)), the fp32 one computed in place as the model does.
    DeviceArray<std::uint16_t> p(*dev, n);
    dev->causal_softmax_forward(s.data(), p.data(), count, T, scale);
    dev->causal_softmax_forward(s.data(), s.data(), count, T, scale);
    CHECK(p.download() == rounded(*dev, s));
    // Backward from the bf16 p: ds = to_bf16(the fp32 backward of from_bf16(p)).
    DeviceArray<float> p32 = widened(*dev, p);
    auto dpd = on_device(*dev, dp), ds32 = on_device(*dev, dp);
    DeviceArray<std::uint16_t> ds(*dev, n);
    dev->causal_softmax_backward(p.data(), dpd.data(), ds.data(), count, T, scale);
    dev->causal_softmax_backward(p32.data(), ds32.data(), ds32.data(), count, T, scale);
    CHECK(ds.download() == rounded(*dev, ds32));
  }
}

TEST_CASE("cpu device: softmax_cross_entropy into bf16 dlogits is to_bf16 of the fp32 ones") {
  auto dev = make_cpu_device(0, 2);
  const int rows = 300, classes = 257;
  const std::size_t n = std::size_t(rows) * classes;
  auto logits = on_device(*dev, random_floats(n, 51, -6.0, 6.0));
  std::vector<std::int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = (r * 37) % classes;
  auto yd = on_device(*dev, labels);
  DeviceArray<float> d32(*dev, n);
  DeviceArray<std::uint16_t> d16(*dev, n);
  DeviceArray<LossStats> s32(*dev, 1), s16(*dev, 1);
  dev->softmax_cross_entropy(logits.data(), yd.data(), rows, classes, d32.data(), 1.0f / 300,
                             s32.data());
  dev->softmax_cross_entropy(logits.data(), yd.data(), rows, classes, d16.data(), 1.0f / 300,
                             s16.data());
  CHECK(d16.download() == rounded(*dev, d32));
  const LossStats a = s32.download()[0], b = s16.download()[0];
  CHECK(a.loss_sum == b.loss_sum);
  CHECK(a.correct == b.correct);
}
