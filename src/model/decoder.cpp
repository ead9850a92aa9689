// Model::gpt: one decoder described by its spec, GPT-2 or a Llama-family model, from the layers
// of gpt.cpp (GPT-2's embedding, block and LayerNorm), token_embedding.cpp, llama_block.cpp,
// rmsnorm.cpp and lm_head.cpp.
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lockstep/model.hpp"
#include "model/lora.hpp"
#include "model/rope.hpp"

namespace lockstep {

// Note [One decoder]
// ~~~~~~~~~~~~~~~~~~
// GPT-2 and the Llama family (Llama 2 and 3, Qwen2, Mistral, SmolLM2) are one decoder whose
// parts the spec chooses (GptSpec; the config's model.* keys, with model.family a preset of them,
// Note [Model families] in src/config/schema.hpp), as LitGPT describes every family by one
// Config: a family is data, not a class.
//   part        GPT-2 (gpt.cpp)                     Llama family
//   embedding   wte + wpe (learned positions)       embed_tokens only (token_embedding.cpp)
//   block       LayerNorm, MHA, 4C GELU MLP,        RMSNorm, GQA with RoPE on q and k, SwiGLU
//               every bias (Block)                  (F wide); q/k/v and projection biases
//                                                   as the spec says (llama_block.cpp)
//   final norm  LayerNorm (weight, bias)            RMSNorm (weight; rmsnorm.cpp)
//   LM head     tied to wte                         tied to embed_tokens or its own weight
//                                                   (lm_head.cpp, Note [Padded vocabulary])
// The parts come in these two sets: GPT-2's keep its names, layout, initialisation and bits, and
// the Llama set is Hugging Face's layout, so that a checkpoint copies in by name. Mixes of the
// two (a LayerNorm with RoPE, say) are refused by the config and here; they would need blocks no
// family uses. Both blocks share what a decoder block is made of: the attention paths
// (model/attention.hpp), the fused linear op, the residual-fused norms (Note [Residual
// LayerNorm]), and the bf16 rounding points (Note [bf16 compute]), so fp32, tf32, bf16, fused
// and materialised attention, the memory plan and the trainer treat either alike.

// Note [Layer constants]
// ~~~~~~~~~~~~~~~~~~~~~~
// A Llama block reads RoPE's cos and sin tables (positions x head_size / 2 each), which depend
// on the spec alone. They are made once per model on the host (make_rope_constants, transformers'
// formulas, Note [RoPE tables]), and every block of the model holds the same shared table as its
// Layer::constants(). A Replica, when it is built, uploads each distinct table once to its
// device (so one copy per worker, not one per block nor per step) and hands it to the layers as
// LayerWorkspace::constants; nothing in a step computes or copies them. The constants are not
// parameters: they have no gradient, no optimiser state, and are neither checkpointed nor
// reduced (a checkpoint's spec rebuilds them). The memory plan counts them per worker.

RopeConstants make_rope_constants(const GptSpec& spec) {
  const int head_size = spec.head_size();
  detail::RopeFrequencies frequencies{.theta = spec.rope_theta, .llama3 = spec.rope_scaling};
  detail::RopeTables tables = detail::rope_tables(frequencies, head_size, spec.context);
  auto table = std::make_shared<std::vector<float>>(std::move(tables.cos));
  table->insert(table->end(), tables.sin.begin(), tables.sin.end());
  return {std::move(table), spec.context, head_size / 2};
}

namespace {

void check_spec(const GptSpec& spec) {
  const auto positive = [](const char* key, int v) {
    if (v < 1) throw std::invalid_argument(fmt::format("gpt: {} must be at least 1, got {}", key, v));
  };
  positive("vocab_size", spec.vocab_size);
  positive("context", spec.context);
  positive("n_layer", spec.n_layer);
  positive("n_head", spec.n_head);
  positive("d_model", spec.d_model);
  if (spec.head_dim == 0 && spec.d_model % spec.n_head != 0)
    throw std::invalid_argument(fmt::format("gpt: d_model {} is not a multiple of n_head {}",
                                            spec.d_model, spec.n_head));
  if (spec.vocab_size > (1 << 24))
    throw std::invalid_argument(fmt::format(
        "gpt: vocab_size {} is above 2^24, the largest token id a float carries exactly",
        spec.vocab_size));
  const bool gpt2 = spec.norm == NormKind::layernorm && spec.positions == PositionKind::learned &&
                    spec.mlp == MlpKind::gelu;
  const bool llama = spec.norm == NormKind::rmsnorm && spec.positions == PositionKind::rope &&
                     spec.mlp == MlpKind::swiglu;
  if (!gpt2 && !llama)
    throw std::invalid_argument(fmt::format(
        "gpt: norm {}, positions {}, mlp {}: the parts are GPT-2's (layernorm, learned, gelu) or "
        "the Llama family's (rmsnorm, rope, swiglu) (Note [One decoder])",
        to_string(spec.norm), to_string(spec.positions), to_string(spec.mlp)));
  if (gpt2 && (spec.norm_eps != 1e-5 || spec.rope_scaling || spec.hidden_size() != 4 * spec.d_model ||
               spec.kv_heads() != spec.n_head || spec.head_size() * spec.n_head != spec.d_model ||
               !spec.qkv_bias || !spec.proj_bias || !spec.tie_embeddings))
    throw std::invalid_argument(fmt::format(
        "gpt: '{}' changes a setting GPT-2's parts do not have (Note [One decoder])",
        to_string(spec)));
  if (llama) {
    if (spec.n_kv_head < 0 || spec.head_dim < 0 || spec.intermediate_size < 0 ||
        spec.n_head % spec.kv_heads() != 0)
      throw std::invalid_argument(fmt::format(
          "gpt: n_kv_head {} must divide n_head {}", spec.kv_heads(), spec.n_head));
    if (!(spec.norm_eps > 0.0))
      throw std::invalid_argument(fmt::format("gpt: norm_eps {} is not > 0", spec.norm_eps));
  }
}

// The blocks (layers 1 to n_layer, after the embedding) are what trainer.recompute: full reruns
// in backward (Note [Recomputation] in src/model/model.cpp).
Model with_recomputable_blocks(Model model, int n_layer) {
  for (int i = 1; i <= n_layer; ++i) model.mark_recomputable(static_cast<std::size_t>(i));
  return model;
}

}  // namespace

Model Model::gpt(const GptSpec& spec, AttentionKind attention, const LoraSpec& lora) {
  check_spec(spec);
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<std::string> names;
  const auto add = [&](std::unique_ptr<Layer> layer, std::string name) {
    layers.push_back(std::move(layer));
    names.push_back(std::move(name));
  };
  const int v = spec.vocab_size, t = spec.context, c = spec.d_model;
  // LoRA: every layer but the blocks is frozen whole; a block freezes its base and trains its
  // adapters (Note [LoRA] in lora.cpp).
  const auto frozen = [&](std::unique_ptr<Layer> layer) {
    return lora.enabled() ? make_frozen(std::move(layer)) : std::move(layer);
  };
  if (!spec.llama_parts()) {
    add(frozen(make_embedding(v, t, c)), "transformer");
    for (int i = 0; i < spec.n_layer; ++i)
      add(detail::make_gpt_block(t, c, spec.n_head, spec.n_layer, attention, lora),
          fmt::format("transformer.h.{}", i));
    add(frozen(make_layernorm(t, c)), "transformer.ln_f");
    add(frozen(make_tied_lm_head(0, v, t, c)), "lm_head");
    return with_recomputable_blocks(Model(std::move(layers), std::move(names)), spec.n_layer);
  }
  const RopeConstants rope = make_rope_constants(spec);
  add(frozen(make_token_embedding(v, t, c)), "model");
  for (int i = 0; i < spec.n_layer; ++i)
    add(make_llama_block(spec, attention, rope, lora), fmt::format("model.layers.{}", i));
  add(frozen(make_rmsnorm(t, c, spec.norm_eps)), "model.norm");
  add(frozen(spec.tie_embeddings ? make_tied_lm_head(0, v, t, c) : make_lm_head(v, t, c)),
      "lm_head");
  return with_recomputable_blocks(Model(std::move(layers), std::move(names)), spec.n_layer);
}

}  // namespace lockstep
