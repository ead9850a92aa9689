// A Hugging Face config.json as lockstep's model keys, and back: GPT2LMHeadModel and the Llama
// family (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM). See Note [Hugging Face
// config.json] in hf_config.cpp.
//
//   const detail::HfConfig hf = detail::read_hf_config("llama/config.json");
//   for (const auto& [key, value] : hf.model_keys()) ...   // {"family", "llama"}, {"n_layer", "16"}, ...
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/json.hpp"
#include "model/rope.hpp"

namespace lockstep::detail {

// What config.json says of the model, in the terms of lockstep's model keys.
struct HfConfig {
  std::string family;        // gpt2, llama, qwen2 or mistral
  std::string architecture;  // GPT2LMHeadModel, LlamaForCausalLM, ...
  int vocab_size = 0;
  int context = 0;           // n_positions (gpt2), max_position_embeddings
  int n_layer = 0;
  int n_head = 0;
  int d_model = 0;
  // The Llama family's; GPT-2's are its fixed choices (LayerNorm, learned positions, GELU).
  int n_kv_head = 0;         // num_key_value_heads, n_head when absent
  int head_dim = 0;          // d_model / n_head when absent
  int intermediate_size = 0;
  double norm_eps = 1e-5;    // layer_norm_epsilon (gpt2) or rms_norm_eps
  double rope_theta = 10000;
  std::optional<Llama3Scaling> rope_scaling;  // rope_type llama3 (Llama 3.1 and 3.2)
  bool qkv_bias = false;     // attention_bias (llama); always (qwen2)
  bool proj_bias = false;    // attention_bias (llama): the output projection's too
  bool tie_embeddings = true;
  // Mistral's sliding_window: attention limited to this many past tokens, which lockstep does
  // not model; a run's context may not exceed it (WeightsModel::max_context).
  std::optional<int> sliding_window;
  std::vector<int> bos_token_ids, eos_token_ids;  // an int or a list in the file

  bool is_gpt2() const { return family == "gpt2"; }
  // The model.* keys (without "model.") and their values as YAML text, in the order of the
  // config's schema: what `train --init-from` takes for the keys a config does not set.
  std::vector<std::pair<std::string, std::string>> model_keys() const;
};

// The JSON of a small file (config.json, the shards' index); InputError naming the file and the
// offset of a syntax error.
JsonValue read_json_file(const std::filesystem::path& file);

// Reads and checks `file`. InputError naming the file and the field for what lockstep does not
// model: another architecture, another activation, a RoPE scaling other than llama3, sliding
// windows (Qwen2's use_sliding_window), mixtures of experts, q/k norms, MLP biases.
HfConfig read_hf_config(const std::filesystem::path& file);

// config.json for `config` as transformers' from_pretrained reads it; `torch_dtype` "float32"
// or "bfloat16".
std::string hf_config_json(const HfConfig& config, std::string_view torch_dtype);

// generation_config.json: the bos and eos ids, as transformers' GenerationConfig writes them.
std::string hf_generation_config_json(const HfConfig& config);

}  // namespace lockstep::detail
