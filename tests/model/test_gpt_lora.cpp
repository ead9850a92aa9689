// LoRA adapters on GPT-2's block (Note [LoRA] in src/model/lora.cpp): finite differences of the
// adapters' gradients and the input's through a block (each target set, c_fc's adapter before
// GELU, with and without dropout) and a whole model, whose base gets no gradient and is never
// written; zero B is the base model bit for bit; merged weights give the adapted logits; the
// layout names tensors as PEFT does on Hugging Face's GPT-2.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../compare.hpp"
#include "gradcheck.hpp"
#include "lora_gradcheck.hpp"
#include "lockstep/model.hpp"
#include "model/lora.hpp"
#include "model/lora_targets.hpp"

namespace {

using lockstep::DeviceArray;
using lockstep::LoraSpec;
using lockstep::Model;
using namespace lockstep::test;

constexpr lockstep::GptSpec kGpt2{.vocab_size = 11, .context = 5, .n_layer = 2, .n_head = 2,
                                  .d_model = 8};

const LoraSpec kAll{.rank = 2, .alpha = 3.0, .targets = lockstep::detail::gpt2_lora_target_names()};

// The logits of `model` at `params` (and `frozen`) on fixed tokens.
std::vector<float> logits(const Model& model, const std::vector<float>& params,
                          const std::vector<float>& frozen) {
  return lora_logits(model, kGpt2.vocab_size, params, frozen);
}

// The adapters' and the input's gradients of a GPT-2 block with `lora` against finite
// differences, B away from zero so that A has a gradient.
void check_block(const LoraSpec& lora, lockstep::AttentionKind attention,
                 std::uint64_t dropout_key = 0) {
  const auto layer = lockstep::detail::make_gpt_block(kGpt2.context, kGpt2.d_model, kGpt2.n_head,
                                                      kGpt2.n_layer, attention, lora);
  REQUIRE(layer->frozen_count() > 0);
  const auto adapters = random_floats(layer->param_count(), 4, -0.5, 0.5);
  const auto base = random_floats(layer->frozen_count(), 7, -0.5, 0.5);
  const int batch = 2;
  const auto g = layer_gradients(
      *layer, batch, adapters,
      random_floats(std::size_t(batch) * kGpt2.context * kGpt2.d_model, 5, -2.0, 2.0), 6, true,
      base, dropout_key);
  std::string miss = mismatch(g.fd_params, g.params);
  CHECK_MESSAGE(miss.empty(), "adapters: ", miss);
  miss = mismatch(g.fd_input, g.input);
  CHECK_MESSAGE(miss.empty(), "input: ", miss);
}

}  // namespace

TEST_SUITE("gradcheck") {
  TEST_CASE("gpt2 lora block: the adapters' gradients and the input's, each target set, both attention paths") {
    for (const auto& targets : std::vector<std::vector<std::string>>{
             kAll.targets, {"c_attn"}, {"attn.c_proj"}, {"c_fc"}, {"mlp.c_proj"},
             {"c_attn", "mlp.c_proj"}}) {
      for (const auto attention : {lockstep::AttentionKind::materialized,
                                   lockstep::AttentionKind::fused}) {
        CAPTURE(targets.front());
        CAPTURE(targets.size());
        LoraSpec lora = kAll;
        lora.targets = targets;
        check_block(lora, attention);
      }
    }
  }

  TEST_CASE("gpt2 lora block with dropout: the adapters' gradients and the input's through one fixed mask") {
    LoraSpec lora = kAll;
    lora.dropout = 0.4;
    check_block(lora, lockstep::AttentionKind::materialized, 0xd40d);
  }

  TEST_CASE("gpt2 lora model through a Replica: the adapters' gradients by finite differences, and the base gets none") {
    const Model model = Model::gpt(kGpt2, lockstep::AttentionKind::materialized, kAll);
    check_lora_model_gradients(model, kGpt2, 4.0f);
  }
}

TEST_SUITE("model") {
  TEST_CASE("gpt2 lora layout: PEFT's names on Hugging Face's GPT-2, the base in the full model's layout") {
    const Model full = Model::gpt(kGpt2);
    const Model lora = Model::gpt(kGpt2, lockstep::AttentionKind::materialized,
                                  {.rank = 2, .alpha = 4.0, .targets = {"mlp.c_proj", "c_fc"}});
    const auto tensors = lora.param_tensors();
    REQUIRE(tensors.size() == 8);  // 2 blocks x (c_fc, mlp.c_proj) x (A, B)
    CHECK(tensors[0].name == "transformer.h.0.mlp.c_fc.lora_A.weight");
    CHECK(tensors[0].shape == std::vector<std::int64_t>{2, 8});
    CHECK(tensors[1].name == "transformer.h.0.mlp.c_fc.lora_B.weight");
    CHECK(tensors[1].shape == std::vector<std::int64_t>{32, 2});
    CHECK(tensors[2].name == "transformer.h.0.mlp.c_proj.lora_A.weight");
    CHECK(tensors[2].shape == std::vector<std::int64_t>{2, 32});
    check_base_layout(full, lora);
    CHECK(lora.param_count() == 2 * (2 * (8 + 32) + 2 * (32 + 8)));
  }

  TEST_CASE("gpt2 lora with B = 0 is the base model bit for bit, and merged weights give the adapted logits") {
    const Model full = Model::gpt(kGpt2);
    for (const auto& targets : std::vector<std::vector<std::string>>{kAll.targets, {"c_fc"}}) {
      CAPTURE(targets.size());
      LoraSpec spec = kAll;
      spec.targets = targets;
      check_lora_merge(full, Model::gpt(kGpt2, lockstep::AttentionKind::materialized, spec),
                       spec, kGpt2.vocab_size);
    }
  }

  TEST_CASE("gpt2 lora targets: PEFT's c_proj names both, Llama's names are refused on GPT-2's blocks") {
    using lockstep::detail::parse_lora_targets;
    CHECK(parse_lora_targets("c_fc, c_proj", true) ==
          std::vector<std::string>{"attn.c_proj", "c_fc", "mlp.c_proj"});
    CHECK(parse_lora_targets("all", true) == kAll.targets);
    CHECK(lockstep::parse_lora_targets("c_attn,mlp.c_proj") ==
          std::vector<std::string>{"c_attn", "mlp.c_proj"});
    CHECK_THROWS_WITH_AS(parse_lora_targets("c_attn,q_proj", true),
                         doctest::Contains("'q_proj' is not a projection of GPT-2's: expected "
                                           "c_attn, attn.c_proj, c_fc, mlp.c_proj, c_proj"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Model::gpt(kGpt2, lockstep::AttentionKind::materialized,
                                    {.rank = 2, .targets = {"q_proj"}}),
                         doctest::Contains("LoRA target 'q_proj'"), std::invalid_argument);
  }
}

// LoRA on GPT-2 under trainer.precision bf16 (Note [Frozen parameters] in src/model/lora.cpp):
// the base held as bf16 bits only (the products read them, the LayerNorms' weights and biases
// and the blocks' biases widened, wte and wpe looked up from them), the adapters as any bf16
// parameter.
TEST_SUITE("model") {
  // check_block_bf16, as the Llama block's (test_lora.cpp): every target (c_attn's and c_fc's
  // adapters summed with the product before the bf16 output is rounded), and the c_projs' alone
  // (qkv and fc from the bias epilogue).
  TEST_CASE("gpt2 lora block under bf16: output, adapters' and input's gradients against fp32, the base read from its bf16 bits alone") {
    for (const auto& targets : std::vector<std::vector<std::string>>{
             kAll.targets, {"attn.c_proj", "mlp.c_proj"}}) {
      for (const double dropout : {0.0, 0.3}) {
        for (const auto attention : {lockstep::AttentionKind::materialized,
                                     lockstep::AttentionKind::fused}) {
          CAPTURE(targets.size());
          CAPTURE(dropout);
          LoraSpec lora = kAll;
          lora.targets = targets;
          lora.dropout = dropout;
          const auto layer = lockstep::detail::make_gpt_block(
              kGpt2.context, kGpt2.d_model, kGpt2.n_head, kGpt2.n_layer, attention, lora);
          // The base is random: LayerNorms' weights and biases away from 1 and 0.
          check_block_bf16(*layer, std::size_t(kGpt2.context) * kGpt2.d_model,
                           dropout > 0.0 ? 0xbf16 : 0);
        }
      }
    }
  }

  TEST_CASE("gpt2 lora model under bf16: the Replica holds the base as bf16 bits alone, unchanged by a step, its logits and gradients fp32's within bf16's tolerance, and the bf16 lookup of wte and wpe the fp32 one") {
    const Model model = Model::gpt(kGpt2, lockstep::AttentionKind::materialized, kAll);
    const int batch = 2, t = kGpt2.context, v = kGpt2.vocab_size, rows = batch * t;
    // The base away from its initial values (LayerNorms 1 and 0, biases 0), so that each
    // widened tensor counts.
    const auto [tokens, rounded] =
        check_model_bf16(model, random_floats(model.frozen_count(), 72, -0.5, 0.5), batch, t, v);

    // The bf16 lookup of wte + wpe, at t and at packed positions, is the fp32 one on the widened
    // tables, bit for bit.
    auto dev = lockstep::make_cpu_device(0, 1);
    const std::size_t c = std::size_t(kGpt2.d_model), wte = std::size_t(v) * c;
    const std::size_t tables = wte + std::size_t(t) * c;
    auto ids = on_device(*dev, tokens);
    auto table = on_device(*dev, std::vector<float>(rounded.begin(), rounded.begin() + tables));
    DeviceArray<std::uint16_t> table16(*dev, tables);
    dev->to_bf16(table.data(), table16.data(), tables);
    std::vector<std::int32_t> packed(static_cast<std::size_t>(rows));
    for (std::size_t r = 0; r < packed.size(); ++r) packed[r] = std::int32_t(r % t % 3);
    auto positions = on_device(*dev, packed);
    for (const bool pack : {false, true}) {
      CAPTURE(pack);
      const std::int32_t* p = pack ? positions.data() : nullptr;
      DeviceArray<float> a(*dev, std::size_t(rows) * c), e(*dev, a.size());
      dev->embedding_forward(ids.data(), table.data(), table.data() + wte, a.data(), batch, t,
                             kGpt2.d_model, p);
      dev->embedding_forward(ids.data(), table16.data(), table16.data() + wte, e.data(), batch,
                             t, kGpt2.d_model, p);
      CHECK(a.download() == e.download());
    }
  }
}
