// The element-wise math both backends share (common/elementwise_math.hpp), one function at a
// time against double-precision formulas and closed forms. The CPU device and the CUDA kernels
// both call these functions, so this pins down what each computes per element.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "../compare.hpp"
#include "common/elementwise_math.hpp"

namespace {

namespace math = lockstep::detail;
namespace test = lockstep::test;

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

double gelu_exact(double x) {
  return 0.5 * x * (1.0 + std::tanh(kGeluC * (x + kGeluA * x * x * x)));
}

double gelu_grad_exact(double x) {
  const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kGeluC * (1.0 + 3.0 * kGeluA * x * x);
}

}  // namespace

TEST_SUITE("elementwise math") {
  TEST_CASE("exp_poly is within 1e-7 relative of exp over the float range it covers") {
    double worst = 0.0;
    for (int i = -800000; i <= 800000; ++i) {
      const float x = static_cast<float>(i) * 1e-4f;
      const double want = std::exp(static_cast<double>(x));
      worst = test::worse(worst, std::abs(math::exp_poly(x) - want) / want);
    }
    CHECK(worst < 1e-7);
    CHECK(math::exp_poly(0.0f) == 1.0f);
    CHECK(math::exp_poly(-1000.0f) == math::exp_poly(-87.0f));  // clamped, still a normal float
    CHECK(std::isnormal(math::exp_poly(-1000.0f)));
  }

  TEST_CASE("gelu and its derivative against the formula in double") {
    double worst = 0.0, worst_grad = 0.0;
    for (int i = -100000; i <= 100000; ++i) {
      const float x = static_cast<float>(i) * 1e-4f;  // [-10, 10]
      const double scale = std::max(1.0, std::abs(double(x)));
      worst = test::worse(worst, std::abs(math::gelu(x) - gelu_exact(x)) / scale);
      worst_grad = test::worse(worst_grad, std::abs(math::gelu_grad(x) - gelu_grad_exact(x)));
    }
    CAPTURE(worst);
    CAPTURE(worst_grad);
    CHECK(worst < 1e-6);
    CHECK(worst_grad < 1e-6);
    // Far out: gelu(x) = x and (nearly) 0, gelu'(x) = 1.
    CHECK(math::gelu(30.0f) == 30.0f);
    CHECK(std::abs(math::gelu(-30.0f)) < 1e-30f);
    CHECK(math::gelu_grad(30.0f) == 1.0f);
  }

  TEST_CASE("relu and tanh and their derivatives") {
    CHECK(math::relu(2.5f) == 2.5f);
    CHECK(math::relu(-2.5f) == 0.0f);
    CHECK(math::relu_grad(0.0f) == 0.0f);  // the subgradient both backends use at 0
    CHECK(math::relu_grad(1e-30f) == 1.0f);
    // tanh against (e^2x - 1) / (e^2x + 1) in double, within 2 ulps; odd; 0 at 0.
    CHECK(math::tanh_act(0.0f) == 0.0f);
    for (float x : {-3.0f, -0.5f, 0.25f, 4.0f, 1e-3f}) {
      CAPTURE(x);
      const double e = std::exp(2.0 * double(x)), t = (e - 1.0) / (e + 1.0);
      const float got = math::tanh_act(x);
      const double ulp = std::abs(std::nextafter(float(t), 2.0f) - float(t));
      CHECK(std::abs(double(got) - t) <= 2.0 * ulp);
      CHECK(math::tanh_act(-x) == -got);
      CHECK(math::tanh_grad(x) == doctest::Approx(1.0 - t * t).epsilon(1e-6));
    }
  }

  TEST_CASE("sgd_update: plain, weight decay, momentum and Nesterov, one step") {
    float p[1], g[1] = {0.5f}, buf[1];
    const auto step = [&](math::SgdScalars s, float p0, float buf0) {
      p[0] = p0;
      buf[0] = buf0;
      math::sgd_update(s, 1.0f, p, g, s.momentum != 0.0f ? buf : nullptr, 0);
    };
    step({0.1f, 0.0f, 0.0f, false}, 1.0f, 0.0f);
    CHECK(p[0] == doctest::Approx(1.0 - 0.1 * 0.5));
    step({0.1f, 0.0f, 0.2f, false}, 1.0f, 0.0f);  // g = 0.5 + 0.2 * 1
    CHECK(p[0] == doctest::Approx(1.0 - 0.1 * 0.7));
    step({0.1f, 0.9f, 0.0f, false}, 1.0f, 2.0f);  // buf = 0.9 * 2 + 0.5
    CHECK(buf[0] == doctest::Approx(2.3));
    CHECK(p[0] == doctest::Approx(1.0 - 0.1 * 2.3));
    step({0.1f, 0.9f, 0.0f, true}, 1.0f, 2.0f);  // g = 0.5 + 0.9 * 2.3
    CHECK(buf[0] == doctest::Approx(2.3));
    CHECK(p[0] == doctest::Approx(1.0 - 0.1 * (0.5 + 0.9 * 2.3)));
  }

  TEST_CASE("adamw: the scalars in double, and the first step from zero moments") {
    const float lr = 1e-3f, wd = 0.1f;
    const math::AdamWScalars s = math::adamw_scalars(0.9f, 0.999f, 1e-8f, wd, lr, 1);
    // At t = 1: lr / (1 - 0.9) = 0.01, sqrt(1 - 0.999) = sqrt(0.001), 1 - 1e-3 * 0.1 = 0.9999
    // (up to the floats 0.9, 0.999, 1e-3 and 0.1 are).
    CHECK(s.step_size == doctest::Approx(0.01).epsilon(1e-6));
    CHECK(s.bc2_sqrt == doctest::Approx(0.0316227766).epsilon(1e-5));
    CHECK(s.decay == doctest::Approx(0.9999).epsilon(1e-7));
    // At t = 1 from m = v = 0 the bias-corrected moments are g and g^2:
    // p = p (1 - lr wd) - lr g / (|g| + eps).
    for (float grad : {0.5f, -2.0f, 1e-3f}) {
      CAPTURE(grad);
      float p[1] = {1.5f}, g[1] = {grad}, m[1] = {0.0f}, v[1] = {0.0f};
      math::adamw_update(s, 1.0f, p, g, m, v, 0);
      const double want = 1.5 * (1.0 - 1e-4) - 1e-3 * grad / (std::abs(grad) + 1e-8);
      CHECK(p[0] == doctest::Approx(want).epsilon(1e-6));
      CHECK(m[0] == doctest::Approx(0.1 * grad).epsilon(1e-6));
      CHECK(v[0] == doctest::Approx(0.001 * grad * grad).epsilon(1e-5));
    }
    // Later steps: bias correction 1 - beta^t.
    const math::AdamWScalars s3 = math::adamw_scalars(0.9f, 0.999f, 1e-8f, 0.0f, lr, 3);
    CHECK(s3.step_size == doctest::Approx(1e-3 / (1.0 - std::pow(0.9, 3))).epsilon(1e-6));
    CHECK(s3.decay == 1.0f);
  }
}
