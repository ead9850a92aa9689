// `lockstep export`: a checkpoint's weights as safetensors for torch, or a Hugging Face
// directory. The flags make an ExportRequest; lockstep::export_checkpoint
// (lockstep/checkpoint.hpp) checks and runs it.
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/command_args.hpp"
#include "cli/commands.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::cli {

int export_weights(const std::vector<std::string_view>& argv) {
  // --base (a LoRA checkpoint's frozen base alone) is the one flag without a value.
  std::vector<std::string_view> rest;
  bool base = false;
  for (const std::string_view a : argv) (a == "--base" ? base = true : (rest.push_back(a), false));
  const CommandArgs args = parse_command_args("export", rest, {"--out", "--format", "--dtype", "--tokenizer", "--max-shard-size"});
  if (args.positional.empty()) throw InputError("export: expected a checkpoint CKPT; see lockstep --help");
  ExportRequest request{.checkpoint = args.positional,
                        .out = args.get("--out"),
                        .base = base,
                        .tokenizer = args.get("--tokenizer"),
                        .spelling = OptionSpelling::flag,
                        .warn = warn};
  if (!args.get("--format").empty()) request.format = args.get("--format");
  if (!args.get("--dtype").empty()) request.dtype = args.get("--dtype");
  if (!args.get("--max-shard-size").empty()) request.max_shard_size = args.get("--max-shard-size");
  const ExportResult wrote = export_checkpoint(request);
  fmt::print("wrote {} ({} tensors, {} parameters, step {})\n", request.out.string(), wrote.tensors,
             wrote.parameters, wrote.step);
  return kExitOk;
}

}  // namespace lockstep::cli
