// Finite-difference checking, shared by the layer tests.
//
// Objectives run on the CPU device in float and are summed in double. Derivatives are central
// differences over the step actually taken after float rounding, and must agree with the
// analytic gradient within abs_tol + rel_tol * |fd|.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common/random.hpp"
#include "lockstep/model.hpp"
#include "../random_data.hpp"

namespace lockstep::test {

using lockstep::Device;
using lockstep::DeviceArray;
using lockstep::Layer;

constexpr float kStep = 1e-2f;

// d objective() / d v[i], by central differences; v[i] is restored.
template <class Objective>
inline double central_difference(std::vector<float>& v, std::size_t i, const Objective& objective,
                                 float step = kStep) {
  const float v0 = v[i];
  v[i] = v0 + step;
  const double up = objective(), h_up = double(v[i]) - v0;
  v[i] = v0 - step;
  const double down = objective(), h_down = v0 - double(v[i]);
  v[i] = v0;
  return (up - down) / (h_up + h_down);
}

// Empty when every analytic[i] matches fd[i]; otherwise describes the first miss.
inline std::string mismatch(const std::vector<double>& fd, const std::vector<float>& analytic,
                     double abs_tol = 1e-4, double rel_tol = 5e-3) {
  if (fd.size() != analytic.size()) return "sizes differ";
  for (std::size_t i = 0; i < fd.size(); ++i)
    if (!(std::abs(analytic[i] - fd[i]) <= abs_tol + rel_tol * std::abs(fd[i]))) {
      std::ostringstream out;
      out << "element " << i << ": analytic " << analytic[i] << ", finite difference " << fd[i];
      return out.str();
    }
  return {};
}

struct LayerGradients {
  std::vector<float> params, input;    // analytic, from backward
  std::vector<double> fd_params, fd_input;
};

// Gradients of J(P, X) = sum(forward(P, X) * R) for a random R (batch, out_features). The
// parameter gradient buffer starts non-zero to check that backward accumulates into it. The
// layer's workspace and scratch are allocated; `input_grad` false skips the input (token ids).
// `frozen`: the layer's frozen parameters (LayerWorkspace::frozen), held fixed.
// `dropout_key`: LayerWorkspace::dropout_key, one mask for every call (0: none).
inline LayerGradients layer_gradients(const Layer& layer, int batch, std::vector<float> params,
                                      std::vector<float> x, std::uint64_t seed,
                                      bool input_grad = true,
                                      const std::vector<float>& frozen = {},
                                      std::uint64_t dropout_key = 0) {
  auto dev = lockstep::make_cpu_device(0, 1);
  DeviceArray<float> saved(*dev, layer.workspace_size(batch));
  DeviceArray<float> scratch(*dev, layer.scratch_size(batch));
  // The layer's constants (a Llama block's RoPE table), as a Replica uploads them.
  const auto table = layer.constants();
  DeviceArray<float> constants(*dev, table ? table->size() : 0);
  if (table) constants.upload(*table);
  lockstep::LayerWorkspace ws{saved.data(), scratch.data()};
  ws.constants = table ? constants.data() : nullptr;
  ws.dropout_key = dropout_key;  // a fixed mask: every forward and the backward draw the same
  DeviceArray<float> frozen_d(*dev, frozen.size());
  if (!frozen.empty()) {
    frozen_d.upload(frozen);
    ws.frozen = frozen_d.data();
  }
  const auto r = random_floats(std::size_t(batch) * layer.out_features(), seed);
  const auto g0 = random_floats(params.size(), seed + 1);
  auto pd = on_device(*dev, params), xd = on_device(*dev, x), rd = on_device(*dev, r);
  auto gd = on_device(*dev, g0);
  auto dxd = on_device(*dev, random_floats(x.size(), seed + 2));  // overwritten by backward
  DeviceArray<float> yd(*dev, r.size());
  const auto objective = [&] {
    pd.upload(params);
    xd.upload(x);
    layer.forward(*dev, pd.data(), xd.data(), yd.data(), batch, ws);
    const auto y = yd.download();
    double j = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) j += double(y[i]) * r[i];
    return j;
  };
  objective();
  layer.backward(*dev, pd.data(), gd.data(), xd.data(), yd.data(), rd.data(),
                 input_grad ? dxd.data() : nullptr, batch, ws);
  LayerGradients g{gd.download(), dxd.download(), {}, {}};
  for (std::size_t i = 0; i < params.size(); ++i) {
    g.params[i] -= g0[i];
    g.fd_params.push_back(central_difference(params, i, objective));
  }
  if (!input_grad) g.input.clear();
  for (std::size_t i = 0; input_grad && i < x.size(); ++i)
    g.fd_input.push_back(central_difference(x, i, objective));
  return g;
}

}  // namespace lockstep::test
