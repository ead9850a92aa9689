// The decoder's part keys (model.family and what it presets, Note [Model families] in
// src/config/schema.hpp): presets, overrides of them, keys that do not apply, the hash of a GPT-2
// config unchanged by the keys' existence, and the rendering.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "lockstep/config.hpp"

using namespace lockstep;

namespace {

const std::string kGpt =
    "model: {type: gpt, context: 16, n_layer: 2, n_head: 4, d_model: 32}\n"
    "data: {dataset: text, path: book.txt}\ntrainer: {steps: 5}\n";

Config parse(const std::vector<std::string>& overrides) {
  return parse_config(kGpt, "f.yaml", overrides);
}

std::string error_of(const std::vector<std::string>& overrides) {
  try {
    parse(overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL_CHECK("no ConfigError");
  return "";
}

}  // namespace

TEST_CASE("config: model.family presets the decoder's parts as transformers' configs do") {
  const Config gpt2 = parse({});
  CHECK(gpt2.model.family == ModelFamily::gpt2);
  CHECK(gpt2.model.norm == NormKind::layernorm);
  CHECK(gpt2.model.positions == PositionKind::learned);
  CHECK(gpt2.model.mlp == MlpKind::gelu);
  CHECK((gpt2.model.qkv_bias && gpt2.model.proj_bias && gpt2.model.tie_embeddings));

  const Config llama = parse({"model.family=llama"});
  CHECK(llama.model.norm == NormKind::rmsnorm);
  CHECK(llama.model.norm_eps == 1e-6);
  CHECK(llama.model.positions == PositionKind::rope);
  CHECK(llama.model.rope_theta == 10000.0);
  CHECK(llama.model.mlp == MlpKind::swiglu);
  CHECK((!llama.model.qkv_bias && !llama.model.proj_bias && !llama.model.tie_embeddings));
  CHECK(llama.model.rope_scaling.type == RopeScalingKind::none);
  // A preset's values are defaults: Config::set_at lists what the user set only.
  CHECK(llama.set_at.count("model.family") == 1);
  CHECK(llama.set_at.count("model.norm") == 0);

  const Config qwen2 = parse({"model.family=qwen2"});
  CHECK(qwen2.model.qkv_bias);
  CHECK(!qwen2.model.proj_bias);
  const Config mistral = parse({"model.family=mistral"});
  CHECK(mistral.model.norm == NormKind::rmsnorm);
  CHECK(!mistral.model.qkv_bias);
}

TEST_CASE("config: a key the user sets wins over the family's preset, from the file or --set") {
  const Config c = parse_config(
      "model: {type: gpt, family: llama, tie_embeddings: true, norm_eps: 1e-5, context: 16,\n"
      "        n_head: 4, d_model: 32, intermediate_size: 80, rope_theta: 100000,\n"
      "        rope_scaling: {type: llama3, factor: 32}}\n"
      "data: {dataset: text, path: book.txt}\ntrainer: {steps: 5}\n",
      "f.yaml", std::vector<std::string>{"model.qkv_bias=true"});
  CHECK(c.model.tie_embeddings);
  CHECK(c.model.norm_eps == 1e-5);
  CHECK(c.model.intermediate_size == 80);
  CHECK(c.model.rope_theta == 100000.0);
  CHECK(c.model.qkv_bias);
  CHECK(!c.model.proj_bias);  // the preset's
  CHECK(c.model.rope_scaling.type == RopeScalingKind::llama3);
  CHECK(c.model.rope_scaling.factor == 32.0);
  CHECK(c.model.rope_scaling.high_freq_factor == 4.0);
}

TEST_CASE("config: decoder keys that do not apply, mixes of parts and bad values are refused") {
  CHECK(error_of({"model.rope_theta=500000"}).find(
            "--set model.rope_theta=500000: model.rope_theta: applies to model.positions rope") !=
        std::string::npos);
  CHECK(error_of({"model.rope_scaling.type=llama3"}).find("model.rope_scaling.type: applies to "
                                                          "model.positions rope") !=
        std::string::npos);
  CHECK(error_of({"model.norm_eps=1e-6"}).find("model.norm_eps: applies to rmsnorm") !=
        std::string::npos);
  CHECK(error_of({"model.intermediate_size=100"}).find("model.intermediate_size: applies to "
                                                       "model.mlp swiglu") != std::string::npos);
  CHECK(error_of({"model.qkv_bias=false"}).find("model.qkv_bias: GPT-2's parts have every bias") !=
        std::string::npos);
  CHECK(error_of({"model.tie_embeddings=false"}).find("model.tie_embeddings:") !=
        std::string::npos);
  CHECK(error_of({"model.family=llama", "model.positions=learned"})
            .find("other mixes are not implemented") != std::string::npos);
  CHECK(error_of({"model.family=llama", "model.n_kv_head=3"})
            .find("model.n_kv_head: must divide model.n_head (4") != std::string::npos);
  CHECK(error_of({"model.family=lama"}).find("model.family: expected one of gpt2, llama, qwen2, "
                                             "mistral, got 'lama'") != std::string::npos);
  CHECK(error_of({"model.family=llama", "model.head_dim=5"}).find("must be even") !=
        std::string::npos);
  CHECK(error_of({"model.family=llama", "model.rope_scaling.type=llama3",
                  "model.rope_scaling.high_freq_factor=0.5"})
            .find("model.rope_scaling.high_freq_factor: must be > "
                  "model.rope_scaling.low_freq_factor (1)") != std::string::npos);
  CHECK(parse({"model.family=llama", "model.n_kv_head=2"}).model.n_kv_head == 2);
  // A head size of its own frees d_model from being a multiple of n_head.
  CHECK(parse({"model.family=llama", "model.d_model=30", "model.head_dim=8"}).model.head_dim == 8);
}

TEST_CASE("config: the decoder keys keep a GPT-2 config's hash, and enter it when they differ") {
  const Config plain = parse({});
  const Config gpt2 = parse({"model.family=gpt2"});
  CHECK(config_hash(plain) == config_hash(gpt2));
  const Config llama = parse({"model.family=llama"});
  CHECK(config_hash(llama) != config_hash(plain));
  CHECK(config_hash(parse({"model.family=llama", "model.rope_theta=20000"})) !=
        config_hash(llama));
  CHECK(config_hash(parse({"model.family=llama", "model.rope_scaling.type=llama3"})) !=
        config_hash(llama));
  // Every key is listed, at its default too.
  bool listed = false;
  for (const auto& [key, value] : config_values(plain))
    listed = listed || (key == "model.rope_scaling.factor" && value == "8");
  CHECK(listed);
  // The rendering reads back to the same settings.
  const Config back = parse_config(to_yaml(llama), "back.yaml");
  CHECK(back.model.norm == NormKind::rmsnorm);
  CHECK(back.model.family == ModelFamily::llama);
  CHECK(config_hash(back) == config_hash(llama));
}
