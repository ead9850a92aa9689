// `lockstep sample`: text (or token ids) continued by a GPT checkpoint: bytes for a text model,
// text through a BPE tokenizer (recorded in the checkpoint, or --tokenizer), else token ids.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/command_args.hpp"
#include "cli/commands.hpp"
#include "lockstep/lockstep.hpp"
#include "lockstep/tokenizer.hpp"

namespace lockstep::cli {
namespace {

// --tokens, --temperature, --top-k and --seed, checked.
SamplingOptions sampling_options(const CommandArgs& args) {
  SamplingOptions opt{.tokens = number_flag(args, "--tokens", 200),
                      .temperature = number_flag(args, "--temperature", 0.8),
                      .top_k = number_flag(args, "--top-k", 0),
                      .seed = number_flag<std::uint64_t>(args, "--seed", 0)};
  if (opt.tokens < 0) throw InputError(fmt::format("--tokens: expected >= 0, got {}", opt.tokens));
  if (!(opt.temperature >= 0.0))
    throw InputError(fmt::format("--temperature: expected >= 0, got {}", opt.temperature));
  if (opt.top_k < 0) throw InputError(fmt::format("--top-k: expected >= 0, got {}", opt.top_k));
  return opt;
}

// The GPT architecture a checkpoint records in its metadata.
GptSpec checkpoint_gpt_spec(const Checkpoint& ckpt) {
  const auto model_it = ckpt.metadata.find("lockstep.model");
  if (model_it == ckpt.metadata.end() || !model_it->second.starts_with("gpt "))
    throw InputError(fmt::format("{}: {}: not a GPT checkpoint (sample needs model.type gpt)",
                                 ckpt.weights_file.string(),
                                 model_it == ckpt.metadata.end()
                                     ? "no lockstep.model in the metadata"
                                     : "the metadata says '" + model_it->second + "'"));
  try {
    return parse_gpt_spec(model_it->second);
  } catch (const std::invalid_argument& e) {
    throw InputError(fmt::format("{}: {}", ckpt.weights_file.string(), e.what()));
  }
}

// The prompt: UTF-8 bytes for a text model; token ids separated by spaces or commas otherwise.
// An empty prompt starts from a newline (text) or token 0.
std::vector<int> parse_prompt(const std::string& text, bool bytes, const GptSpec& spec) {
  std::vector<int> prompt;
  if (bytes) {
    for (unsigned char c : text) prompt.push_back(c);
    if (prompt.empty()) prompt.push_back('\n');
    return prompt;
  }
  std::string ids = text;
  std::replace(ids.begin(), ids.end(), ',', ' ');
  std::istringstream in(ids);
  std::string word;
  while (in >> word) {
    int id = -1;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc{} || end != word.data() + word.size() || id < 0 || id >= spec.vocab_size)
      throw InputError(fmt::format("--prompt: this model reads token ids in [0, {}), got '{}'",
                                   spec.vocab_size, word));
    prompt.push_back(id);
  }
  if (prompt.empty()) prompt.push_back(0);
  return prompt;
}


// The tokenizer of a token model: --tokenizer, else the one the checkpoint records (its hash
// checked either way); the prompt is then text, encoded (an empty one is <|endoftext|>).
std::optional<Tokenizer> sample_tokenizer(const CommandArgs& args, const Checkpoint& ckpt,
                                          const GptSpec& spec) {
  const std::string path = args.get("--tokenizer");
  std::optional<Tokenizer> tokenizer = recorded_tokenizer(ckpt.metadata, ckpt.weights_file, path);
  if (tokenizer && tokenizer->vocab_size() > static_cast<std::size_t>(spec.vocab_size))
    throw InputError(fmt::format("tokenizer {}: {} ids, but the model has {}: not the tokenizer "
                                 "it was trained with", tokenizer->source().string(),
                                 tokenizer->vocab_size(), spec.vocab_size));
  return tokenizer;
}

}  // namespace

int sample(const std::vector<std::string_view>& argv) {
  const CommandArgs args = parse_command_args(
      "sample", argv,
      {"--checkpoint", "--prompt", "--tokens", "--temperature", "--top-k", "--seed", "--backend",
       "--tokenizer"});
  if (!args.positional.empty())
    throw InputError(fmt::format("sample: unexpected argument '{}'; see lockstep --help", args.positional));
  const std::string path = args.get("--checkpoint");
  if (path.empty()) throw InputError("sample: expected --checkpoint CKPT");
  const SamplingOptions opt = sampling_options(args);

  const Checkpoint ckpt = CheckpointManager::load(path, warn);
  const GptSpec spec = checkpoint_gpt_spec(ckpt);
  const Model model = Model::gpt(spec);
  check_layout(ckpt, model.param_tensors());
  const bool bytes = ckpt.metadata.count("lockstep.tokenizer") &&
                     ckpt.metadata.at("lockstep.tokenizer") == "bytes";
  const std::optional<Tokenizer> tokenizer = bytes ? std::nullopt : sample_tokenizer(args, ckpt, spec);
  const std::string prompt_text = args.get("--prompt");
  std::vector<int> prompt;
  if (tokenizer) {
    for (const TokenId id : tokenizer->encode(prompt_text)) prompt.push_back(static_cast<int>(id));
    if (prompt.empty() && tokenizer->end_of_text()) prompt.push_back(static_cast<int>(*tokenizer->end_of_text()));
  } else {
    prompt = parse_prompt(prompt_text, bytes, spec);
  }

  const BackendKind kind = backend_flag(args);
  const int device_id = 0;
  std::unique_ptr<Backend> backend = make_backend(kind, std::span(&device_id, 1));
  std::unique_ptr<Device> device = backend->create_device(device_id, 1, 0);
  Replica replica(*device, model, 1);
  replica.load_parameters(ckpt.params);

  if (bytes || tokenizer) fmt::print("{}", prompt_text);
  else fmt::print("{}", fmt::join(prompt, " "));
  std::fflush(stdout);
  generate(replica, prompt, opt, [&](int token) {
    if (bytes) std::putchar(token);
    // A token the tokenizer lacks (the model's padded ids) prints as its id.
    else if (tokenizer && static_cast<std::size_t>(token) < tokenizer->vocab_size())
      fmt::print("{}", tokenizer->token_bytes(static_cast<TokenId>(token)));
    else fmt::print(" {}", token);
    std::fflush(stdout);
  });
  fmt::print("\n");
  return kExitOk;
}

}  // namespace lockstep::cli
