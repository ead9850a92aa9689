// Hugging Face GPT-2 directories (transformers.GPT2LMHeadModel.save_pretrained's layout):
// model.safetensors and config.json. See Note [Hugging Face GPT-2] in hf_gpt2.cpp.
#pragma once

#include <filesystem>

#include "lockstep/checkpoint.hpp"

namespace lockstep::detail {

// True for a directory holding config.json and model.safetensors, or for a model.safetensors
// with a config.json beside it.
bool is_hf_gpt2(const std::filesystem::path& path);

// The architecture config.json (beside or in `path`) gives; `file` is set to config.json.
GptSpec read_hf_gpt2_spec(const std::filesystem::path& path, std::filesystem::path& file);

// The weights of such a directory in lockstep's names and (out, in) layout, with
// "lockstep.model" in the metadata from config.json. `file` is set to the safetensors file.
// InputError for a config.json that is not GPT-2's (another activation, a missing key).
SafetensorsFile read_hf_gpt2(const std::filesystem::path& path, std::filesystem::path& file);

}  // namespace lockstep::detail
