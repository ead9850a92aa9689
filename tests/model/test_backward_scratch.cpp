// A decoder block's backward scratch, whose temporaries share storage where their lifetimes are
// disjoint (Note [Backward scratch lifetimes] in src/model/gpt.cpp): its closed-form size, and
// backward's results with and without an input gradient, with the scratch and din filled with
// NaN first, so that a temporary read after another took its place, or anything read from
// forward's scratch or din's old contents, shows. The finite-difference tests (test_gpt.cpp,
// test_llama.cpp, test_lora.cpp) check fp32's values; here bf16's are held to fp32's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/model.hpp"
#include "model/ops.hpp"
#include "../compare.hpp"
#include "../random_data.hpp"

namespace {

using lockstep::AttentionKind;
using lockstep::DeviceArray;
using lockstep::Layer;
using lockstep::Precision;
using namespace lockstep::test;

constexpr int kBatch = 2, kContext = 6;

constexpr lockstep::GptSpec kLlama{.vocab_size = 11, .context = kContext, .n_layer = 2,
                                   .n_head = 4, .d_model = 8, .norm = lockstep::NormKind::rmsnorm,
                                   .norm_eps = 1e-6, .positions = lockstep::PositionKind::rope,
                                   .mlp = lockstep::MlpKind::swiglu, .intermediate_size = 12,
                                   .n_kv_head = 2, .qkv_bias = true, .proj_bias = true,
                                   .tie_embeddings = false};

struct Gradients {
  std::vector<float> params, input;  // input empty without a din
};

// forward, then backward of dout in `precision` (parameter gradients from zero), with a din or
// without one; the scratch filled with NaN between the two, din with NaN before backward. With
// a din the scratch is as large as the replica gives a layer after the first
// (scratch_size_with_din), without one as a first layer's (scratch_size).
// `frozen`: a LoRA block's base (its params are the adapters), else empty.
Gradients run(const Layer& layer, Precision precision, bool with_din,
              const std::vector<float>& params, const std::vector<float>& frozen,
              const std::vector<float>& x, const std::vector<float>& dout,
              std::uint64_t dropout_key = 0) {
  const bool bf16 = precision == Precision::bf16;
  auto dev = lockstep::make_cpu_device(0, 1);
  DeviceArray<float> saved(*dev, layer.workspace_size(kBatch, precision));
  DeviceArray<float> scratch(*dev, with_din ? layer.scratch_size_with_din(kBatch, precision)
                                            : layer.scratch_size(kBatch, precision));
  const auto table = layer.constants();
  DeviceArray<float> constants = on_device(*dev, table ? *table : std::vector<float>{});
  auto pd = on_device(*dev, params), fd = on_device(*dev, frozen);
  DeviceArray<std::uint16_t> p16(*dev, bf16 ? params.size() : 0);
  DeviceArray<std::uint16_t> f16(*dev, bf16 ? frozen.size() : 0);
  if (bf16) {
    dev->to_bf16(pd.data(), p16.data(), params.size());
    if (!frozen.empty()) dev->to_bf16(fd.data(), f16.data(), frozen.size());
  }
  const lockstep::LayerWorkspace ws{
      .saved = saved.data(), .scratch = scratch.data(), .precision = precision,
      .params_bf16 = p16.data(), .constants = table ? constants.data() : nullptr,
      .frozen = frozen.empty() || bf16 ? nullptr : fd.data(),
      .frozen_bf16 = frozen.empty() ? nullptr : f16.data(), .dropout_key = dropout_key};
  auto xd = on_device(*dev, x), dyd = on_device(*dev, dout);
  auto gd = on_device(*dev, std::vector<float>(params.size(), 0.0f));
  DeviceArray<float> yd(*dev, dout.size()), dxd(*dev, x.size());
  layer.forward(*dev, pd.data(), xd.data(), yd.data(), kBatch, ws);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  dev->fill(scratch.data(), nan, scratch.size());
  dev->fill(dxd.data(), nan, dxd.size());
  layer.backward(*dev, pd.data(), gd.data(), xd.data(), yd.data(), dyd.data(),
                 with_din ? dxd.data() : nullptr, kBatch, ws);
  return {gd.download(), with_din ? dxd.download() : std::vector<float>{}};
}

bool all_finite(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isfinite(f)) return false;
  return true;
}

// In fp32 and bf16: every gradient finite, the parameters' the same bits with a din and
// without one (under bf16 with the fused path, the rounded gradients in din's storage and in
// grad16 against a region of their own), and bf16's within 3e-2 of fp32's.
void check_block(const Layer& layer, const std::vector<float>& params,
                 const std::vector<float>& frozen = {}, std::uint64_t dropout_key = 0) {
  const std::size_t n = std::size_t(kBatch) * layer.in_features();
  const auto x = random_floats(n, 5, -2.0, 2.0), dout = random_floats(n, 6);
  Gradients with[2], without[2];
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    const int p = precision == Precision::bf16;
    CAPTURE(p);
    with[p] = run(layer, precision, true, params, frozen, x, dout, dropout_key);
    without[p] = run(layer, precision, false, params, frozen, x, dout, dropout_key);
    CHECK(all_finite(with[p].params));
    CHECK(all_finite(with[p].input));
    CHECK(with[p].params == without[p].params);
  }
  CHECK(relative_error(with[1].params, with[0].params) < 3e-2);
  CHECK(relative_error(with[1].input, with[0].input) < 3e-2);
}

std::vector<float> block_params(const Layer& layer) {
  return random_floats(layer.param_count(), 4, -0.5, 0.5);
}

}  // namespace

TEST_CASE("backward scratch: a gpt block's temporaries share storage, and its closed-form size") {
  const std::size_t c = 8, heads = 2, nc = std::size_t(kBatch) * kContext * c;
  const std::size_t att = std::size_t(kBatch) * heads * kContext * kContext;
  for (AttentionKind attention : {AttentionKind::fused, AttentionKind::materialized}) {
    const bool fused = attention == AttentionKind::fused;
    CAPTURE(fused);
    const auto layer = lockstep::make_block(kContext, int(c), int(heads), 2, attention);
    // fp32: h (N, 4C), which qkv (N, 3C) and a first layer's d res1 share, and tmp (N, C).
    // bf16: tmp moves into h's back (N, C); then grad16 (max((N, 4C), att)) and dout16 (N, C)
    // in bf16, two to a float, each whole 64-byte lines (nc is a multiple of 32).
    const std::size_t squares = fused ? 0 : att;
    CHECK(layer->scratch_size(kBatch, Precision::fp32) == 5 * nc + squares);
    CHECK(layer->scratch_size(kBatch, Precision::bf16) ==
          4 * nc + squares + lockstep::detail::bf16_floats(std::max(4 * nc, squares)) + nc / 2);
    // With a din and the fused path, no dout16: din's storage and grad16 hold the roundings.
    CHECK(layer->scratch_size_with_din(kBatch, Precision::fp32) == 5 * nc + squares);
    CHECK(layer->scratch_size_with_din(kBatch, Precision::bf16) ==
          layer->scratch_size(kBatch, Precision::bf16) - (fused ? nc / 2 : 0));
    check_block(*layer, block_params(*layer));
  }
}

TEST_CASE("backward scratch: a llama block's temporaries share storage, and its closed-form "
          "size, with and without LoRA and its dropout") {
  const std::size_t n = std::size_t(kBatch) * kContext, c = 8, f = 12;
  const std::size_t w = 8 + 2 * 2 * 2;  // q (H D = 8) and the kv heads' k and v (2 x 2 D)
  for (AttentionKind attention : {AttentionKind::fused, AttentionKind::materialized}) {
    CAPTURE(attention == AttentionKind::fused);
    const auto layer =
        lockstep::make_llama_block(kLlama, attention, lockstep::make_rope_constants(kLlama));
    // Region 1: h (N, F), then tmp (N, C); region 2: dgu (N, 2F), then qkv (N, W) or a first
    // layer's d res1 (N, C).
    const std::size_t att =
        attention == AttentionKind::fused ? 0 : std::size_t(kBatch) * 4 * kContext * kContext;
    CHECK(layer->scratch_size(kBatch, Precision::fp32) ==
          std::max(n * f, n * c) + std::max({2 * n * f, n * w, n * c}) + att);
    // bf16 with a din and the fused path: no region for dout16 (N, max(C, Q)) = (N, 8).
    CHECK(layer->scratch_size_with_din(kBatch, Precision::fp32) ==
          layer->scratch_size(kBatch, Precision::fp32));
    CHECK(layer->scratch_size_with_din(kBatch, Precision::bf16) ==
          layer->scratch_size(kBatch, Precision::bf16) -
              (attention == AttentionKind::fused ? lockstep::detail::bf16_floats(n * c) : 0));
    check_block(*layer, block_params(*layer));
    for (double dropout : {0.0, 0.25}) {
      CAPTURE(dropout);
      const lockstep::LoraSpec lora{.rank = 2, .alpha = 3.0,
                                    .targets = lockstep::lora_target_names(),
                                    .dropout = dropout};
      const auto adapted = lockstep::make_llama_block(kLlama, attention,
                                                      lockstep::make_rope_constants(kLlama), lora);
      // B nonzero, so that every adapter's gradients flow.
      const auto adapters = random_floats(adapted->param_count(), 7, -0.5, 0.5);
      check_block(*adapted, adapters, block_params(*layer), dropout > 0 ? 0x5eed : 0);
    }
  }
}
