// trainer.recompute: selective and full (Note [Recomputation] in src/model/model.cpp) on the
// CPU backend:
//   - a replica that recomputes its blocks (GPT-2's and the Llama family's, with LoRA adapters
//     too) writes bit-identical gradients, and allocates the activation bytes the memory plan gives;
//   - a run ends bit-identical to one without (fp32 and bf16, fused and materialised attention,
//     accumulation, ZeRO-2, overlap off), with the same host syncs per step (an allocation or
//     a read inside the step would add one: Note [Host syncs]);
//   - the plan's activations for full keep one block's saved values of GPT-2 124M's 12 at B 8 x
//     T 1024 (bf16, fused attention), at most a quarter of none's, and a refusal for
//     activations suggests trainer.recompute.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/lockstep.hpp"
#include "model/lora_targets.hpp"
#include "random_data.hpp"
#include "train/memory_plan.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;

namespace {

// The gradients of two backward passes (the second finds the shared buffer holding the last
// block's values) of `model` on fixed tokens and a gradient of the logits from them.
// A LoRA model (frozen_count() > 0): random adapters (B away from zero, so that A has a
// gradient) on the base's initial values, loaded as the trainer loads them.
std::vector<float> replica_gradients(const Model& model, Precision precision,
                                     Recompute recompute) {
  const bool lora = model.frozen_count() > 0;
  const std::vector<float> init =
      lora ? test::random_floats(model.param_count(), 7, -0.3, 0.3) : model.initial_parameters(7);
  const int batch = 3, context = model.inputs(), vocab = 32;
  std::vector<float> ids(static_cast<std::size_t>(batch) * context);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 7) % vocab);
  auto device = make_cpu_device(0, 1);
  Replica replica(*device, model, batch, precision, true, recompute);
  replica.load_parameters(init);
  if (lora) replica.load_frozen(model.initial_frozen(7));
  DeviceArray<float> x(*device, ids.size());
  x.upload(ids);
  const float* logits = replica.forward(x.data(), batch);
  const std::size_t n = static_cast<std::size_t>(batch) * model.outputs();
  DeviceArray<float> dlogits(*device, n);
  std::vector<float> host(n);
  device->copy_to_host(host.data(), logits, n * sizeof(float));
  for (float& v : host) v = std::isfinite(v) ? 0.01f * v : 0.0f;
  dlogits.upload(host);
  replica.zero_grads();
  replica.backward(x.data(), dlogits.data(), batch);
  replica.backward(x.data(), dlogits.data(), batch);  // again: the last block was rerun
  return replica.gradients();
}

// Small GPT-2 and Llama-family decoders.
std::vector<std::pair<const char*, GptSpec>> specs() {
  GptSpec llama{.vocab_size = 32, .context = 8, .n_layer = 3, .n_head = 4, .d_model = 16};
  llama.norm = NormKind::rmsnorm;
  llama.norm_eps = 1e-6;
  llama.positions = PositionKind::rope;
  llama.mlp = MlpKind::swiglu;
  llama.intermediate_size = 24;
  llama.n_kv_head = 2;
  llama.qkv_bias = true;
  llama.proj_bias = false;
  llama.tie_embeddings = false;
  return {{"gpt2", {.vocab_size = 32, .context = 8, .n_layer = 3, .n_head = 2, .d_model = 16}},
          {"llama", llama}};
}

// selective and full against none, fp32 and bf16.
void check_modes(const Model& model) {
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    CAPTURE(to_string(precision));
    const std::vector<float> none = replica_gradients(model, precision, Recompute::none);
    CHECK(replica_gradients(model, precision, Recompute::selective) == none);
    CHECK(replica_gradients(model, precision, Recompute::full) == none);
  }
}

}  // namespace

TEST_CASE("recompute selective and full: a replica's gradients are bit-identical to none's, "
          "GPT-2 and Llama blocks") {
  for (const auto& [name, spec] : specs())
    for (AttentionKind attention : {AttentionKind::fused, AttentionKind::materialized}) {
      const Model model = Model::gpt(spec, attention);
      CHECK(model.layers()[1]->recomputed_size(3, Precision::fp32) > 0);
      CAPTURE(std::string(name));
      CAPTURE(to_string(attention));
      check_modes(model);
    }
}

// With LoRA adapters on every projection (Note [LoRA] in src/model/lora.cpp): the rerun blocks
// read the frozen base (under bf16 its bf16 bits, the norms' weights and the biases widened
// again) and the adapters' kept u.
TEST_CASE("recompute selective and full with LoRA: a replica's gradients are bit-identical to "
          "none's, GPT-2 and Llama blocks, fp32 and bf16") {
  for (const auto& [name, spec] : specs())
    for (AttentionKind attention : {AttentionKind::fused, AttentionKind::materialized}) {
      const bool gpt2 = spec.norm == NormKind::layernorm;
      const Model model = Model::gpt(
          spec, attention, {.rank = 2, .alpha = 4.0,
                            .targets = gpt2 ? detail::gpt2_lora_target_names()
                                            : parse_lora_targets("all")});
      CAPTURE(std::string(name));
      CAPTURE(to_string(attention));
      check_modes(model);
    }
}

TEST_CASE("recompute full: a replica's gradients are bit-identical to keeping every block's") {
  const Model model = Model::gpt({.vocab_size = 32, .context = 8, .n_layer = 3, .n_head = 2,
                                  .d_model = 16},
                                 AttentionKind::fused);
  CHECK(model.recomputable(1));
  CHECK_FALSE(model.recomputable(0));  // the embedding
  CHECK_FALSE(model.recomputable(model.layers().size() - 1));  // the LM head
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    CAPTURE(to_string(precision));
    CHECK(replica_gradients(model, precision, Recompute::full) ==
          replica_gradients(model, precision, Recompute::none));
  }
}

TEST_CASE("recompute selective and full end bit-identical to none: bf16, attention, "
          "accumulation, ZeRO-2, Llama") {
  auto train = std::make_shared<TokenDataset>(test::token_stream(4000, 8, 1));
  const std::vector<std::pair<const char*, std::function<void(Config&)>>> variants = {
      {"fp32, materialised", [](Config& c) { c.model.attention = AttentionKind::materialized; }},
      {"bf16, fused, accumulate 2",
       [](Config& c) {
         c.trainer.precision = Precision::bf16;
         c.model.attention = AttentionKind::fused;
         c.trainer.accumulate_steps = 2;
       }},
      {"ZeRO-2, overlap off",
       [](Config& c) {
         c.trainer.zero = 2;
         c.trainer.overlap = false;
         c.trainer.bucket_cap_mb = 0.004;
       }},
      {"Llama, bf16, ZeRO-2 with overlap", [](Config& c) {
         Config llama = test::small_llama_config(2, 4);
         c.model = llama.model;
         c.model.n_layer = 3;
         c.trainer.precision = Precision::bf16;
         c.trainer.zero = 2;
         c.trainer.bucket_cap_mb = 0.004;
       }}};
  for (const auto& [name, apply] : variants) {
    CAPTURE(std::string(name));
    auto config = [&](Recompute recompute) {
      Config cfg = test::small_gpt_config(2, 4);
      cfg.model.n_layer = 3;
      apply(cfg);
      cfg.trainer.recompute = recompute;
      return cfg;
    };
    Trainer kept(config(Recompute::none), train, nullptr);
    std::vector<double> kept_norms;
    kept.on_step([&](const StepMetrics& m) { kept_norms.push_back(m.grad_norm); });
    const Summary k = kept.run();
    double previous = k.activation_bytes;
    for (Recompute mode : {Recompute::selective, Recompute::full}) {
      CAPTURE(to_string(mode));
      Trainer rerun(config(mode), train, nullptr);
      std::vector<double> rerun_norms;
      rerun.on_step([&](const StepMetrics& m) { rerun_norms.push_back(m.grad_norm); });
      const Summary r = rerun.run();
      CHECK(rerun.final_parameters() == kept.final_parameters());
      CHECK(r.final_train_loss == k.final_train_loss);
      CHECK(rerun_norms == kept_norms);
      CHECK(r.replicas_identical);
      CHECK(r.host_syncs_per_step == k.host_syncs_per_step);
      CHECK(r.activation_bytes < previous);  // selective below none, full below selective
      previous = r.activation_bytes;
    }
  }
}

TEST_CASE("memory plan: recompute full keeps one of GPT-2 124M's 12 blocks' saved activations, "
          "and a refusal for activations suggests it") {
  Config cfg = test::small_gpt_config(1, 8);
  cfg.model.vocab_size = 50257;
  cfg.model.context = 1024;
  cfg.model.n_layer = 12;
  cfg.model.n_head = 12;
  cfg.model.d_model = 768;
  cfg.model.attention = AttentionKind::fused;
  cfg.trainer.precision = Precision::bf16;
  const TokenDataset data(std::vector<std::uint16_t>(8 * 1024 + 1, 0), 1024, 50257);
  const Model model = make_model(cfg, data, "cpu");
  const auto plan = [&](Recompute recompute) {
    cfg.trainer.recompute = recompute;
    return detail::plan_memory(cfg, model, data, nullptr, true, 1);
  };
  const detail::MemoryPlan none = plan(Recompute::none), full = plan(Recompute::full);
  const detail::MemoryPlan selective = plan(Recompute::selective);
  // The blocks' saved values are most of none's; full keeps one block's, selective all but the
  // 4 fp32 (N, C)-equivalents of 8 that it recomputes under bf16 (res1, and the norms' and
  // GELU's outputs: Note [Recomputation]), and one block's of those.
  const Layer& layer = *model.layers()[1];
  const double block = 4.0 * static_cast<double>(layer.workspace_size(8, Precision::bf16));
  const double dropped = 4.0 * static_cast<double>(layer.recomputed_size(8, Precision::bf16));
  CHECK(none.activations - full.activations == 11 * block);
  CHECK(none.activations - selective.activations == 11 * dropped);
  CHECK(dropped == doctest::Approx(block * 4 / 8).epsilon(0.01));
  CHECK(12 * block > none.activations / 2);
  // Issue 45's goal, full at most a quarter of none: the final LayerNorm's output lives in an
  // activation gradient's buffer and the head rounds its input in its scratch (Note [Head
  // input] in src/model/model.cpp), and a block with a din and the fused path keeps its rounded
  // gradients in din and grad16 (Note [Backward scratch lifetimes] in src/model/gpt.cpp).
  CHECK(model.head_input_in_gradient());
  CHECK(full.activations <= none.activations / 4);
  // No fp32 copy of the logits: 8 x 1024 x 50304 bf16 values are 786 MiB, and every other
  // activation together is less than twice that.
  CHECK(none.activations < 3 * 8.0 * 1024 * 50304 * 2 + 12 * block);
  CHECK(detail::describe(full, {.bytes = 1e12, .source = "test"})
            .find("with trainer.recompute full") != std::string::npos);
  const detail::MemoryLimit limit{.bytes = none.host() * 0.9, .source = "test"};
  try {
    detail::check_memory_plan(none, limit, cfg);
    FAIL("no InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("trainer.recompute: full") != std::string::npos);
  }
  CHECK_NOTHROW(detail::check_memory_plan(full, limit, cfg));
  CHECK(detail::describe(selective, {.bytes = 1e12, .source = "test"})
            .find("with trainer.recompute selective") != std::string::npos);
}

TEST_CASE("memory plan: a replica allocates the activation bytes the plan gives, each recompute "
          "mode, fp32 and bf16, GPT-2 and Llama") {
  for (const bool llama : {false, true})
    for (Precision precision : {Precision::fp32, Precision::bf16})
      for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
        CAPTURE(llama);
        CAPTURE(to_string(precision));
        CAPTURE(to_string(mode));
        Config cfg = llama ? test::small_llama_config(1, 4) : test::small_gpt_config(1, 4);
        cfg.model.n_layer = 3;
        cfg.trainer.precision = precision;
        cfg.trainer.recompute = mode;
        const TokenDataset data = test::token_stream(400, 8, 1);
        const Model model = make_model(cfg, data, "cpu");
        const detail::MemoryPlan plan = detail::plan_memory(cfg, model, data, nullptr, true, 1);
        auto device = make_cpu_device(0, 1);
        const Replica replica(*device, model, 4, precision, true, mode);
        // An LM head fused with the loss leaves the worker no fp32 dlogits to count.
        CHECK(plan.activations == static_cast<double>(replica.activation_bytes()));
      }
}
