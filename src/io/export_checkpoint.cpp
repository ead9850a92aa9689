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
#include "io/lora_checkpoint.hpp"
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
  // Note [LoRA exports] in lora_checkpoint.cpp.
  const std::optional<detail::LoraCheckpoint> lora = detail::lora_checkpoint(ckpt);
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
  if (hf && lora) {  // the merged model, or the base
    detail::as_full_model(ckpt, *lora, request.base ? lora->base : detail::merged(ckpt, *lora));
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
