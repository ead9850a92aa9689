// A LoRA checkpoint with its base (Note [LoRA exports] in lora_checkpoint.cpp): what export,
// sample and eval read to use the adapters.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lockstep/checkpoint.hpp"
#include "lockstep/model.hpp"

namespace lockstep::detail {

struct LoraCheckpoint {
  Model model;                    // the LoRA model: param_tensors() the adapters, frozen the base
  LoraSpec lora;
  std::vector<float> base;        // model.frozen_tensors()' values, checked by content hash
  std::string base_source;        // the weights file the base came from, or "seed=N"
};

// nullopt when `ckpt` records no "lockstep.lora". Otherwise its model, the adapters' layout
// checked, and its base read again from where it came from, its content hash checked against
// the recorded one. InputError naming the checkpoint's file when a record is missing or
// malformed, the base cannot be read there, or its hash differs; `way_out` (when not empty)
// ends those two messages ("sample the merged model that ... writes").
std::optional<LoraCheckpoint> lora_checkpoint(const Checkpoint& ckpt,
                                              const std::string& way_out = {});

// `ckpt`, a LoRA checkpoint of `lora`, made a checkpoint of the model without adapters in
// place: its tensors the base's, its parameters `params` in their layout (merged(): the merged
// weights), the LoRA records gone.
void as_full_model(Checkpoint& ckpt, const LoraCheckpoint& lora, std::vector<float> params);
// W + (alpha / r) B A for every target, from `ckpt`'s adapters (merge_lora).
std::vector<float> merged(const Checkpoint& ckpt, const LoraCheckpoint& lora);

}  // namespace lockstep::detail
