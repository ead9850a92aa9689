// PEFT adapter directories: reading (--init-from) and writing (export --format peft).
#include "io/peft.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/durable_file.hpp"
#include "io/json.hpp"
#include "lockstep/error.hpp"
#include "model/lora_targets.hpp"

namespace lockstep::detail {
namespace fs = std::filesystem;

// Note [PEFT adapters]
// ~~~~~~~~~~~~~~~~~~~~
// PEFT (0.10) saves a LoRA adapter as adapter_config.json (peft_type LORA, r, lora_alpha,
// target_modules, lora_dropout, base_model_name_or_path, ...) and adapter_model.safetensors,
// whose keys are the adapted modules' names under its wrapper, "base_model.model." + the
// transformers name, with the adapter name removed: "...q_proj.lora_A.weight" (r, in) and
// "...lora_B.weight" (out, r), as torch.nn.Linear weights. A LoRA model's parameters have the
// same names without the prefix (Note [LoRA] in src/model/lora.cpp), so reading and writing
// are a rename. PEFT scales by lora_alpha / r (use_rslora false, which is all we read).
// On GPT-2 PEFT wraps transformers' Conv1D, whose weight is (in, out), and sets fan_in_fan_out
// (its config then says true), yet its lora_A and lora_B are still Linear weights, (r, in) and
// (out, r): the same tensors as on a Linear, so only the flag differs. Its target_modules match
// by suffix, so lockstep writes "attn.c_proj" and "mlp.c_proj", one module each, where a bare
// "c_proj" (which it reads as both) would name two.

namespace {

constexpr std::string_view kPrefix = "base_model.model.";

std::vector<ParamTensor> peft_named(std::span<const ParamTensor> tensors) {
  std::vector<ParamTensor> out(tensors.begin(), tensors.end());
  for (ParamTensor& t : out) t.name = std::string(kPrefix) + t.name;
  return out;
}

const JsonValue* member(const JsonValue& object, std::string_view key) {
  for (const auto& [k, v] : object.members)
    if (k == key) return &v;
  return nullptr;
}

// GPT-2's targets (model/lora_targets.hpp): PEFT's adapters on Conv1D, fan_in_fan_out set.
bool is_gpt2(const LoraSpec& lora) {
  const std::vector<std::string>& gpt2 = gpt2_lora_target_names();
  return !lora.targets.empty() &&
         std::find(gpt2.begin(), gpt2.end(), lora.targets.front()) != gpt2.end();
}

}  // namespace

bool is_peft_dir(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path / kPeftConfigName, ec);
}

PeftAdapter read_peft_config(const fs::path& dir) {
  const fs::path file = dir / kPeftConfigName;
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot read it", file.string()));
  std::stringstream text;
  text << in.rdbuf();
  JsonValue config;
  try {
    config = parse_json(text.str());
  } catch (const JsonError& e) {
    throw InputError(fmt::format("{}: not JSON at byte {}: {}", file.string(), e.offset(), e.what()));
  }
  const auto fail = [&](std::string_view key, std::string_view expected) {
    return InputError(fmt::format("{}: {}: expected {}", file.string(), key, expected));
  };
  const auto get = [&](std::string_view key, JsonValue::Kind kind, std::string_view expected) {
    const JsonValue* v = member(config, key);
    if (!v || v->kind != kind) throw fail(key, expected);
    return v;
  };
  PeftAdapter out;
  if (get("peft_type", JsonValue::Kind::string, "\"LORA\"")->text != "LORA")
    throw fail("peft_type", "\"LORA\" (other adapters are not built)");
  out.lora.rank = std::stoi(get("r", JsonValue::Kind::number, "an integer >= 1")->text);
  if (out.lora.rank < 1) throw fail("r", "an integer >= 1");
  out.lora.alpha = std::stod(get("lora_alpha", JsonValue::Kind::number, "a number")->text);
  if (const JsonValue* d = member(config, "lora_dropout"); d && d->kind == JsonValue::Kind::number)
    out.dropout = std::stod(d->text);
  for (const char* key : {"use_rslora", "use_dora"})
    if (const JsonValue* v = member(config, key); v && v->kind == JsonValue::Kind::boolean && v->boolean)
      throw fail(key, "false (lockstep's LoRA is plain LoRA)");
  const JsonValue* fan = member(config, "fan_in_fan_out");
  const bool fan_in_fan_out = fan && fan->kind == JsonValue::Kind::boolean && fan->boolean;
  const JsonValue* targets = member(config, "target_modules");
  if (!targets || targets->kind != JsonValue::Kind::array)
    throw fail("target_modules", "a list of module names");
  std::vector<std::string> names;
  for (const JsonValue& t : targets->items) {
    if (t.kind != JsonValue::Kind::string) throw fail("target_modules", "a list of module names");
    names.push_back(t.text);
  }
  try {
    out.lora.targets = lockstep::parse_lora_targets(fmt::format("{}", fmt::join(names, ",")));
  } catch (const std::invalid_argument& e) {
    throw fail("target_modules", e.what());
  }
  // GPT-2's Conv1D stores W (in, out), and PEFT sets fan_in_fan_out for it, but A and B are
  // torch.nn.Linear weights there too: only a Linear with it set would be another layout.
  if (fan_in_fan_out != is_gpt2(out.lora))
    throw fail("fan_in_fan_out", fmt::format("{} for these target_modules (lockstep's LoRA is "
                                             "plain LoRA on Linear, and on GPT-2's Conv1D)",
                                             is_gpt2(out.lora)));
  if (const JsonValue* b = member(config, "base_model_name_or_path");
      b && b->kind == JsonValue::Kind::string)
    out.base = b->text;
  return out;
}

PeftAdapter read_peft_adapter(const fs::path& dir, std::span<const ParamTensor> expected) {
  PeftAdapter out = read_peft_config(dir);
  Weights w = load_weights(dir / kPeftWeightsName, peft_named(expected));
  out.adapters = std::move(w.params);
  out.file = std::move(w.file);
  return out;
}

void write_peft_adapter(const fs::path& dir, std::span<const ParamTensor> tensors,
                        std::span<const float> adapters, const LoraSpec& lora,
                        const std::string& base) {
  fs::create_directories(dir);
  std::vector<std::string> quoted;
  for (const std::string& t : lora.targets) quoted.push_back(json_quote(t));
  const std::string config = fmt::format(
      "{{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": {},\n"
      "  \"lora_alpha\": {},\n  \"lora_dropout\": {},\n  \"target_modules\": [{}],\n"
      "  \"bias\": \"none\",\n  \"fan_in_fan_out\": {},\n  \"use_rslora\": false,\n"
      "  \"use_dora\": false,\n  \"init_lora_weights\": true,\n  \"inference_mode\": true,\n"
      "  \"modules_to_save\": null,\n  \"base_model_name_or_path\": {}\n}}\n",
      lora.rank, lora.alpha, lora.dropout, fmt::join(quoted, ", "), is_gpt2(lora),
      json_quote(base));
  const std::span<const std::byte> bytes = std::as_bytes(std::span(config));
  write_file_atomically(dir / kPeftConfigName, std::span(&bytes, 1));
  write_safetensors(dir / kPeftWeightsName, peft_named(tensors), adapters);
}

}  // namespace lockstep::detail
