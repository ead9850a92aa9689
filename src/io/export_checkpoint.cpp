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
#include "lockstep/checkpoint.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"

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
  const bool hf = request.format == "hf";
  if (!hf && request.format != "torch")
    throw InputError(fmt::format("{}: expected torch or hf, got '{}'", name("format"), request.format));
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
  if (hf) detail::check_output_dir(request.out, out_option);
  else detail::check_output_file(request.out, out_option);

  const Checkpoint ckpt = CheckpointManager::load(request.checkpoint, request.warn);
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
