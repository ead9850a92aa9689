// LoRA's target names by decoder family (lockstep/model.hpp's parse_lora_targets is the Llama
// family's, and reads a GPT-2 list too when every name in it is GPT-2's).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lockstep::detail {

// GPT-2's projections in the order a block's adapters are stored, by the module paths PEFT's
// suffix match maps to exactly one module each: "c_attn" (q|k|v, C -> 3C), "attn.c_proj"
// (C -> C), "c_fc" (C -> 4C), "mlp.c_proj" (4C -> C). In a list "c_proj" names both c_proj, as
// PEFT's suffix match does.
const std::vector<std::string>& gpt2_lora_target_names();
// "c_attn,c_fc" (model.lora.targets) as names in storage order, "all" as every one, for GPT-2
// (gpt2) or the Llama family; throws std::invalid_argument naming an unknown or repeated name
// and the valid ones.
std::vector<std::string> parse_lora_targets(std::string_view text, bool gpt2);

}  // namespace lockstep::detail
