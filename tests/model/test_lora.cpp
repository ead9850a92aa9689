// LoRA adapters on the Llama block (Note [LoRA] in src/model/lora.cpp): finite differences of
// the adapters' gradients and the input's, through a block and a whole model; the base has no
// gradient and is never written; zero B is the base model exactly; the merged weights give the
// adapted model's logits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "lockstep/model.hpp"

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
std::vector<float> logits(const Model& model, const std::vector<float>& params,
                          const std::vector<float>& frozen) {
  auto dev = lockstep::make_cpu_device(0, 1);
  lockstep::Replica replica(*dev, model, 2);
  replica.load_parameters(params);
  if (!frozen.empty()) replica.load_frozen(frozen);
  const auto x = on_device(*dev, random_tokens(2 * std::size_t(kLlama.context), kLlama.vocab_size, 9));
  const float* y = replica.forward(x.data(), 2);
  std::vector<float> out(std::size_t(2) * model.outputs());
  dev->copy_to_host(out.data(), y, out.size() * sizeof(float));
  return out;
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

  TEST_CASE("lora model through a Replica: the adapters' gradients by finite differences, and the base gets none") {
    const Model model = Model::gpt(kLlama, lockstep::AttentionKind::materialized, kAll);
    auto dev = lockstep::make_cpu_device(0, 2);
    const int batch = 2, t = kLlama.context, v = kLlama.vocab_size;
    lockstep::Replica replica(*dev, model, batch);
    std::vector<float> adapters = random_floats(model.param_count(), 21, -0.3, 0.3);
    std::vector<float> base = model.initial_frozen(3);
    for (float& p : base) p *= 2.0f;
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
    const auto base = lora.frozen_tensors(), mine = full.param_tensors();
    REQUIRE(base.size() == mine.size());
    for (std::size_t i = 0; i < base.size(); ++i) {
      CHECK(base[i].name == mine[i].name);
      CHECK(base[i].offset == mine[i].offset);
    }
    CHECK(lora.initial_frozen(5) == full.initial_parameters(5));
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
    const Model full = Model::gpt(kLlama);
    const Model lora = Model::gpt(kLlama, lockstep::AttentionKind::materialized, kAll);
    const auto base = lora.initial_frozen(8);
    CHECK(logits(lora, lora.initial_parameters(8), base) == logits(full, base, {}));
    const auto adapters = random_floats(lora.param_count(), 31, -0.5, 0.5);
    const auto merged = lockstep::merge_lora(lora, kAll, adapters, base);
    const auto a = logits(lora, adapters, base), b = logits(full, merged, {});
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::isfinite(a[i])) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5));
  }

  TEST_CASE("lora refuses unknown targets, no targets, and GPT-2's blocks") {
    CHECK_THROWS_WITH_AS(Model::gpt(kLlama, lockstep::AttentionKind::materialized,
                                    {.rank = 2, .targets = {"c_attn"}}),
                         doctest::Contains("LoRA target 'c_attn'"), std::invalid_argument);
    CHECK_THROWS_AS(Model::gpt(kLlama, lockstep::AttentionKind::materialized, {.rank = 2}),
                    std::invalid_argument);
    CHECK_THROWS_WITH_AS(Model::gpt(lockstep::GptSpec{}, lockstep::AttentionKind::materialized,
                                    kAll),
                         doctest::Contains("Llama family"), std::invalid_argument);
  }
}
