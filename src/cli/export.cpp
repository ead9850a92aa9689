// `lockstep export`: a checkpoint's weights as safetensors for torch, or a Hugging Face GPT-2
// directory.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cli/command_args.hpp"
#include "cli/commands.hpp"
#include "io/output_path.hpp"
#include "lockstep/lockstep.hpp"
#include "lockstep/tokenizer.hpp"

namespace fs = std::filesystem;

namespace lockstep::cli {
namespace {

// Writing over the weights (or the state) just read would destroy the checkpoint.
void refuse_own_input(const fs::path& out, const Checkpoint& ckpt) {
  const fs::path state = fs::path(ckpt.weights_file).replace_extension(".state");
  for (const fs::path& input : {ckpt.weights_file, state}) {
    std::error_code ec;
    if (fs::equivalent(out, input, ec))
      throw InputError(fmt::format("export --out {}: is the checkpoint's own {}; write the export "
                                   "elsewhere", out.string(), input.string()));
  }
}

}  // namespace

int export_weights(const std::vector<std::string_view>& argv) {
  const CommandArgs args = parse_command_args("export", argv, {"--out", "--format", "--dtype", "--tokenizer"});
  if (args.positional.empty()) throw InputError("export: expected a checkpoint CKPT; see lockstep --help");
  const std::string out = args.get("--out");
  const std::string format = args.get("--format").empty() ? "torch" : args.get("--format");
  if (format != "torch" && format != "hf")
    throw InputError(fmt::format("--format: expected torch or hf, got '{}'", format));
  const std::string dtype_name = args.get("--dtype").empty() ? "fp32" : args.get("--dtype");
  if (dtype_name != "fp32" && dtype_name != "bf16")
    throw InputError(fmt::format("--dtype: expected fp32 or bf16, got '{}'", dtype_name));
  const TensorDtype dtype = dtype_name == "bf16" ? TensorDtype::bf16 : TensorDtype::f32;
  if (out.empty()) throw InputError(format == "hf" ? "export: expected --out DIR" : "export: expected --out FILE");
  if (format == "hf") detail::check_output_dir(out, "export --out");
  else detail::check_output_file(out, "export --out");
  const Checkpoint ckpt = CheckpointManager::load(args.positional, warn);
  refuse_own_input(format == "hf" ? fs::path(out) / "model.safetensors" : fs::path(out), ckpt);
  // The run's tokenizer goes beside the weights (--tokenizer when it has moved).
  const std::optional<Tokenizer> tokenizer =
      format == "hf" ? recorded_tokenizer(ckpt.metadata, ckpt.weights_file, args.get("--tokenizer"))
                     : std::nullopt;
  if (format == "hf") export_hf_gpt2(ckpt, out, dtype, tokenizer ? &*tokenizer : nullptr);
  else export_torch(ckpt, out, dtype);
  fmt::print("wrote {} ({} tensors, {} parameters, step {})\n", out, ckpt.tensors.size(),
             ckpt.params.size(), ckpt.state.step);
  return kExitOk;
}

}  // namespace lockstep::cli
