// The adapters' gradients of a whole LoRA model through a Replica, by finite differences, for
// tests/model/test_lora.cpp (Llama blocks) and test_gpt_lora.cpp (GPT-2's).
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../compare.hpp"
#include "gradcheck.hpp"
#include "lockstep/model.hpp"

namespace lockstep::test {

// `model`'s adapters at random values on a frozen base scaled by `base_scale` (attention far
// from uniform): backward's gradients equal the central differences of the mean loss, and
// nothing writes the base.
inline void check_lora_model_gradients(const Model& model, const GptSpec& spec,
                                       float base_scale) {
  auto dev = make_cpu_device(0, 2);
  const int batch = 2, t = spec.context, v = spec.vocab_size;
  Replica replica(*dev, model, batch);
  std::vector<float> adapters = random_floats(model.param_count(), 21, -0.3, 0.3);
  std::vector<float> base = model.initial_frozen(3);
  for (float& p : base) p *= base_scale;
  replica.load_frozen(base);
  auto xd = on_device(*dev, random_tokens(std::size_t(batch) * t, v, 16));
  auto yd = on_device(*dev, random_labels(std::size_t(batch) * t, v, 17));
  const int padded = model.outputs() / t, rows = batch * t;
  DeviceArray<float> dlogits(*dev, std::size_t(rows) * padded);
  const auto loss = [&](float* grad) {
    replica.load_parameters(adapters);
    const float* y = replica.forward(xd.data(), batch);
    return dev->softmax_cross_entropy(y, yd.data(), rows, padded, grad, 1.0f / rows).loss_sum /
           rows;
  };
  replica.zero_grads();
  loss(dlogits.data());
  replica.backward(xd.data(), dlogits.data(), batch);
  const auto analytic = replica.gradients();
  REQUIRE(analytic.size() == model.param_count());
  std::vector<double> fd;
  for (std::size_t i = 0; i < adapters.size(); ++i)
    fd.push_back(central_difference(adapters, i, [&] { return loss(nullptr); }, 1e-3f));
  const std::string miss = mismatch(fd, analytic);
  CHECK_MESSAGE(miss.empty(), miss);
  CHECK(replica.frozen() == base);  // bit for bit: nothing wrote the base
}

}  // namespace lockstep::test
