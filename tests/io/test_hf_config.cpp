// Hugging Face config.json as lockstep's model keys (read_hf_config, src/io/hf_config.cpp): what
// each architecture gives, the refusals of what lockstep does not model, each naming the field,
// and config.json written for export read back to the same keys.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint_fixtures.hpp"
#include "io/hf_config.hpp"

namespace fs = std::filesystem;
using lockstep::detail::HfConfig;
using lockstep::detail::read_hf_config;
using lockstep::test::TempDir;

namespace {

// The keys as "key=value" lines, one string.
std::string keys_of(const HfConfig& c) {
  std::vector<std::string> lines;
  for (const auto& [key, value] : c.model_keys()) lines.push_back(key + "=" + value);
  return fmt::format("{}", fmt::join(lines, "\n"));
}

HfConfig read_text(const TempDir& dir, const std::string& json) {
  return read_hf_config(dir.write("config.json", json));
}

// A config.json's fields around `extra` ("" or fields with a trailing comma).
std::string llama_json(const std::string& extra, const std::string& type = "llama",
                       const std::string& arch = "LlamaForCausalLM") {
  return fmt::format(R"({{"architectures": ["{}"], "model_type": "{}", {} "vocab_size": 128256,
      "max_position_embeddings": 131072, "hidden_size": 2048, "intermediate_size": 8192,
      "num_hidden_layers": 16, "num_attention_heads": 32}})",
                     arch, type, extra);
}

}  // namespace

TEST_CASE("hf config: Llama 3.2's config.json gives every model key, GQA and llama3 scaling") {
  const TempDir dir;
  const HfConfig c = read_text(dir, llama_json(R"("num_key_value_heads": 8, "head_dim": 64,
      "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": true,
      "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"},
      "attention_bias": false, "mlp_bias": false, "bos_token_id": 128000,
      "eos_token_id": [128001, 128008, 128009], "pretraining_tp": 1, "attention_dropout": 0.0,
      "hidden_act": "silu",)"));
  CHECK(keys_of(c) ==
        "family=llama\nvocab_size=128256\ncontext=131072\nn_layer=16\nn_head=32\nd_model=2048\n"
        "norm=rmsnorm\nnorm_eps=1e-05\npositions=rope\nrope_theta=500000\n"
        "rope_scaling.type=llama3\nmlp=swiglu\nintermediate_size=8192\n"
        "n_kv_head=8\nhead_dim=64\nqkv_bias=false\nproj_bias=false\ntie_embeddings=true\n"
        "rope_scaling.factor=32\nrope_scaling.low_freq_factor=1\nrope_scaling.high_freq_factor=4\n"
        "rope_scaling.original_max_position_embeddings=8192");
  CHECK(c.bos_token_ids == std::vector<int>{128000});
  CHECK(c.eos_token_ids == std::vector<int>{128001, 128008, 128009});

  // transformers 5's rope_parameters carries rope_theta; attention_bias puts a bias on q, k, v and o.
  const HfConfig v5 = read_text(dir, llama_json(R"("rope_parameters": {"rope_type": "llama3",
      "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, "attention_bias": true,)"));
  CHECK(v5.rope_theta == 500000.0);
  CHECK(v5.rope_scaling->factor == 8.0);
  CHECK(v5.qkv_bias);
  CHECK(v5.proj_bias);
  CHECK(v5.n_kv_head == 32);  // num_key_value_heads absent: the head count
  CHECK(v5.head_dim == 64);   // head_dim absent: hidden_size / heads
  CHECK(!v5.tie_embeddings);  // LlamaConfig's default
  CHECK(v5.norm_eps == 1e-6);
  const HfConfig plain = read_text(dir, llama_json(R"("rope_scaling": null, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},)"));
  CHECK(!plain.rope_scaling);
}

TEST_CASE("hf config: Qwen2 has q, k, v biases, Mistral its sliding window and GPT-2 its five keys") {
  const TempDir dir;
  const HfConfig qwen = read_text(dir, llama_json(R"("num_key_value_heads": 2,
      "use_sliding_window": false, "sliding_window": 32768, "max_window_layers": 21,
      "tie_word_embeddings": true, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,)",
                                                   "qwen2", "Qwen2ForCausalLM"));
  CHECK(qwen.family == "qwen2");
  CHECK(qwen.qkv_bias);
  CHECK(!qwen.proj_bias);
  CHECK(!qwen.sliding_window);  // use_sliding_window false: no window
  const HfConfig mistral = read_text(dir, llama_json(R"("num_key_value_heads": 8, "sliding_window": 4096,)",
                                                      "mistral", "MistralForCausalLM"));
  CHECK(mistral.sliding_window == 4096);
  CHECK(!mistral.qkv_bias);
  CHECK(read_text(dir, llama_json(R"("sliding_window": null,)", "mistral", "MistralForCausalLM"))
            .sliding_window == std::nullopt);

  const HfConfig gpt2 = read_text(dir, R"({"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
      "n_embd": 768, "n_layer": 12, "n_head": 12, "activation_function": "gelu_new", "eos_token_id": 50256})");
  CHECK(keys_of(gpt2) == "vocab_size=50257\ncontext=1024\nn_layer=12\nn_head=12\nd_model=768");
  CHECK(gpt2.eos_token_ids == std::vector<int>{50256});
}

TEST_CASE("hf config: what lockstep does not model is refused, naming the field") {
  const TempDir dir;
  const std::pair<std::string, std::string> cases[] = {
      {llama_json(R"("hidden_act": "gelu",)"), "hidden_act: expected \"silu\""},
      {llama_json(R"("mlp_bias": true,)"), "mlp_bias: expected false"},
      {llama_json(R"("num_key_value_heads": 5,)"), "num_key_value_heads: expected a divisor of num_attention_heads (32), got 5"},
      {llama_json(R"("rope_scaling": {"type": "linear", "factor": 2.0},)"), "rope_scaling.rope_type: expected \"llama3\" or \"default\" (the RoPE scalings lockstep computes), got linear"},
      {llama_json(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0},)"), "rope_scaling.rope_type: expected \"llama3\" or \"default\" (the RoPE scalings lockstep computes), got yarn"},
      {llama_json(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0},)"), "rope_scaling.low_freq_factor: missing"},
      {llama_json(R"("use_sliding_window": true,)", "qwen2", "Qwen2ForCausalLM"), "use_sliding_window: expected false"},
      {llama_json(R"("num_local_experts": 8,)", "mistral", "MistralForCausalLM"), "num_local_experts: a mixture of experts"},
      {llama_json(R"("num_experts": 60,)", "qwen2", "Qwen2ForCausalLM"), "num_experts: a mixture of experts"},
      {llama_json(R"("use_qk_norm": true,)"), "use_qk_norm: q/k norms"},
      {llama_json("", "qwen3", "Qwen3ForCausalLM"), "model_type: expected one of gpt2, llama, qwen2, mistral (the architectures lockstep models), got \"qwen3\""},
      {llama_json("", "llama", "LlamaForSequenceClassification"), "architectures: expected [\"LlamaForCausalLM\"] for model_type \"llama\""},
      {R"({"model_type": "llama", "vocab_size": 0})", "vocab_size: expected a positive integer, got 0"},
      {R"({"model_type": "llama", "vocab_size": 10})", "max_position_embeddings: missing (a LlamaForCausalLM config.json has it)"},
      {R"({"model_type": "gpt2", "vocab_size": 10, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 2, "activation_function": "relu"})", "activation_function: expected \"gelu_new\""},
      {llama_json(R"("eos_token_id": "</s>",)"), "eos_token_id: expected a token id (an integer >= 0) or a list of them, got a string </s>"},
  };
  for (const auto& [json, message] : cases) {
    CAPTURE(json);
    const fs::path file = dir.write("config.json", json);
    const std::string error = lockstep::test::input_error_of([&] { read_hf_config(file); });
    CHECK_MESSAGE(error.starts_with(file.string() + ": " + message), error);
  }
}

TEST_CASE("hf config: the config.json export writes reads back to the same keys, for every family") {
  const TempDir dir;
  for (const std::string& json :
       {llama_json(R"("num_key_value_heads": 8, "tie_word_embeddings": true, "attention_bias": true,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "bos_token_id": 1, "eos_token_id": [2, 3],)"),
        llama_json(R"("num_key_value_heads": 2, "rms_norm_eps": 1e-06,)", "qwen2", "Qwen2ForCausalLM"),
        llama_json(R"("rope_theta": 1000000.0,)", "mistral", "MistralForCausalLM"),
        std::string(R"({"model_type": "gpt2", "vocab_size": 300, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 4})")}) {
    CAPTURE(json);
    const HfConfig first = read_text(dir, json);
    const HfConfig again = read_text(dir, lockstep::detail::hf_config_json(first, "float32"));
    CHECK(keys_of(again) == keys_of(first));
    CHECK(again.architecture == first.architecture);
    CHECK(again.bos_token_ids == first.bos_token_ids);
    CHECK(again.eos_token_ids == first.eos_token_ids);
  }
}
