// Device::linear_forward and linear_backward on random inputs, in every storage and activation,
// as the op or as the composition of plain ops the layers ran before it (Note [Fused linear] in
// lockstep/device.hpp). Shared by the CPU test (op against composition, bit for bit) and the
// CUDA test (the GPU's op against the CPU's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/bf16.hpp"
#include "random_data.hpp"

namespace lockstep::test {

using LinearOutputs = std::vector<std::vector<float>>;

// One variant: the products' inputs in bf16 (else fp32), the forward's output (and pre) in
// bf16, GELU fused (forward: after the map; backward: before it).
struct LinearVariant {
  bool bf16_in = false;
  bool bf16_out = false;
  bool gelu = false;
  std::string name() const {
    return std::string(bf16_in ? "bf16" : "fp32") + (bf16_out ? "->bf16" : "->fp32") +
           (gelu ? " gelu" : "");
  }
};

// The variants the layers use, and the bf16-in, fp32-out one with GELU.
inline std::vector<LinearVariant> linear_variants() {
  std::vector<LinearVariant> out;
  for (bool gelu : {false, true}) {
    out.push_back({false, false, gelu});
    out.push_back({true, false, gelu});
    out.push_back({true, true, gelu});
  }
  return out;
}

// x (rows, in), weight (out, in), bias (out), dy (rows, out); pre (rows, in), the pre-activation
// of x for the backward's GELU; starting gradients, to show they are accumulated into.
struct LinearCase {
  int rows, in, out;
  std::vector<float> x, weight, bias, dy, pre, dweight, dbias, dbias_pre;
  LinearCase(int r, int i, int o, std::uint64_t seed)
      : rows(r), in(i), out(o),
        x(random_floats(std::size_t(r) * i, seed, -2.0, 2.0)),
        weight(random_floats(std::size_t(o) * i, seed + 1, -0.5, 0.5)),
        bias(random_floats(std::size_t(o), seed + 2)),
        dy(random_floats(std::size_t(r) * o, seed + 3)),
        pre(random_floats(std::size_t(r) * i, seed + 4, -4.0, 4.0)),
        dweight(random_floats(std::size_t(o) * i, seed + 5)),
        dbias(random_floats(std::size_t(o), seed + 6)),
        dbias_pre(random_floats(std::size_t(i), seed + 7)) {}
};

// A matrix on the device in fp32 or as bf16 bits (rounded on the host), and its download.
struct Matrix {
  DeviceArray<float> f32;
  DeviceArray<std::uint16_t> bf16;
  Matrix(Device& dev, const std::vector<float>& host, bool in_bf16) {
    if (in_bf16)
      bf16 = on_device(dev, to_bits(host));
    else
      f32 = on_device(dev, host);
  }
  MatIn in() const { return {f32.data(), bf16.data()}; }
  MatOut out() { return {f32.data(), bf16.data()}; }
  std::vector<float> values() const {
    return bf16.size() ? widened(bf16.download()) : f32.download();
  }
};

// The forward's y and, with GELU, pre: through Device::linear_forward when `op`, else through
// the plain ops in the order the layers called them before.
inline LinearOutputs run_linear_forward(Device& dev, const LinearCase& c, LinearVariant v,
                                        bool op) {
  const std::size_t n = std::size_t(c.rows) * c.out;
  const std::vector<float> nan(n, std::numeric_limits<float>::quiet_NaN());
  Matrix x(dev, c.x, v.bf16_in), w(dev, c.weight, v.bf16_in), y(dev, nan, v.bf16_out),
      pre(dev, nan, v.bf16_out);
  // The bias in y's storage (LinearForward::bias).
  Matrix bias(dev, c.bias, v.bf16_out);
  DeviceArray<float> product = on_device(dev, nan);
  if (op) {
    dev.linear_forward({.rows = c.rows, .in = c.in, .out = c.out, .x = x.in(), .weight = w.in(),
                        .bias = bias.in(),
                        .act = v.gelu ? FusedActivation::gelu : FusedActivation::none,
                        .pre = v.gelu ? pre.out() : MatOut{}, .y = y.out(),
                        .product = product.data()});
  } else {
    Matrix& sum = v.gelu ? pre : y;
    float* into = v.bf16_out ? product.data() : sum.f32.data();
    if (v.bf16_in)
      dev.gemm_bf16(Transpose::no, Transpose::yes, c.rows, c.out, c.in, 1.0f, x.bf16.data(), c.in,
                    w.bf16.data(), c.in, 0.0f, into, c.out);
    else
      dev.gemm(Transpose::no, Transpose::yes, c.rows, c.out, c.in, 1.0f, x.f32.data(), c.in,
               w.f32.data(), c.in, 0.0f, into, c.out);
    if (v.bf16_out)
      dev.add_bias(into, bias.bf16.data(), sum.bf16.data(), c.rows, c.out);
    else
      dev.add_bias(into, bias.f32.data(), c.rows, c.out);
    if (v.gelu && v.bf16_out)
      dev.activation_forward(Activation::gelu, pre.bf16.data(), y.bf16.data(), n);
    else if (v.gelu)
      dev.activation_forward(Activation::gelu, pre.f32.data(), y.f32.data(), n);
  }
  LinearOutputs outputs{y.values()};
  if (v.gelu) outputs.push_back(pre.values());
  return outputs;
}

// The backward's dweight, dbias, dx (fp32; left out when `with_dx32` is false), dx rounded
// (bf16 in) and, with GELU, dbias_pre. pre is kept in the products' storage, dy rounded for
// bf16 products on the host.
inline LinearOutputs run_linear_backward(Device& dev, const LinearCase& c, LinearVariant v,
                                         bool op, bool with_dx32) {
  const std::size_t n = std::size_t(c.rows) * c.in;
  const bool bf16 = v.bf16_in;
  Matrix x(dev, c.x, bf16), w(dev, c.weight, bf16), g(dev, c.dy, bf16), pre(dev, c.pre, bf16);
  DeviceArray<float> dy = on_device(dev, c.dy), dw = on_device(dev, c.dweight),
                     db = on_device(dev, c.dbias), dbp = on_device(dev, c.dbias_pre),
                     dx = on_device(dev, std::vector<float>(n, 7.0f));
  // NaN, so that an element never written fails.
  DeviceArray<std::uint16_t> dx16 =
      on_device(dev, std::vector<std::uint16_t>(bf16 ? n : 0, detail::kBf16QuietNan));
  if (op) {
    dev.linear_backward({.rows = c.rows, .in = c.in, .out = c.out, .x = x.in(), .weight = w.in(),
                         .dy = dy.data(), .g = bf16 ? g.in() : MatIn{dy.data(), nullptr},
                         .dweight = dw.data(), .dbias = db.data(), .dx = dx.data(),
                         .act = v.gelu ? FusedActivation::gelu : FusedActivation::none,
                         .pre = v.gelu ? pre.in() : MatIn{}, .dx_bf16 = dx16.data(),
                         .dbias_pre = v.gelu ? dbp.data() : nullptr});
  } else {
    if (bf16) {
      dev.gemm_bf16(Transpose::yes, Transpose::no, c.out, c.in, c.rows, 1.0f, g.bf16.data(),
                    c.out, x.bf16.data(), c.in, 1.0f, dw.data(), c.in);
      dev.bias_grad(db.data(), dy.data(), c.rows, c.out);
      dev.gemm_bf16(Transpose::no, Transpose::no, c.rows, c.in, c.out, 1.0f, g.bf16.data(), c.out,
                    w.bf16.data(), c.in, 0.0f, dx.data(), c.in);
    } else {
      dev.gemm(Transpose::yes, Transpose::no, c.out, c.in, c.rows, 1.0f, dy.data(), c.out,
               x.f32.data(), c.in, 1.0f, dw.data(), c.in);
      dev.bias_grad(db.data(), dy.data(), c.rows, c.out);
      dev.gemm(Transpose::no, Transpose::no, c.rows, c.in, c.out, 1.0f, dy.data(), c.out,
               w.f32.data(), c.in, 0.0f, dx.data(), c.in);
    }
    if (v.gelu && bf16)
      dev.activation_backward(Activation::gelu, pre.bf16.data(), dx.data(), dx.data(),
                              dx16.data(), n);
    else if (v.gelu)
      dev.activation_backward(Activation::gelu, pre.f32.data(), dx.data(), dx.data(), n);
    if (v.gelu) dev.bias_grad(dbp.data(), dx.data(), c.rows, c.in);
    if (!v.gelu && bf16) dev.to_bf16(dx.data(), dx16.data(), n);
  }
  LinearOutputs outputs{dw.download(), db.download()};
  if (with_dx32) outputs.push_back(dx.download());
  if (bf16) outputs.push_back(widened(dx16.download()));
  if (v.gelu) outputs.push_back(dbp.download());
  return outputs;
}

}  // namespace lockstep::test
