// The adapters' gradients of a whole LoRA model through a Replica, by finite differences, and a
// LoRA block's run in fp32 or bf16, for tests/model/test_lora.cpp (Llama blocks) and
// test_gpt_lora.cpp (GPT-2's).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../compare.hpp"
#include "common/bf16.hpp"
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

// LoRA under trainer.precision bf16 (Note [Frozen parameters] in src/model/lora.cpp): the base
// held as bf16 bits only, the adapters as any bf16 parameter (fp32 master, bf16 copy).
inline std::vector<float> rounded_to_bf16(std::vector<float> v) {
  for (float& x : v) x = detail::round_to_bf16(x);
  return v;
}

struct BlockRun {
  std::vector<float> y, dadapters, dx;
};

// A LoRA block's forward then backward of dout in `precision`, the adapters' gradients from
// zero. fp32: the base from `frozen`; bf16: from its bf16 rounding alone (ws.frozen null), the
// adapters' products reading their bf16 copy, as a Replica hands them over.
inline BlockRun run_block(const Layer& layer, Precision precision, int batch,
                          const std::vector<float>& adapters, const std::vector<float>& frozen,
                          const std::vector<float>& x, const std::vector<float>& dout,
                          std::uint64_t dropout_key = 0) {
  const bool bf16 = precision == Precision::bf16;
  auto dev = make_cpu_device(0, 1);
  DeviceArray<float> saved(*dev, layer.workspace_size(batch, precision));
  DeviceArray<float> scratch(*dev, layer.scratch_size(batch, precision));
  const auto table = layer.constants();
  auto constants = on_device(*dev, table ? *table : std::vector<float>{});
  auto pd = on_device(*dev, adapters), fd = on_device(*dev, frozen);
  DeviceArray<std::uint16_t> p16(*dev, bf16 ? adapters.size() : 0);
  DeviceArray<std::uint16_t> f16(*dev, bf16 ? frozen.size() : 0);
  if (bf16) {
    dev->to_bf16(pd.data(), p16.data(), adapters.size());
    dev->to_bf16(fd.data(), f16.data(), frozen.size());
  }
  const LayerWorkspace ws{.saved = saved.data(), .scratch = scratch.data(),
                          .precision = precision, .params_bf16 = p16.data(),
                          .constants = constants.data(), .frozen = bf16 ? nullptr : fd.data(),
                          .frozen_bf16 = f16.data(), .dropout_key = dropout_key};
  auto xd = on_device(*dev, x), dyd = on_device(*dev, dout);
  auto gd = on_device(*dev, std::vector<float>(adapters.size(), 0.0f));
  DeviceArray<float> yd(*dev, dout.size()), dxd(*dev, x.size());
  layer.forward(*dev, pd.data(), xd.data(), yd.data(), batch, ws);
  layer.backward(*dev, pd.data(), gd.data(), xd.data(), yd.data(), dyd.data(), dxd.data(), batch,
                 ws);
  return {yd.download(), gd.download(), dxd.download()};
}

// A LoRA block (batch 2 of `sample` floats each) under bf16 against fp32 on the same values:
// random adapters, and a random base already rounded, so that only the bf16 products and
// roundings differ; output, adapters' and input's gradients within 2e-2 of the norms, and not
// equal (as the repo's bf16 layers are checked, tests/model/test_bf16_layers.cpp).
inline void check_block_bf16(const Layer& layer, std::size_t sample, std::uint64_t dropout_key) {
  const auto adapters = random_floats(layer.param_count(), 61, -0.5, 0.5);
  const auto base = rounded_to_bf16(random_floats(layer.frozen_count(), 62, -0.5, 0.5));
  const int batch = 2;
  const auto x = random_floats(std::size_t(batch) * sample, 63, -2, 2);
  const auto dout = random_floats(x.size(), 64);
  const BlockRun f =
      run_block(layer, Precision::fp32, batch, adapters, base, x, dout, dropout_key);
  const BlockRun b =
      run_block(layer, Precision::bf16, batch, adapters, base, x, dout, dropout_key);
  const double ey = relative_error(b.y, f.y), ea = relative_error(b.dadapters, f.dadapters),
               ex = relative_error(b.dx, f.dx);
  CAPTURE(ey);
  CAPTURE(ea);
  CAPTURE(ex);
  CHECK(ey < 2e-2);
  CHECK(ea < 2e-2);
  CHECK(ex < 2e-2);
  CHECK(ey > 0.0);
  CHECK(ea > 0.0);
  CHECK(ex > 0.0);
}

// The logits of `model` at `params` (and `frozen`) on 2 sequences of fixed tokens below `vocab`.
// `dropout_key`: Replica::set_dropout_key's (0: none).
inline std::vector<float> lora_logits(const Model& model, int vocab,
                                      const std::vector<float>& params,
                                      const std::vector<float>& frozen,
                                      std::uint64_t dropout_key = 0) {
  auto dev = make_cpu_device(0, 1);
  Replica replica(*dev, model, 2);
  replica.load_parameters(params);
  if (!frozen.empty()) replica.load_frozen(frozen);
  replica.set_dropout_key(dropout_key);
  const auto x = on_device(*dev, random_tokens(2 * std::size_t(model.inputs()), vocab, 9));
  const float* y = replica.forward(x.data(), 2);
  std::vector<float> out(std::size_t(2) * model.outputs());
  dev->copy_to_host(out.data(), y, out.size() * sizeof(float));
  return out;
}

// The base of `lora` (`full` with adapters) is `full`'s parameters: the same tensors at the same
// offsets, the same initial values.
inline void check_base_layout(const Model& full, const Model& lora) {
  const auto base = lora.frozen_tensors(), mine = full.param_tensors();
  REQUIRE(base.size() == mine.size());
  for (std::size_t i = 0; i < base.size(); ++i) {
    CHECK(base[i].name == mine[i].name);
    CHECK(base[i].offset == mine[i].offset);
  }
  CHECK(lora.initial_frozen(5) == full.initial_parameters(5));
}

// `lora` (`full` with `spec`'s adapters) at B = 0 is `full` bit for bit; with random adapters,
// `full` with merge_lora's weights gives its logits within 1e-5.
inline void check_lora_merge(const Model& full, const Model& lora, const LoraSpec& spec,
                             int vocab) {
  const auto base = lora.initial_frozen(8);
  CHECK(lora_logits(lora, vocab, lora.initial_parameters(8), base) ==
        lora_logits(full, vocab, base, {}));
  const auto adapters = random_floats(lora.param_count(), 31, -0.5, 0.5);
  const auto merged = merge_lora(lora, spec, adapters, base);
  const auto a = lora_logits(lora, vocab, adapters, base), b = lora_logits(full, vocab, merged, {});
  REQUIRE(a.size() == b.size());
  // The padded vocabulary's logits are -inf on both sides (Note [Padded vocabulary]); every
  // other logit is finite and within 1e-5.
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) && b[i] < 0) {
      CHECK(a[i] == b[i]);
    } else {
      REQUIRE(std::isfinite(a[i]));
      CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5));
    }
  }
}

struct ModelRun {
  std::vector<float> logits, grads, frozen;
};

// A LoRA model's forward, mean cross-entropy over `labels` and backward through a Replica in
// `precision` (batch sequences of `tokens`): its logits, the adapters' gradients and the frozen
// base as the replica holds it after.
inline ModelRun run_model(const Model& model, Precision precision, int batch,
                          const std::vector<float>& adapters, const std::vector<float>& frozen,
                          const std::vector<float>& tokens, const std::vector<std::int32_t>& labels) {
  auto dev = make_cpu_device(0, 1);
  Replica replica(*dev, model, batch, precision);
  replica.load_parameters(adapters);
  replica.load_frozen(frozen);
  auto xd = on_device(*dev, tokens);
  auto yd = on_device(*dev, labels);
  const int rows = batch * model.inputs(), padded = model.outputs() / model.inputs();
  DeviceArray<float> dlogits(*dev, std::size_t(rows) * padded);
  const float* y = replica.forward(xd.data(), batch);
  std::vector<float> out(std::size_t(rows) * padded);
  dev->copy_to_host(out.data(), y, out.size() * sizeof(float));
  dev->softmax_cross_entropy(y, yd.data(), rows, padded, dlogits.data(), 1.0f / rows);
  replica.zero_grads();
  replica.backward(xd.data(), dlogits.data(), batch);
  return {out, replica.gradients(), replica.frozen()};
}

// A LoRA model of `base` (frozen values away from their rounding) under bf16 against fp32 on the
// rounded base, batch sequences of t tokens below `vocab`: the Replica holds the base as its
// bf16 bits alone and no step writes them; the logits within bf16's tolerance of fp32's; the
// adapters' gradients too, with room for the first block's (their error grows with the
// distance from the loss: up to 0.12 on these 8-channel models, whose gradients are sums of a
// few terms; a wrong path is off by its whole size). Returns the tokens and the rounded base,
// for the caller's embedding checks.
struct Bf16ModelInputs {
  std::vector<float> tokens, rounded;
};
inline Bf16ModelInputs check_model_bf16(const Model& model, const std::vector<float>& base,
                                        int batch, int t, int vocab) {
  const auto adapters = random_floats(model.param_count(), 71, -0.5, 0.5);
  const auto rounded = rounded_to_bf16(base);
  REQUIRE(rounded != base);
  const auto tokens = random_tokens(std::size_t(batch) * t, vocab, 73);
  const auto labels = random_labels(std::size_t(batch) * t, vocab, 74);
  const ModelRun f = run_model(model, Precision::fp32, batch, adapters, rounded, tokens, labels);
  const ModelRun b = run_model(model, Precision::bf16, batch, adapters, base, tokens, labels);
  CHECK(b.frozen == rounded);  // the bf16 bits, and nothing wrote them
  const double el = relative_error(b.logits, f.logits), eg = relative_error(b.grads, f.grads);
  CAPTURE(el);
  CAPTURE(eg);
  CHECK(el < 2e-2);
  CHECK(el > 0.0);
  CHECK(eg < 1e-1);
  CHECK(eg > 0.0);
  return {tokens, rounded};
}


}  // namespace lockstep::test
