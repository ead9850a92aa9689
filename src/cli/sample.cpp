// `lockstep sample`: text (or token ids) continued by a GPT checkpoint: bytes for a text model,
// text through a BPE tokenizer (recorded in the checkpoint, or --tokenizer), else token ids.
// The flags make a SampleRequest; lockstep::CheckpointSampler (lockstep/generate.hpp) checks
// and runs it.
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/command_args.hpp"
#include "cli/commands.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::cli {

int sample(const std::vector<std::string_view>& argv) {
  const CommandArgs args = parse_command_args(
      "sample", argv,
      {"--checkpoint", "--prompt", "--tokens", "--temperature", "--top-k", "--seed", "--backend",
       "--tokenizer"});
  // The checkpoint as export takes it, or by --checkpoint; both must name the same.
  const std::string flag = args.get("--checkpoint");
  if (!args.positional.empty() && !flag.empty() && args.positional != flag)
    throw InputError(fmt::format("sample: two checkpoints, '{}' and --checkpoint '{}'; give one",
                                 args.positional, flag));
  SampleRequest request{
      .checkpoint = flag.empty() ? args.positional : flag,
      .prompt = args.get("--prompt"),
      .tokenizer = args.get("--tokenizer"),
      .spelling = OptionSpelling::flag,
      .warn = warn};
  request.options = {.tokens = number_flag(args, "--tokens", 200),
                     .temperature = number_flag(args, "--temperature", 0.8),
                     .top_k = number_flag(args, "--top-k", 0),
                     .seed = number_flag<std::uint64_t>(args, "--seed", 0)};
  request.backend = backend_flag(args);

  CheckpointSampler sampler(request);
  fmt::print("{}", sampler.prompt_text());
  std::fflush(stdout);
  sampler.run([](int, std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  fmt::print("\n");
  return kExitOk;
}

}  // namespace lockstep::cli
