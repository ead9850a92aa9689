// `lockstep sample` as a library call: a GPT checkpoint loaded onto one device, its prompt
// encoded, and generate() run on it (lockstep/generate.hpp). Messages name options as the
// caller spells them: Note [Requests] in common/option_name.hpp.
#include <algorithm>
#include <charconv>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/option_name.hpp"
#include "io/hf_model.hpp"
#include "lockstep/device.hpp"
#include "lockstep/error.hpp"
#include "lockstep/generate.hpp"
#include "lockstep/tokenizer.hpp"

namespace lockstep {
namespace {

void check_options(const SamplingOptions& opt, OptionSpelling spelling) {
  const auto name = [&](std::string_view field) { return detail::option_name(spelling, field); };
  if (opt.tokens < 0) throw InputError(fmt::format("{}: expected >= 0, got {}", name("tokens"), opt.tokens));
  if (!(opt.temperature >= 0.0))
    throw InputError(fmt::format("{}: expected >= 0, got {}", name("temperature"), opt.temperature));
  if (opt.top_k < 0) throw InputError(fmt::format("{}: expected >= 0, got {}", name("top_k"), opt.top_k));
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

// What to do when a LoRA checkpoint's base is gone or changed.
std::string lora_way_out(const Checkpoint& ckpt) {
  return fmt::format("sample needs that base there, or a merged model that `lockstep export {} "
                     "--format hf --out DIR` wrote while the base was there (sample DIR)",
                     ckpt.weights_file.string());
}

// The tokenizer of a token model: `path`, else the one the checkpoint records (its hash
// checked either way).
std::optional<Tokenizer> sample_tokenizer(const Checkpoint& ckpt, const GptSpec& spec,
                                          const std::filesystem::path& path) {
  std::optional<Tokenizer> tokenizer = recorded_tokenizer(ckpt.metadata, ckpt.weights_file, path);
  if (tokenizer && tokenizer->vocab_size() > static_cast<std::size_t>(spec.vocab_size))
    throw InputError(fmt::format("tokenizer {}: {} ids, but the model has {}: not the tokenizer "
                                 "it was trained with", tokenizer->source().string(),
                                 tokenizer->vocab_size(), spec.vocab_size));
  return tokenizer;
}

// Token ids separated by spaces or commas, each in [0, vocab); none is token 0.
std::vector<int> parse_token_ids(const std::string& text, int vocab, const std::string& what) {
  std::string ids = text;
  std::replace(ids.begin(), ids.end(), ',', ' ');
  std::istringstream in(ids);
  std::vector<int> prompt;
  std::string word;
  while (in >> word) {
    int id = -1;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc{} || end != word.data() + word.size() || id < 0 || id >= vocab)
      throw InputError(fmt::format("{}: this model reads token ids in [0, {}), got '{}'", what,
                                   vocab, word));
    prompt.push_back(id);
  }
  if (prompt.empty()) prompt.push_back(0);
  return prompt;
}

// Where sampling stops: request.stop_at, else the model's end-of-sequence ids (SampleRequest).
std::vector<int> model_stop_tokens(const Checkpoint& ckpt, const GptSpec& spec,
                                   const std::optional<Tokenizer>& tokenizer,
                                   const SampleRequest& request) {
  if (request.stop_at) {
    for (const int id : *request.stop_at)
      if (id < 0 || id >= spec.vocab_size)
        throw InputError(fmt::format("{}: token {} is outside the model's vocabulary [0, {})",
                                     detail::option_name(request.spelling, "stop_at"), id,
                                     spec.vocab_size));
    return *request.stop_at;
  }
  std::vector<int> ids = detail::recorded_ids(ckpt, "lockstep.eos_token_ids");
  if (ids.empty() && tokenizer && tokenizer->end_of_text())
    ids.push_back(static_cast<int>(*tokenizer->end_of_text()));
  return ids;
}

// A Hugging Face directory (`export --format hf`'s, a downloaded model's) as a checkpoint of its
// weights: config.json gives the architecture and the bos and eos ids (load_weights).
Checkpoint hf_dir_checkpoint(const std::filesystem::path& dir) {
  const GptSpec spec = weights_model(dir)->spec;
  Weights weights = load_weights(dir, Model::gpt(spec).param_tensors());
  Checkpoint ckpt{.tensors = Model::gpt(spec).param_tensors(), .params = std::move(weights.params),
                  .metadata = std::move(weights.metadata), .weights_file = weights.file};
  ckpt.metadata["lockstep.model"] = to_string(spec);
  return ckpt;
}

}  // namespace

struct CheckpointSampler::Impl {
  SamplingOptions options;
  Model model;
  bool bytes = false;                  // a byte model: token = byte
  std::optional<Tokenizer> tokenizer;  // a token model's, when known
  std::vector<int> prompt_tokens;
  std::string prompt_text;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Device> device;
  std::optional<Replica> replica;

  Impl(const SamplingOptions& opt, const GptSpec& spec) : options(opt), model(Model::gpt(spec)) {}

  // The text of a token as printed after the prompt.
  void piece(int token, std::string& out) const {
    out.clear();
    if (bytes) out.push_back(static_cast<char>(token));
    // A token the tokenizer lacks (the model's padded ids) is shown as its id.
    else if (tokenizer && static_cast<std::size_t>(token) < tokenizer->vocab_size())
      out = tokenizer->token_bytes(static_cast<TokenId>(token));
    else out = fmt::format(" {}", token);
  }
};

CheckpointSampler::CheckpointSampler(const SampleRequest& request) {
  const auto name = [&](std::string_view field) { return detail::option_name(request.spelling, field); };
  if (request.checkpoint.empty())
    throw InputError(fmt::format("sample: expected {} CKPT", name("checkpoint")));
  check_options(request.options, request.spelling);

  // A Hugging Face directory's tokenizer is its own files unless --tokenizer names another.
  const bool hf_dir = detail::is_hf_dir(request.checkpoint);
  Checkpoint ckpt = hf_dir ? hf_dir_checkpoint(request.checkpoint)
                           : CheckpointManager::load(request.checkpoint, request.warn);
  // A LoRA checkpoint samples as its merged model, from its base read again and checked by
  // hash (Note [LoRA exports] in src/io/lora_checkpoint.cpp).
  merge_lora_checkpoint(ckpt, lora_way_out(ckpt));
  const GptSpec spec = checkpoint_gpt_spec(ckpt);
  impl_ = std::make_unique<Impl>(request.options, spec);
  Impl& s = *impl_;
  check_layout(ckpt, s.model.param_tensors());
  const auto recorded = ckpt.metadata.find("lockstep.tokenizer");
  s.bytes = recorded != ckpt.metadata.end() && recorded->second == "bytes";
  if (!s.bytes)
    s.tokenizer = sample_tokenizer(ckpt, spec,
                                   hf_dir && request.tokenizer.empty() ? request.checkpoint
                                                                       : request.tokenizer);

  s.prompt_text = request.prompt;
  if (s.bytes) {
    for (unsigned char c : request.prompt) s.prompt_tokens.push_back(c);
    if (s.prompt_tokens.empty()) s.prompt_tokens.push_back('\n');
  } else if (s.tokenizer) {
    // A model whose documents start with a BOS (Llama 3) sees it before the prompt, as in
    // training; one whose documents follow an end-of-text (GPT-2) starts from it alone.
    const std::span<const TokenId> prefix = s.tokenizer->sequence_prefix();
    const std::optional<TokenId> eos = s.tokenizer->end_of_text();
    std::vector<TokenId> ids(prefix.begin(), prefix.end());
    if (request.allow_special) s.tokenizer->encode_with_special(request.prompt, ids);
    else s.tokenizer->encode(request.prompt, ids);
    if (ids.empty() && eos) ids.push_back(*eos);
    for (const TokenId id : ids) s.prompt_tokens.push_back(static_cast<int>(id));
  } else {
    s.prompt_tokens = parse_token_ids(request.prompt, spec.vocab_size, name("prompt"));
    s.prompt_text = fmt::format("{}", fmt::join(s.prompt_tokens, " "));
  }

  s.options.kv_cache = request.kv_cache;
  s.options.stop_tokens = model_stop_tokens(ckpt, spec, s.tokenizer, request);

  const int device_id = 0;
  s.backend = make_backend(request.backend, std::span(&device_id, 1));
  s.device = s.backend->create_device(device_id, 1, 0);
  s.replica.emplace(*s.device, s.model, 1);
  s.replica->load_parameters(ckpt.params);
}

CheckpointSampler::~CheckpointSampler() = default;
CheckpointSampler::CheckpointSampler(CheckpointSampler&&) noexcept = default;
CheckpointSampler& CheckpointSampler::operator=(CheckpointSampler&&) noexcept = default;

const std::vector<int>& CheckpointSampler::prompt_tokens() const noexcept { return impl_->prompt_tokens; }
const std::string& CheckpointSampler::prompt_text() const noexcept { return impl_->prompt_text; }
bool CheckpointSampler::text_model() const noexcept { return impl_->bytes || impl_->tokenizer; }
const std::vector<int>& CheckpointSampler::stop_tokens() const noexcept {
  return impl_->options.stop_tokens;
}

SampleResult CheckpointSampler::run(const TokenCallback& on_token) {
  SampleResult result{.prompt_tokens = impl_->prompt_tokens, .prompt_text = impl_->prompt_text,
                      .text_model = text_model()};
  std::string piece;
  result.tokens = generate(*impl_->replica, impl_->prompt_tokens, impl_->options, [&](int token) {
    impl_->piece(token, piece);
    result.text += piece;
    if (on_token) on_token(token, piece);
  });
  result.stopped = static_cast<int>(result.tokens.size()) < impl_->options.tokens;
  return result;
}

SampleResult sample(const SampleRequest& request, const TokenCallback& on_token) {
  return CheckpointSampler(request).run(on_token);
}

}  // namespace lockstep
