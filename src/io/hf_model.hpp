// Hugging Face model directories (what save_pretrained writes): config.json, the weights in
// model.safetensors or in shards named by model.safetensors.index.json, and the tokenizer's
// files. GPT2LMHeadModel and the Llama family (LlamaForCausalLM, Qwen2ForCausalLM,
// MistralForCausalLM). See Note [Hugging Face GPT-2] and Note [Hugging Face exports] in
// hf_model.cpp, Note [Hugging Face config.json] in hf_config.cpp, Note [Hugging Face shards] in
// hf_weights.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/hf_config.hpp"
#include "lockstep/checkpoint.hpp"

namespace lockstep::detail {

// True for a directory holding config.json (its weights are model.safetensors or
// model.safetensors.index.json's shards; HfWeights says when neither is there), or for either
// weights file with a config.json beside it.
bool is_hf_dir(const std::filesystem::path& path);

// The config.json of such a path; `file` is set to it.
HfConfig read_hf_dir_config(const std::filesystem::path& path, std::filesystem::path& file);

// The decoder `config` describes (model.family's parts, Hugging Face's sizes).
GptSpec gpt_spec_of(const HfConfig& config);

// The weights of such a path in the layout of `expected` (Model::param_tensors()), read tensor
// by tensor into Weights::params; "lockstep.model" in the metadata for a GPT-2. InputError
// naming the file and tensor (load_hf_tensors in hf_weights.hpp).
Weights load_hf_weights(const std::filesystem::path& path, std::span<const ParamTensor> expected);

// The token ids a checkpoint records under `key` ("lockstep.eos_token_ids"; Note [Hugging Face
// token ids] in hf_model.cpp), empty when it records none; InputError naming the file when the
// value is not a JSON array of ids.
std::vector<int> recorded_ids(const Checkpoint& ckpt, const std::string& key);

// Hugging Face's max_shard_size: an integer of bytes, or one with a unit, "5GB" (10^9 bytes),
// "500MB", "100KB", "2GiB" (2^30), "512MiB", "64KiB". std::invalid_argument for anything else.
std::uint64_t parse_shard_size(std::string_view text);

}  // namespace lockstep::detail
