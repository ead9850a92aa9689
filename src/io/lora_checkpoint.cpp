// A LoRA checkpoint with its base, read again from where the run read it.
#include "io/lora_checkpoint.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "lockstep/error.hpp"
#include "lockstep/trainer.hpp"

namespace lockstep::detail {

// Note [LoRA exports]
// ~~~~~~~~~~~~~~~~~~~
// A LoRA checkpoint holds the adapters and names its base by content hash ("lockstep.lora_base")
// and by where it came from ("lockstep.lora_base_source": the weights file --init-from read, as
// an absolute path, or "seed=N" for a base drawn from trainer.seed). Whatever uses the adapters
// reads the base again from there and refuses one whose hash differs: export (--format hf writes
// the merged weights, merge_lora; hf with --base the base alone; peft the adapters for that
// base; torch the adapters as they are), and sample and eval, which run the merged model (the
// adapted model's function, W + s B A rounded once in fp32; the trainer's eval runs the
// adapters beside W, so the two losses agree to fp32 rounding, not bit for bit). Without its
// base a checkpoint of adapters is nothing to run: when the source is gone or holds another
// base, each says which base (hash and path) it needs.
std::optional<LoraCheckpoint> lora_checkpoint(const Checkpoint& ckpt, const std::string& way_out) {
  const auto record = ckpt.metadata.find("lockstep.lora");
  if (record == ckpt.metadata.end()) return std::nullopt;
  const std::string file = ckpt.weights_file.string();
  const auto meta = [&](const char* key) {
    const auto it = ckpt.metadata.find(key);
    if (it == ckpt.metadata.end())
      throw InputError(fmt::format("{}: a LoRA checkpoint without \"{}\"", file, key));
    return it->second;
  };
  LoraSpec lora;
  GptSpec spec;
  try {
    lora = parse_lora_record(record->second);
    spec = parse_gpt_spec(meta("lockstep.model"));
  } catch (const std::invalid_argument& e) {
    throw InputError(fmt::format("{}: {}", file, e.what()));
  }
  LoraCheckpoint out{Model::gpt(spec, AttentionKind::materialized, lora), lora, {},
                     meta("lockstep.lora_base_source")};
  check_layout(ckpt, out.model.param_tensors());
  const std::string expected = meta("lockstep.lora_base");
  const std::string then = way_out.empty() ? "" : "; " + way_out;
  if (out.base_source.starts_with("seed=")) {
    out.base = out.model.initial_frozen(std::stoull(out.base_source.substr(5)));
  } else {
    try {
      out.base = load_weights(out.base_source, out.model.frozen_tensors()).params;
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: a LoRA checkpoint, which holds its adapters but not their "
                                   "base: it reads the base (content hash {}) from {}, which "
                                   "failed: {}{}",
                                   file, expected, out.base_source, e.what(), then));
    }
  }
  const std::string found = base_hash(out.base);
  if (found != expected)
    throw InputError(fmt::format("{}: the adapters were trained on a base with content hash {}, "
                                 "but {} now has {}{}",
                                 file, expected, out.base_source, found, then));
  return out;
}

std::vector<float> merged(const Checkpoint& ckpt, const LoraCheckpoint& lora) {
  return merge_lora(lora.model, lora.lora, ckpt.params, lora.base);
}

void as_full_model(Checkpoint& ckpt, const LoraCheckpoint& lora, std::vector<float> params) {
  ckpt.params = std::move(params);
  ckpt.tensors = lora.model.frozen_tensors();
  for (const char* key : {"lockstep.lora", "lockstep.lora_base", "lockstep.lora_base_source"})
    ckpt.metadata.erase(key);
}

}  // namespace lockstep::detail

namespace lockstep {

bool merge_lora_checkpoint(Checkpoint& ckpt, const std::string& way_out) {
  const std::optional<detail::LoraCheckpoint> lora = detail::lora_checkpoint(ckpt, way_out);
  if (!lora) return false;
  detail::as_full_model(ckpt, *lora, detail::merged(ckpt, *lora));
  return true;
}

}  // namespace lockstep
