// LoRA adapters on the Llama block (Note [LoRA] in src/model/lora.cpp): finite differences of
// the adapters' gradients and the input's, through a block and a whole model; the base has no
// gradient and is never written; zero B is the base model exactly; the merged weights give the
// adapted model's logits; dropout on the adapters' input (Note [LoRA dropout]): finite
// differences through a fixed mask, PEFT's formula with the device's mask, key 0 drops nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/bf16.hpp"
#include "../compare.hpp"
#include "gradcheck.hpp"
#include "lora_gradcheck.hpp"
#include "lockstep/model.hpp"
#include "model/lora.hpp"

namespace {

using lockstep::DeviceArray;
using lockstep::LoraSpec;
using lockstep::Model;
using namespace lockstep::test;

constexpr lockstep::GptSpec kLlama{.vocab_size = 11, .context = 5, .n_layer = 2, .n_head = 4,
                                   .d_model = 8, .norm = lockstep::NormKind::rmsnorm,
                                   .norm_eps = 1e-6, .positions = lockstep::PositionKind::rope,
                                   .mlp = lockstep::MlpKind::swiglu, .intermediate_size = 12,
                                   .n_kv_head = 2, .qkv_bias = true, .proj_bias = false,
                                   .tie_embeddings = true};

const LoraSpec kAll{.rank = 2, .alpha = 3.0,
                    .targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                "down_proj"}};

// The logits of `model` at `params` (and `frozen`) on fixed tokens.
// `dropout_key`: Replica::set_dropout_key's (0: none).
std::vector<float> logits(const Model& model, const std::vector<float>& params,
                          const std::vector<float>& frozen, std::uint64_t dropout_key = 0) {
  return lora_logits(model, kLlama.vocab_size, params, frozen, dropout_key);
}

}  // namespace

TEST_SUITE("gradcheck") {
  TEST_CASE("lora block: the adapters' gradients and the input's, each target set, both attention paths") {
    for (const auto& targets : std::vector<std::vector<std::string>>{
             kAll.targets, {"q_proj", "v_proj"}, {"k_proj", "up_proj", "down_proj"}}) {
      for (const auto attention : {lockstep::AttentionKind::materialized,
                                   lockstep::AttentionKind::fused}) {
        CAPTURE(targets.size());
        LoraSpec lora = kAll;
        lora.targets = targets;
        const auto layer = lockstep::make_llama_block(kLlama, attention,
                                                      lockstep::make_rope_constants(kLlama), lora);
        REQUIRE(layer->frozen_count() > 0);
        // B away from zero, so that A has a gradient.
        const auto adapters = random_floats(layer->param_count(), 4, -0.5, 0.5);
        const auto base = random_floats(layer->frozen_count(), 7, -0.5, 0.5);
        const int batch = 2;
        const auto g = layer_gradients(
            *layer, batch, adapters,
            random_floats(std::size_t(batch) * kLlama.context * kLlama.d_model, 5, -2.0, 2.0), 6,
            true, base);
        std::string miss = mismatch(g.fd_params, g.params);
        CHECK_MESSAGE(miss.empty(), "adapters: ", miss);
        miss = mismatch(g.fd_input, g.input);
        CHECK_MESSAGE(miss.empty(), "input: ", miss);
      }
    }
  }

  TEST_CASE("lora block with dropout: the adapters' gradients and the input's through one fixed mask") {
    LoraSpec lora = kAll;
    lora.dropout = 0.4;
    const auto layer = lockstep::make_llama_block(kLlama, lockstep::AttentionKind::materialized,
                                                  lockstep::make_rope_constants(kLlama), lora);
    const auto adapters = random_floats(layer->param_count(), 14, -0.5, 0.5);
    const auto base = random_floats(layer->frozen_count(), 15, -0.5, 0.5);
    const int batch = 2;
    const auto g = layer_gradients(
        *layer, batch, adapters,
        random_floats(std::size_t(batch) * kLlama.context * kLlama.d_model, 16, -2.0, 2.0), 17,
        true, base, /*dropout_key=*/0xd40d);
    std::string miss = mismatch(g.fd_params, g.params);
    CHECK_MESSAGE(miss.empty(), "adapters: ", miss);
    miss = mismatch(g.fd_input, g.input);
    CHECK_MESSAGE(miss.empty(), "input: ", miss);
  }

  TEST_CASE("lora model through a Replica: the adapters' gradients by finite differences, and the base gets none") {
    const Model model = Model::gpt(kLlama, lockstep::AttentionKind::materialized, kAll);
    check_lora_model_gradients(model, kLlama, 2.0f);
  }
}

TEST_SUITE("model") {
  TEST_CASE("lora layout: PEFT's names, the base in the full model's layout and initial values") {
    const Model full = Model::gpt(kLlama);
    const Model lora = Model::gpt(kLlama, lockstep::AttentionKind::materialized,
                                  {.rank = 2, .alpha = 4.0, .targets = {"v_proj", "q_proj"}});
    const auto tensors = lora.param_tensors();
    REQUIRE(tensors.size() == 8);  // 2 blocks x (q, v) x (A, B)
    CHECK(tensors[0].name == "model.layers.0.self_attn.q_proj.lora_A.weight");
    CHECK(tensors[0].shape == std::vector<std::int64_t>{2, 8});
    CHECK(tensors[1].name == "model.layers.0.self_attn.q_proj.lora_B.weight");
    CHECK(tensors[1].shape == std::vector<std::int64_t>{8, 2});
    CHECK(tensors[3].name == "model.layers.0.self_attn.v_proj.lora_B.weight");
    CHECK(tensors[3].shape == std::vector<std::int64_t>{4, 2});  // 2 kv heads of 2
    check_base_layout(full, lora);
    // A ~ U(-1/sqrt(in), 1/sqrt(in)), not all zero; B = 0.
    const auto init = lora.initial_parameters(5);
    bool a_nonzero = false;
    for (const auto& t : tensors)
      for (std::size_t i = 0; i < t.numel(); ++i) {
        const float p = init[t.offset + i];
        if (t.name.ends_with("lora_B.weight")) CHECK(p == 0.0f);
        else {
          CHECK(std::abs(p) <= 1.0f / std::sqrt(8.0f));
          a_nonzero = a_nonzero || p != 0.0f;
        }
      }
    CHECK(a_nonzero);
  }

  TEST_CASE("lora with B = 0 is the base model bit for bit, and merged weights give the adapted logits") {
    check_lora_merge(Model::gpt(kLlama),
                     Model::gpt(kLlama, lockstep::AttentionKind::materialized, kAll), kAll,
                     kLlama.vocab_size);
  }

  TEST_CASE("lora refuses unknown targets, no targets, and Llama's names on GPT-2's blocks") {
    CHECK_THROWS_WITH_AS(Model::gpt(kLlama, lockstep::AttentionKind::materialized,
                                    {.rank = 2, .targets = {"c_attn"}}),
                         doctest::Contains("LoRA target 'c_attn'"), std::invalid_argument);
    CHECK_THROWS_AS(Model::gpt(kLlama, lockstep::AttentionKind::materialized,
                               {.rank = 2, .targets = {}}),
                    std::invalid_argument);
    CHECK_THROWS_WITH_AS(Model::gpt(lockstep::GptSpec{}, lockstep::AttentionKind::materialized,
                                    kAll),
                         doctest::Contains("LoRA target 'q_proj' is none of c_attn"),
                         std::invalid_argument);
  }

  TEST_CASE("lora dropout: the adapter reads x m / (1 - p) with the device's mask (PEFT's formula), and key 0 drops nothing") {
    auto dev = lockstep::make_cpu_device(0, 1);
    const int rows = 6, in = 10, out = 7, rank = 3;
    const float p = 0.25f, s = 1.5f;
    const std::uint64_t key = 0x1234567ull;
    const std::size_t nx = std::size_t(rows) * in, ny = std::size_t(rows) * out;
    const auto a = random_floats(std::size_t(rank) * in, 40);
    const auto b = random_floats(std::size_t(out) * rank, 41);
    const auto x = random_floats(nx, 42), y0 = random_floats(ny, 43);
    auto ad = on_device(*dev, a), bd = on_device(*dev, b), xd = on_device(*dev, x);
    // The mask: what dropout makes of ones, each element 0 or 1 / (1 - p).
    auto ones = on_device(*dev, std::vector<float>(nx, 1.0f));
    DeviceArray<float> md(*dev, nx);
    dev->dropout(ones.data(), md.data(), nx, key, p, false);
    const auto m = md.download();
    for (const float v : m) CHECK((v == 0.0f || v == 1.0f / (1.0f - p)));
    const lockstep::detail::LoraTarget target{"q_proj", ".self_attn.q_proj", in, out, 0, out};
    for (const std::uint64_t k : {key, std::uint64_t(0)}) {
      CAPTURE(k);
      const lockstep::detail::LoraAdapter adapter{ad.data(), bd.data(), rank, s, target, p, k};
      auto yd = on_device(*dev, y0);
      DeviceArray<float> u(*dev, std::size_t(rows) * rank), dropped(*dev, nx);
      adapter.forward(*dev, {xd.data(), nullptr}, yd.data(), {u.data(), nullptr},
                      {.dropped = dropped.data()}, rows);
      const auto y = yd.download();
      // y = y0 + s ((x * m) A^T) B^T in double; without a key, m = 1.
      for (int r = 0; r < rows; ++r)
        for (int o = 0; o < out; ++o) {
          double want = y0[std::size_t(r) * out + o];
          for (int j = 0; j < rank; ++j) {
            double xa = 0.0;
            for (int c = 0; c < in; ++c) {
              const std::size_t i = std::size_t(r) * in + c;
              xa += double(x[i]) * (k ? m[i] : 1.0) * a[std::size_t(j) * in + c];
            }
            want += s * xa * b[std::size_t(o) * rank + j];
          }
          CHECK(y[std::size_t(r) * out + o] == doctest::Approx(want).epsilon(1e-5));
        }
    }
    // 1 - p of a long mask is kept, and the same key draws the same mask on a second call.
    const std::size_t many = 200000;
    auto long_ones = on_device(*dev, std::vector<float>(many, 1.0f));
    DeviceArray<float> first(*dev, many), second(*dev, many);
    dev->dropout(long_ones.data(), first.data(), many, key, p, false);
    dev->dropout(long_ones.data(), second.data(), many, key, p, false);
    const auto f = first.download();
    CHECK(f == second.download());
    const double kept = double(std::ranges::count_if(f, [](float v) { return v != 0.0f; }));
    CHECK(kept / double(many) == doctest::Approx(1.0 - p).epsilon(0.01));
  }

  TEST_CASE("lora dropout through a Replica: key 0 is the model without dropout bit for bit, and a key draws its own masks alike each time") {
    LoraSpec lora = kAll;
    lora.dropout = 0.5;
    const Model drop = Model::gpt(kLlama, lockstep::AttentionKind::materialized, lora);
    const Model plain = Model::gpt(kLlama, lockstep::AttentionKind::materialized, kAll);
    const auto adapters = random_floats(drop.param_count(), 51, -0.5, 0.5);
    const auto base = drop.initial_frozen(4);
    const auto none = logits(plain, adapters, base);
    CHECK(logits(drop, adapters, base) == none);  // eval and sampling
    const auto k7 = logits(drop, adapters, base, 7);
    CHECK(k7 != none);
    CHECK(logits(drop, adapters, base, 7) == k7);
    CHECK(logits(drop, adapters, base, 8) != k7);
  }
}

// LoRA under trainer.precision bf16 (Note [Frozen parameters] in src/model/lora.cpp): the base
// held as bf16 bits only, the adapters as any bf16 parameter (fp32 master, bf16 copy).
TEST_SUITE("model") {
  TEST_CASE("lora block under bf16: output, adapters' and input's gradients against fp32, the base read from its bf16 bits alone") {
    for (const double dropout : {0.0, 0.3}) {
      for (const auto attention : {lockstep::AttentionKind::materialized,
                                   lockstep::AttentionKind::fused}) {
        CAPTURE(dropout);
        LoraSpec lora = kAll;
        lora.dropout = dropout;
        lockstep::GptSpec spec = kLlama;
        spec.proj_bias = true;  // every bias widened (qkv's from kLlama)
        const auto layer =
            lockstep::make_llama_block(spec, attention, lockstep::make_rope_constants(spec), lora);
        check_block_bf16(*layer, std::size_t(spec.context) * spec.d_model,
                         dropout > 0.0 ? 0xbf16 : 0);
      }
    }
  }

  TEST_CASE("lora model under bf16: the Replica holds the base as bf16 bits alone, unchanged by a step, and its logits and gradients are fp32's within bf16's tolerance") {
    const Model model = Model::gpt(kLlama, lockstep::AttentionKind::materialized, kAll);
    const int batch = 2, t = kLlama.context, v = kLlama.vocab_size, rows = batch * t;
    const auto [tokens, rounded] = check_model_bf16(model, model.initial_frozen(72), batch, t, v);
    // The bf16 embedding lookup is the fp32 one on the widened table, bit for bit.
    auto dev = lockstep::make_cpu_device(0, 1);
    auto ids = on_device(*dev, tokens), table = on_device(*dev, rounded);
    const std::size_t n = std::size_t(v) * kLlama.d_model;
    DeviceArray<std::uint16_t> table16(*dev, n);
    dev->to_bf16(table.data(), table16.data(), n);
    DeviceArray<float> a(*dev, std::size_t(rows) * kLlama.d_model), c(*dev, a.size());
    dev->embedding_forward(ids.data(), table.data(), nullptr, a.data(), batch, t, kLlama.d_model,
                          nullptr);
    dev->embedding_forward(ids.data(), table16.data(), nullptr, c.data(), batch, t,
                          kLlama.d_model, nullptr);
    CHECK(a.download() == c.download());
  }
}
