// The layers under trainer.precision bf16 (Note [bf16 compute] in src/model/ops.hpp), on the CPU
// device: each layer's output and gradients against its fp32 ones on the same parameters and
// inputs, within what rounding the operands to bf16 costs; a bf16 Linear against the closed form
// (a double-precision product of the rounded operands); and the saved workspace shrinking.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/bf16.hpp"
#include "lockstep/model.hpp"
#include "../compare.hpp"
#include "../random_data.hpp"

namespace {

using lockstep::DeviceArray;
using lockstep::Layer;
using lockstep::Precision;
using namespace lockstep::test;

struct LayerRun {
  std::vector<float> y, dparams, dx;
};

// forward, then backward of dout, in `precision`; the parameter gradients start at zero. Under
// bf16 the layer reads the parameters rounded to bf16, as a Replica hands them over.
LayerRun run_layer(const Layer& layer, Precision precision, int batch,
                   const std::vector<float>& params, const std::vector<float>& x,
                   const std::vector<float>& dout) {
  auto dev = lockstep::make_cpu_device(0, 1);
  DeviceArray<float> saved(*dev, layer.workspace_size(batch, precision));
  DeviceArray<float> scratch(*dev, layer.scratch_size(batch, precision));
  auto pd = on_device(*dev, params), xd = on_device(*dev, x), dyd = on_device(*dev, dout);
  DeviceArray<std::uint16_t> p16(*dev, precision == Precision::bf16 ? params.size() : 0);
  if (p16.size()) dev->to_bf16(pd.data(), p16.data(), params.size());
  // A layer that reads its output gradient in bf16 (the LM head) gets it rounded, as the
  // Replica hands it over.
  const bool round_dout = precision == Precision::bf16 && layer.dout_bf16();
  DeviceArray<std::uint16_t> dout16(*dev, round_dout ? dout.size() : 0);
  if (round_dout) dev->to_bf16(dyd.data(), dout16.data(), dout.size());
  const lockstep::LayerWorkspace ws{saved.data(), scratch.data(), precision, p16.data(),
                                    dout16.data()};
  auto gd = on_device(*dev, std::vector<float>(params.size(), 0.0f));
  DeviceArray<float> yd(*dev, dout.size()), dxd(*dev, x.size());
  layer.forward(*dev, pd.data(), xd.data(), yd.data(), batch, ws);
  layer.backward(*dev, pd.data(), gd.data(), xd.data(), yd.data(), dyd.data(), dxd.data(), batch,
                 ws);
  return {yd.download(), gd.download(), dxd.download()};
}

// bf16 against fp32: output, parameter and input gradients within 2e-2 of their norms, and not
// equal (the bf16 path was taken), unless the layer has no matrix product.
void check_bf16_close(const Layer& layer, int batch, const std::vector<float>& params,
                      const std::vector<float>& x, bool has_products = true) {
  const auto dout = random_floats(std::size_t(batch) * layer.out_features(), 99);
  const LayerRun f = run_layer(layer, Precision::fp32, batch, params, x, dout);
  const LayerRun b = run_layer(layer, Precision::bf16, batch, params, x, dout);
  const double ey = relative_error(b.y, f.y), ep = relative_error(b.dparams, f.dparams),
               ex = relative_error(b.dx, f.dx);
  CAPTURE(ey);
  CAPTURE(ep);
  CAPTURE(ex);
  CHECK(ey < 2e-2);
  CHECK(ep < 2e-2);
  CHECK(ex < 2e-2);
  if (has_products) {
    CHECK(ey > 0.0);
    CHECK(ep > 0.0);
    CHECK(ex > 0.0);
  }
}

// Whether got is sum over j < k of bf16(a(j)) bf16(b(j)) (each product exact in fp32), within
// the error of summing them in fp32, plus that of adding a term of size `extra`.
template <class A, class B>
bool is_bf16_product(double got, int k, A a, B b, double extra = 0.0) {
  double want = 0.0, magnitude = 0.0;
  for (int j = 0; j < k; ++j) {
    const double term = double(lockstep::detail::round_to_bf16(a(j))) *
                        lockstep::detail::round_to_bf16(b(j));
    want += term;
    magnitude += std::abs(term);
  }
  return std::abs(got - want) <= 1.2e-7 * (k * magnitude + extra);
}

}  // namespace

TEST_CASE("bf16 linear: y = x W^T + b from the bf16-rounded x and W, summed in fp32") {
  const int in = 37, out = 5, batch = 4;
  const auto layer = lockstep::make_linear(in, out);
  const auto params = random_floats(layer->param_count(), 1);
  const auto x = random_floats(std::size_t(batch) * in, 2, -3.0, 3.0);
  const auto dout = random_floats(std::size_t(batch) * out, 3);
  const LayerRun r = run_layer(*layer, Precision::bf16, batch, params, x, dout);
  const float* w = params.data();
  const float* bias = params.data() + out * in;
  for (int i = 0; i < batch; ++i)
    for (int o = 0; o < out; ++o)
      CHECK(is_bf16_product(double(r.y[i * out + o]) - bias[o], in,
                            [&](int k) { return x[i * in + k]; },
                            [&](int k) { return w[o * in + k]; }, std::abs(bias[o])));
  // dW (out, in) = dout^T bf16(x) with dout rounded too; dx = bf16(dout) bf16(W).
  for (int o = 0; o < out; ++o)
    for (int k = 0; k < in; ++k)
      CHECK(is_bf16_product(r.dparams[o * in + k], batch, [&](int i) { return dout[i * out + o]; },
                            [&](int i) { return x[i * in + k]; }));
  for (int i = 0; i < batch; ++i)
    for (int k = 0; k < in; ++k)
      CHECK(is_bf16_product(r.dx[i * in + k], out, [&](int o) { return dout[i * out + o]; },
                            [&](int o) { return w[o * in + k]; }));
  // The bias gradient sums the fp32 dout.
  for (int o = 0; o < out; ++o) {
    double want = 0.0;
    for (int i = 0; i < batch; ++i) want += dout[i * out + o];
    CHECK(r.dparams[out * in + o] == doctest::Approx(want).epsilon(1e-6));
  }
}

TEST_CASE("bf16 layers: linear, gpt block, final layernorm and lm head against fp32") {
  SUBCASE("linear") {
    const auto layer = lockstep::make_linear(24, 16);
    check_bf16_close(*layer, 6, random_floats(layer->param_count(), 4),
                     random_floats(6 * 24, 5));
  }
  SUBCASE("gpt block") {
    const int t = 8, c = 16, batch = 3;
    const auto layer = lockstep::make_block(t, c, /*heads=*/2, /*n_layer=*/2);
    check_bf16_close(*layer, batch, random_floats(layer->param_count(), 6, -0.5, 0.5),
                     random_floats(std::size_t(batch) * t * c, 7, -2.0, 2.0));
  }
  SUBCASE("gpt block, more heads than sequences") {
    const int t = 5, c = 12, batch = 1;
    const auto layer = lockstep::make_block(t, c, /*heads=*/3, /*n_layer=*/1);
    check_bf16_close(*layer, batch, random_floats(layer->param_count(), 8, -0.5, 0.5),
                     random_floats(std::size_t(batch) * t * c, 9, -2.0, 2.0));
  }
  SUBCASE("final layernorm: no matrix product, so exactly fp32") {
    const int t = 4, c = 8, batch = 2;
    const auto layer = lockstep::make_layernorm(t, c);
    check_bf16_close(*layer, batch, random_floats(layer->param_count(), 10),
                     random_floats(std::size_t(batch) * t * c, 11, -2.0, 2.0),
                     /*has_products=*/false);
  }
  SUBCASE("tied lm head, padded vocabulary") {
    const int vocab = 70, t = 4, c = 8, batch = 2;  // padded to 128
    const auto layer = lockstep::make_tied_lm_head(0, vocab, t, c);
    check_bf16_close(*layer, batch, random_floats(std::size_t(vocab) * c, 12),
                     random_floats(std::size_t(batch) * t * c, 13));
  }
}

TEST_CASE("bf16 gpt block: the saved workspace keeps matrix-product inputs in half the bytes") {
  const int t = 16, c = 32, heads = 4, batch = 3;
  const auto layer = lockstep::make_block(t, c, heads, 1);
  const std::size_t n = std::size_t(batch) * t, att = std::size_t(batch) * heads * t * t;
  // fp32: ln1, atty, res1, ln2 (N, C); qkv (N, 3C); fc, gelu (N, 4C); probabilities; 4 (N) stats.
  const std::size_t fp32 = 15 * n * c + att + 4 * n;
  CHECK(layer->workspace_size(batch, Precision::fp32) == fp32);
  CHECK(layer->workspace_size(batch) == fp32);
  // bf16: all but res1 and the statistics in half, each of the 7 regions on a 64-byte line.
  const std::size_t kept = 14 * n * c + att;
  const std::size_t bf16 = layer->workspace_size(batch, Precision::bf16);
  CHECK(bf16 >= fp32 - kept / 2);
  CHECK(bf16 <= fp32 - kept / 2 + 7 * 32);
  // Scratch grows under bf16 only: widened values and a bf16 gradient.
  CHECK(layer->scratch_size(batch, Precision::bf16) > layer->scratch_size(batch, Precision::fp32));
}

TEST_CASE("bf16 replica: the loss writing dlogits_bf16 gives backward's gradients from fp32 "
          "dlogits, bit for bit") {
  // vocab_size 70: 128 logits a position, with padding.
  const lockstep::GptSpec spec{.vocab_size = 70, .context = 8, .n_layer = 1, .n_head = 2,
                               .d_model = 16};
  const lockstep::Model model = lockstep::Model::gpt(spec);
  auto dev = lockstep::make_cpu_device(0, 1);
  const int batch = 3, rows = batch * spec.context, classes = model.outputs() / spec.context;
  auto x = on_device(*dev, random_tokens(std::size_t(rows), spec.vocab_size, 60));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) labels[r] = (r * 11) % spec.vocab_size;
  auto y = on_device(*dev, labels);
  DeviceArray<lockstep::LossStats> stats(*dev, 1);
  lockstep::Replica fp32(*dev, model, batch, Precision::fp32);
  CHECK(fp32.dlogits_bf16() == nullptr);
  lockstep::Replica replica(*dev, model, batch, Precision::bf16);
  replica.load_parameters(model.initial_parameters(7));
  REQUIRE(replica.dlogits_bf16() != nullptr);
  // The fp32 gradient of the logits, rounded by backward itself...
  DeviceArray<float> dlogits(*dev, std::size_t(rows) * classes);
  dev->softmax_cross_entropy(replica.forward(x.data(), batch), y.data(), rows, classes,
                             dlogits.data(), 1.0f / rows, stats.data());
  replica.zero_grads();
  replica.backward(x.data(), dlogits.data(), batch);
  const std::vector<float> from_fp32 = replica.gradients();
  // ...and rounded by the loss as it writes it.
  dev->softmax_cross_entropy(replica.forward(x.data(), batch), y.data(), rows, classes,
                             replica.dlogits_bf16(), 1.0f / rows, stats.data());
  replica.zero_grads();
  replica.backward(x.data(), nullptr, batch);
  const std::vector<float> from_bf16 = replica.gradients();
  REQUIRE(from_bf16.size() == from_fp32.size());
  CHECK(std::memcmp(from_bf16.data(), from_fp32.data(), from_fp32.size() * sizeof(float)) == 0);
  // ...and by the fused classifier over the bf16 logits forward_bf16 leaves there, in place
  // (Note [Fused classifier]): the same loss and gradients, bit for bit.
  DeviceArray<lockstep::LossStats> unfused(*dev, 1), fused(*dev, 1);
  dev->softmax_cross_entropy(replica.forward(x.data(), batch), y.data(), rows, classes,
                             static_cast<float*>(nullptr), 0.0f, unfused.data());
  const std::uint16_t* logits16 = replica.forward_bf16(x.data(), batch);
  REQUIRE(logits16 == replica.dlogits_bf16());
  dev->softmax_cross_entropy(logits16, y.data(), rows, classes, replica.dlogits_bf16(),
                             1.0f / rows, fused.data());
  CHECK(fused.download()[0].loss_sum == unfused.download()[0].loss_sum);
  CHECK(fused.download()[0].correct == unfused.download()[0].correct);
  replica.zero_grads();
  replica.backward(x.data(), nullptr, batch);
  const std::vector<float> from_fused = replica.gradients();
  CHECK(std::memcmp(from_fused.data(), from_fp32.data(), from_fp32.size() * sizeof(float)) == 0);
  CHECK(fp32.forward_bf16(x.data(), batch) == nullptr);
  CHECK_THROWS_AS(fp32.backward(x.data(), nullptr, batch), std::invalid_argument);
}

// Under bf16 with out_bf16, the LM head writes its logits rounded to bf16, computed in fp32 a
// chunk of rows at a time (Note [Fused classifier]): bit for bit to_bf16 of the fp32 logits it
// writes without out_bf16. 300 positions: a full chunk and a part, with padding.
TEST_CASE("bf16 lm head: logits written in bf16 chunk by chunk are the fp32 logits rounded") {
  const int vocab = 70, t = 60, c = 16, batch = 5;  // padded to 128
  const auto layer = lockstep::make_tied_lm_head(0, vocab, t, c);
  auto dev = lockstep::make_cpu_device(0, 1);
  const auto params = random_floats(std::size_t(vocab) * c, 30);
  auto pd = on_device(*dev, params);
  auto xd = on_device(*dev, random_floats(std::size_t(batch) * t * c, 31, -2.0, 2.0));
  DeviceArray<std::uint16_t> p16(*dev, params.size());
  dev->to_bf16(pd.data(), p16.data(), params.size());
  DeviceArray<float> saved(*dev, layer->workspace_size(batch, Precision::bf16));
  DeviceArray<float> scratch(*dev, layer->scratch_size(batch, Precision::bf16));  // the chunk
  const std::size_t n = std::size_t(batch) * layer->out_features();
  DeviceArray<float> logits(*dev, n);
  DeviceArray<std::uint16_t> logits16(*dev, n), want(*dev, n);
  const lockstep::LayerWorkspace fp32_out{saved.data(), scratch.data(), Precision::bf16,
                                          p16.data()};
  layer->forward(*dev, pd.data(), xd.data(), logits.data(), batch, fp32_out);
  dev->to_bf16(logits.data(), want.data(), n);
  lockstep::LayerWorkspace bf16_out = fp32_out;
  bf16_out.out_bf16 = logits16.data();
  const std::vector<float> before = logits.download();
  layer->forward(*dev, pd.data(), xd.data(), logits.data(), batch, bf16_out);
  CHECK(logits16.download() == want.download());
  CHECK(logits.download() == before);  // out left alone
}
