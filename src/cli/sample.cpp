// `lockstep sample`: text (or token ids) continued by a GPT checkpoint: bytes for a text model,
// text through a BPE tokenizer (recorded in the checkpoint, or --tokenizer), else token ids.
// The flags make a SampleRequest; lockstep::CheckpointSampler (lockstep/generate.hpp) checks
// and runs it.
#include <charconv>
#include <cstdio>
#include <system_error>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/command_args.hpp"
#include "cli/commands.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::cli {

namespace {

// --stop-at ID[,ID...] (where to stop instead of the model's end-of-sequence ids), or none.
std::vector<int> stop_ids(const std::string& text) {
  std::vector<int> ids;
  if (text == "none") return ids;
  std::string_view rest = text;
  while (true) {
    const std::string_view word = rest.substr(0, rest.find(','));
    int id = -1;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc{} || end != word.data() + word.size() || id < 0)
      throw InputError(fmt::format("--stop-at: expected token ids separated by commas, or none; "
                                   "got '{}'", text));
    ids.push_back(id);
    if (word.size() == rest.size()) return ids;
    rest.remove_prefix(word.size() + 1);
  }
}

// --FLAG on|off, or `fallback` when it was not given.
bool on_off_flag(const CommandArgs& args, std::string_view flag, bool fallback) {
  if (!args.named.contains(flag)) return fallback;
  const std::string text = args.get(flag);
  if (text == "on") return true;
  if (text == "off") return false;
  throw InputError(fmt::format("{}: expected on or off, got '{}'", flag, text));
}

}  // namespace

int sample(const std::vector<std::string_view>& argv) {
  // --allow-special (the prompt's special tokens' text as those tokens) takes no value.
  std::vector<std::string_view> rest;
  bool allow_special = false;
  for (const std::string_view a : argv)
    (a == "--allow-special" ? allow_special = true : (rest.push_back(a), false));
  const CommandArgs args = parse_command_args(
      "sample", rest,
      {"--checkpoint", "--prompt", "--tokens", "--temperature", "--top-k", "--seed", "--backend",
       "--tokenizer", "--stop-at", "--kv-cache"});
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
  if (args.named.contains("--stop-at")) request.stop_at = stop_ids(args.get("--stop-at"));
  request.kv_cache = on_off_flag(args, "--kv-cache", true);
  request.allow_special = allow_special;

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
