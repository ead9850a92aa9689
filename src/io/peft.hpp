// PEFT's LoRA adapter directories (what PeftModel.save_pretrained writes): adapter_config.json
// and adapter_model.safetensors, whose tensors are the model's LoRA parameters under PEFT's
// wrapper prefix ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"). Note
// [PEFT adapters] in peft.cpp.
#pragma once

#include <filesystem>
#include <span>
#include <string>

#include "lockstep/checkpoint.hpp"
#include "lockstep/model.hpp"

namespace lockstep::detail {

inline constexpr std::string_view kPeftConfigName = "adapter_config.json";
inline constexpr std::string_view kPeftWeightsName = "adapter_model.safetensors";

// True for a directory holding adapter_config.json.
bool is_peft_dir(const std::filesystem::path& path);

struct PeftAdapter {
  LoraSpec lora;                 // r, lora_alpha, target_modules
  double dropout = 0.0;          // lora_dropout
  std::string base;              // base_model_name_or_path, as written
  std::vector<float> adapters;   // in the layout of the model's param_tensors()
  std::filesystem::path file;    // the weights file, for messages
};

// The adapter config alone (adapters left empty). InputError naming the file and the key.
PeftAdapter read_peft_config(const std::filesystem::path& dir);
// The adapter, its tensors matched by name to `expected` (a LoRA model's param_tensors()).
PeftAdapter read_peft_adapter(const std::filesystem::path& dir,
                              std::span<const ParamTensor> expected);

// Writes `adapters` (in `tensors`' layout) as a PEFT adapter directory for `base`; creates dir.
void write_peft_adapter(const std::filesystem::path& dir, std::span<const ParamTensor> tensors,
                        std::span<const float> adapters, const LoraSpec& lora,
                        const std::string& base);

}  // namespace lockstep::detail
