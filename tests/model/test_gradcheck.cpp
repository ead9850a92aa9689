// Finite-difference checks of every layer's backward, of the loss gradient and of a whole MLP
// through a Replica; and the model's parameter layout.
//
// Objectives run on the CPU device in float and are summed in double. Derivatives are central
// differences over the step actually taken after float rounding, and must agree with the
// analytic gradient within abs_tol + rel_tol * |fd|.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/random.hpp"
#include "lockstep/model.hpp"
#include "gradcheck.hpp"

namespace {

using lockstep::Activation;
using lockstep::Device;
using lockstep::DeviceArray;
using lockstep::Layer;
using lockstep::Model;
using namespace lockstep::test;

void check_activation(Activation f, std::vector<float> x, int batch) {
  const auto layer = lockstep::make_activation(f, static_cast<int>(x.size()) / batch);
  const auto g = layer_gradients(*layer, batch, {}, std::move(x), 7);
  CHECK(g.params.empty());
  const std::string miss = mismatch(g.fd_input, g.input);
  CHECK_MESSAGE(miss.empty(), miss);
}

// Mean cross-entropy of a 2-hidden-layer MLP: replica.gradients() against finite differences
// of every parameter; also checks the order of the grads_ready calls.
void check_mlp(Activation f) {
  CAPTURE(int(f));
  const Model model = Model::mlp({.inputs = 6, .hidden = {8, 7}, .classes = 4, .activation = f});
  auto dev = lockstep::make_cpu_device(0, 2);
  const int batch = 5;
  lockstep::Replica replica(*dev, model, /*max_batch=*/8);
  std::vector<float> params = model.initial_parameters(3);
  for (float& p : params) p *= 2.0f;  // larger weights: more curvature for the check to see
  auto xd = on_device(*dev, random_floats(std::size_t(batch) * 6, 11, -2.0, 2.0));
  auto yd = on_device(*dev, random_labels(batch, 4, 12));
  DeviceArray<float> dlogits(*dev, std::size_t(batch) * 4);
  const auto loss = [&](float* grad) {
    replica.load_parameters(params);
    const float* logits = replica.forward(xd.data(), batch);
    return dev->softmax_cross_entropy(logits, yd.data(), batch, 4, grad, 1.0f / batch).loss_sum /
           batch;
  };
  replica.zero_grads();
  loss(dlogits.data());
  std::vector<std::size_t> ready;
  replica.backward(xd.data(), dlogits.data(), batch, [&](std::size_t i) { ready.push_back(i); });
  CHECK(ready == std::vector<std::size_t>{4, 2, 0});
  const auto analytic = replica.gradients();
  std::vector<double> fd;
  for (std::size_t i = 0; i < params.size(); ++i)
    fd.push_back(central_difference(params, i, [&] { return loss(nullptr); }));
  const std::string miss = mismatch(fd, analytic);
  CHECK_MESSAGE(miss.empty(), miss);
}

}  // namespace

TEST_SUITE("gradcheck") {
  TEST_CASE("linear: weight, bias and input - and the check can fail") {
    const int in = 5, out = 4, batch = 3;
    const auto layer = lockstep::make_linear(in, out);
    const auto g = layer_gradients(*layer, batch, random_floats(layer->param_count(), 1),
                                   random_floats(std::size_t(batch) * in, 2), 3);
    std::string miss = mismatch(g.fd_params, g.params);
    CHECK_MESSAGE(miss.empty(), miss);
    miss = mismatch(g.fd_input, g.input);
    CHECK_MESSAGE(miss.empty(), miss);

    // A 5% error in the largest weight gradient, or a missing bias gradient, must be caught.
    auto wrong = g.params;
    const auto by_magnitude = [](double a, double b) { return std::abs(a) < std::abs(b); };
    const auto largest = std::max_element(g.fd_params.begin(), g.fd_params.end(), by_magnitude);
    wrong[largest - g.fd_params.begin()] *= 1.05f;
    CHECK_FALSE(mismatch(g.fd_params, wrong).empty());
    wrong = g.params;
    std::fill(wrong.end() - out, wrong.end(), 0.0f);
    CHECK_FALSE(mismatch(g.fd_params, wrong).empty());
  }

  TEST_CASE("relu, away from the kink") {
    auto x = random_floats(24, 4, 0.1, 1.0);
    std::uint64_t s = 5;
    for (float& v : x) v = lockstep::detail::splitmix64(s) & 1 ? -v : v;
    check_activation(Activation::relu, std::move(x), 3);
  }

  TEST_CASE("gelu") { check_activation(Activation::gelu, random_floats(24, 6, -3.0, 3.0), 4); }

  TEST_CASE("tanh") { check_activation(Activation::tanh, random_floats(24, 8, -2.0, 2.0), 2); }

  TEST_CASE("softmax cross-entropy w.r.t. the logits") {
    auto dev = lockstep::make_cpu_device(0, 1);
    const int rows = 4, classes = 5;
    const float scale = 0.5f;
    auto logits = random_floats(std::size_t(rows) * classes, 9, -3.0, 3.0);
    auto ld = on_device(*dev, logits);
    auto yd = on_device(*dev, random_labels(rows, classes, 10));
    DeviceArray<float> dd(*dev, logits.size());
    dev->softmax_cross_entropy(ld.data(), yd.data(), rows, classes, dd.data(), scale);
    const auto objective = [&] {
      ld.upload(logits);
      return scale * dev->softmax_cross_entropy(ld.data(), yd.data(), rows, classes, nullptr, 0)
                         .loss_sum;
    };
    std::vector<double> fd;
    for (std::size_t i = 0; i < logits.size(); ++i)
      fd.push_back(central_difference(logits, i, objective));
    const std::string miss = mismatch(fd, dd.download());
    CHECK_MESSAGE(miss.empty(), miss);
  }

  // J = sum(y * R) + sum(s * S) with s = a + b and y = LayerNorm(s), the residual LayerNorm of
  // a GPT block: dJ/da = dJ/db = S + LayerNorm's input gradient from R, which is what
  // residual_layernorm_backward writes with dresidual = S (Note [Residual LayerNorm]).
  TEST_CASE("residual LayerNorm: both addends, weight and bias") {
    auto dev = lockstep::make_cpu_device(0, 1);
    const int rows = 3, C = 5;
    const std::size_t n = std::size_t(rows) * C;
    std::vector<float> a = random_floats(n, 81, -2.0, 2.0), b = random_floats(n, 82, -1.0, 1.0);
    std::vector<float> w = random_floats(C, 83, 0.5, 1.5), bias = random_floats(C, 84);
    const std::vector<float> r = random_floats(n, 85), s = random_floats(n, 86);
    DeviceArray<float> ad(*dev, n), bd(*dev, n), wd(*dev, C), biasd(*dev, C), sum(*dev, n),
        y(*dev, n), mean(*dev, rows), rstd(*dev, rows);
    const auto objective = [&] {
      ad.upload(a), bd.upload(b), wd.upload(w), biasd.upload(bias);
      dev->residual_layernorm_forward(ad.data(), bd.data(), sum.data(), wd.data(), biasd.data(),
                                      y.data(), mean.data(), rstd.data(), rows, C);
      const std::vector<float> yv = y.download(), sv = sum.download();
      double j = 0.0;
      for (std::size_t i = 0; i < n; ++i) j += double(yv[i]) * r[i] + double(sv[i]) * s[i];
      return j;
    };
    objective();
    auto rd = on_device(*dev, r), sd = on_device(*dev, s);
    DeviceArray<float> dx(*dev, n), dw(*dev, C), db(*dev, C);
    dev->residual_layernorm_backward(sum.data(), wd.data(), mean.data(), rstd.data(), rd.data(),
                                     sd.data(), dx.data(), nullptr, dw.data(), db.data(), rows, C);
    for (std::vector<float>* v : {&a, &b}) {
      std::vector<double> fd;
      for (std::size_t i = 0; i < n; ++i) fd.push_back(central_difference(*v, i, objective));
      const std::string miss = mismatch(fd, dx.download());
      CHECK_MESSAGE(miss.empty(), miss);
    }
    for (auto [v, analytic] : {std::pair{&w, &dw}, {&bias, &db}}) {
      std::vector<double> fd;
      for (std::size_t i = 0; i < std::size_t(C); ++i)
        fd.push_back(central_difference(*v, i, objective));
      const std::string miss = mismatch(fd, analytic->download());
      CHECK_MESSAGE(miss.empty(), miss);
    }
  }

  TEST_CASE("a 2-hidden-layer MLP through a Replica") {
    check_mlp(Activation::gelu);
    check_mlp(Activation::tanh);
  }
}

TEST_SUITE("model") {
  TEST_CASE("layout: reversed offsets, torch names, counts") {
    const Model model = Model::mlp({.inputs = 3, .hidden = {4, 5}, .classes = 2});
    REQUIRE(model.layers().size() == 5);
    CHECK(model.param_count() == 16 + 25 + 12);
    CHECK(model.param_offset(4) == 0);
    CHECK(model.param_offset(2) == 12);
    CHECK(model.param_offset(0) == 12 + 25);
    CHECK(model.inputs() == 3);
    CHECK(model.outputs() == 2);
    CHECK(model.max_width() == 5);

    const auto tensors = model.param_tensors();
    REQUIRE(tensors.size() == 6);
    CHECK(tensors[0].name == "layers.0.weight");
    CHECK(tensors[0].offset == 37);
    CHECK(tensors[0].shape == std::vector<std::int64_t>{4, 3});
    CHECK(tensors[1].name == "layers.0.bias");
    CHECK(tensors[1].offset == 49);
    CHECK(tensors[4].name == "layers.4.weight");
    CHECK(tensors[4].offset == 0);
    CHECK(tensors[5].name == "layers.4.bias");
    CHECK(tensors[5].shape == std::vector<std::int64_t>{2});
    std::size_t total = 0;
    for (const auto& t : tensors) total += t.numel();
    CHECK(total == model.param_count());
  }

  TEST_CASE("initial_parameters depend on the seed alone, layers drawn in forward order") {
    const lockstep::MlpSpec spec{.inputs = 3, .hidden = {4}, .classes = 2};
    const Model a = Model::mlp(spec), b = Model::mlp(spec);
    const auto p = a.initial_parameters(7);
    CHECK(p == b.initial_parameters(7));
    CHECK(p != a.initial_parameters(8));
    // The first draw is layers.0.weight[0, 0], stored after the last layer's 10 parameters.
    std::uint64_t rng = 7;
    const double first = (2.0 * lockstep::detail::uniform01(rng) - 1.0) / std::sqrt(3.0);
    CHECK(p[a.param_offset(0)] == static_cast<float>(first));
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double bound = 1.0 / std::sqrt(i < a.param_offset(0) ? 4.0 : 3.0);
      CHECK(std::abs(p[i]) <= bound);
    }
  }

  TEST_CASE("bad shapes and sizes are rejected") {
    std::vector<std::unique_ptr<Layer>> layers;
    layers.push_back(lockstep::make_linear(3, 4));
    layers.push_back(lockstep::make_linear(5, 2));
    CHECK_THROWS_AS(Model(std::move(layers)), std::invalid_argument);
    CHECK_THROWS_AS(Model::mlp({.inputs = 0, .hidden = {}, .classes = 2}), std::invalid_argument);
    CHECK_THROWS_AS(Model::mlp({.inputs = 2, .hidden = {}, .classes = 0}), std::invalid_argument);
    CHECK_THROWS_AS(Model::mlp({.inputs = 2, .hidden = {3, 0}, .classes = 2}),
                    std::invalid_argument);

    auto dev = lockstep::make_cpu_device(0, 1);
    const Model model = Model::mlp({.inputs = 2, .hidden = {3}, .classes = 2});
    lockstep::Replica replica(*dev, model, 4);
    CHECK_THROWS_AS(replica.load_parameters(std::vector<float>(model.param_count() + 1)),
                    std::invalid_argument);
    DeviceArray<float> x(*dev, 10);
    CHECK_THROWS_AS(replica.forward(x.data(), 5), std::invalid_argument);
    replica.load_parameters(model.initial_parameters(1));
    CHECK(replica.parameters() == model.initial_parameters(1));
  }
}
