// `lockstep export` as a library call: the request checked, the checkpoint loaded and written
// as torch safetensors or a Hugging Face directory. Messages name options as the caller
// spells them: Note [Requests] in common/option_name.hpp.
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "common/option_name.hpp"
#include "io/file_roles.hpp"
#include "io/hf_model.hpp"
#include "io/output_path.hpp"
#include "io/peft.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"
#include "lockstep/trainer.hpp"

namespace lockstep {
namespace fs = std::filesystem;
namespace {

// Writing over the weights (or the state) or the tokenizer just read would destroy them: Note
// [An output is never an input]. `what` names the output option ("export --out").
void refuse_own_inputs(const ExportRequest& request, const Checkpoint& ckpt,
                       const Tokenizer* tokenizer, const std::string& what) {
  detail::FileRoles files;
  files.input(ckpt.weights_file, "the checkpoint's weights")
      .input(fs::path(ckpt.weights_file).replace_extension(".state"), "the checkpoint's state");
  if (tokenizer) files.input_dir(tokenizer->source(), "the tokenizer", detail::kTokenizerFiles);
  if (request.format != "hf") {
    files.output(request.out, what);
  } else {
    for (const std::string_view name : detail::kHfModelFiles)
      files.output(request.out / name, what);
  }
  files.check();
}

// Note [LoRA exports]
// ~~~~~~~~~~~~~~~~~~~
// A LoRA checkpoint holds the adapters and names its base by content hash ("lockstep.lora_base")
// and by where it came from ("lockstep.lora_base_source": the weights file --init-from read, or
// "seed=N" for a base drawn from trainer.seed). An export reads the base again from there and
// refuses one whose hash differs. --format hf writes the merged weights (merge_lora), hf with
// --base the base alone, peft the adapters for that base, torch the adapters as they are.
struct LoraCheckpoint {
  Model model;
  LoraSpec lora;
  std::vector<float> base;
  std::string base_source;
};

std::optional<LoraCheckpoint> lora_checkpoint(const Checkpoint& ckpt) {
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
  if (out.base_source.starts_with("seed=")) {
    out.base = out.model.initial_frozen(std::stoull(out.base_source.substr(5)));
  } else {
    out.base = load_weights(out.base_source, out.model.frozen_tensors()).params;
  }
  const std::string expected = meta("lockstep.lora_base"), found = base_hash(out.base);
  if (found != expected)
    throw InputError(fmt::format("{}: the adapters were trained on a base with content hash {}, "
                                 "but {} now has {}",
                                 file, expected, out.base_source, found));
  return out;
}

}  // namespace

ExportResult export_checkpoint(const ExportRequest& request) {
  const auto name = [&](std::string_view field) { return detail::option_name(request.spelling, field); };
  if (request.checkpoint.empty())
    throw InputError(fmt::format("export: expected {} CKPT", name("checkpoint")));
  const bool hf = request.format == "hf", peft = request.format == "peft";
  if (!hf && !peft && request.format != "torch")
    throw InputError(fmt::format("{}: expected torch, hf or peft, got '{}'", name("format"),
                                 request.format));
  if (request.base && !hf)
    throw InputError(fmt::format("{}: writes a LoRA checkpoint's base as {} hf", name("base"),
                                 name("format")));
  if (request.dtype != "fp32" && request.dtype != "bf16")
    throw InputError(fmt::format("{}: expected fp32 or bf16, got '{}'", name("dtype"), request.dtype));
  const TensorDtype dtype = request.dtype == "bf16" ? TensorDtype::bf16 : TensorDtype::f32;
  std::uint64_t max_shard_bytes = 0;
  try {
    max_shard_bytes = detail::parse_shard_size(request.max_shard_size);
  } catch (const std::invalid_argument& e) {
    throw InputError(fmt::format("{}: {}", name("max_shard_size"), e.what()));
  }
  if (request.out.empty())
    throw InputError(fmt::format("export: expected {} {}", name("out"), hf ? "DIR" : "FILE"));
  const std::string out_option = "export " + name("out");
  if (hf || peft) detail::check_output_dir(request.out, out_option);
  else detail::check_output_file(request.out, out_option);

  Checkpoint ckpt = CheckpointManager::load(request.checkpoint, request.warn);
  const std::optional<LoraCheckpoint> lora = lora_checkpoint(ckpt);
  if ((peft || request.base) && !lora)
    throw InputError(fmt::format("{}: not a LoRA checkpoint (no \"lockstep.lora\"): {} needs one",
                                 ckpt.weights_file.string(),
                                 peft ? name("format") + " peft" : name("base")));
  if (peft) {
    refuse_own_inputs(request, ckpt, nullptr, out_option);
    // PEFT names its base by directory: a Hugging Face directory's, not its weights file.
    const fs::path source(lora->base_source);
    const bool weights_file = detail::is_hf_dir(source) && !fs::is_directory(source);
    detail::write_peft_adapter(request.out, ckpt.tensors, ckpt.params, lora->lora,
                               weights_file ? source.parent_path().string() : lora->base_source);
    return {.tensors = ckpt.tensors.size(), .parameters = ckpt.params.size(),
            .step = ckpt.state.step};
  }
  if (hf && lora) {  // Note [LoRA exports]: the merged model, or the base
    ckpt.params = request.base ? lora->base
                               : merge_lora(lora->model, lora->lora, ckpt.params, lora->base);
    ckpt.tensors = lora->model.frozen_tensors();
    for (const char* key : {"lockstep.lora", "lockstep.lora_base", "lockstep.lora_base_source"})
      ckpt.metadata.erase(key);
  }
  // The run's tokenizer goes beside the weights (`tokenizer` when it has moved).
  const std::optional<Tokenizer> tokenizer =
      hf ? recorded_tokenizer(ckpt.metadata, ckpt.weights_file, request.tokenizer) : std::nullopt;
  refuse_own_inputs(request, ckpt, tokenizer ? &*tokenizer : nullptr, out_option);
  if (hf) {
    export_hf(ckpt, request.out, dtype, tokenizer ? &*tokenizer : nullptr, max_shard_bytes);
  } else {
    export_torch(ckpt, request.out, dtype);
  }
  return {.tensors = ckpt.tensors.size(), .parameters = ckpt.params.size(), .step = ckpt.state.step};
}

}  // namespace lockstep
