// Text generation with a trained language model (Model::gpt: GPT-2 or a Llama-family
// decoder), one token at a time.
//
//   lockstep::Replica replica(device, model, /*max_batch=*/1);
//   replica.load_parameters(checkpoint.params);
//   std::vector<int> out = lockstep::generate(replica, prompt, {.tokens = 200, .top_k = 40},
//                                             [](int token) { std::putchar(token); });
//
// Each step takes the model's logits after the last of the last `context` tokens: with the
// key/value cache (the default) the prompt is run once and each drawn token then costs one
// position (Note [KV cache] in src/model/kv_cache.cpp; past the context the window slides and
// is run again in full); without it each step runs the whole window. It divides them by the
// temperature, keeps the top_k largest, and draws the next token from their softmax with a
// generator seeded by `seed`: the same seed, weights and prompt give the same text. Temperature
// 0 is greedy (argmax). Drawing a stop token (an EOS) ends it.
//
// `lockstep sample` is one call, sample(), on a checkpoint:
//
//   lockstep::SampleResult r = lockstep::sample(
//       {.checkpoint = "runs/a/checkpoints", .prompt = "ROSALIND.", .options = {.tokens = 40}},
//       [](int token, std::string_view piece) { std::fwrite(piece.data(), 1, piece.size(), stdout); });
//
// or two, when the prompt is to be shown before the first token is drawn: a CheckpointSampler
// (loads, checks, encodes the prompt), then its run().
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/checkpoint.hpp"
#include "lockstep/export.hpp"
#include "lockstep/model.hpp"
#include "lockstep/types.hpp"

namespace lockstep {

struct LOCKSTEP_API SamplingOptions {
  int tokens = 100;          // how many to generate
  double temperature = 1.0;  // >= 0; 0 picks the most likely token
  int top_k = 0;             // 0: the whole vocabulary
  std::uint64_t seed = 0;
  // Each token one position through a key/value cache (Note [KV cache] in
  // src/model/kv_cache.cpp); false: the whole window again per token, the reference. The same
  // tokens either way, to rounding in the logits.
  bool kv_cache = true;
  // Drawing one of these (a model's end-of-sequence ids) ends the generation; it is neither
  // returned nor passed to on_token.
  std::vector<int> stop_tokens{};
};

// Returns the generated tokens (without the prompt); on_token sees each as it is drawn. The
// prompt must be non-empty with every token in [0, vocab), and `replica` a GPT's replica
// (inputs() = context, outputs() = context * (vocab + the LM head's vocab_padding())):
// std::invalid_argument otherwise. The padding is never drawn.
LOCKSTEP_API std::vector<int> generate(Replica& replica, std::span<const int> prompt,
                                       const SamplingOptions& options,
                                       const std::function<void(int)>& on_token = {});

// The next token from one row of logits (vocab entries), as generate() draws it; rng_state
// advances. Exposed for tests.
LOCKSTEP_API int sample_token(std::span<const float> logits, double temperature, int top_k,
                              std::uint64_t& rng_state);

// ---- `lockstep sample` as a call --------------------------------------------------------------

// What to sample: a GPT checkpoint continuing a prompt. A text model reads the prompt as text:
// a byte model (data.dataset text: "lockstep.tokenizer" = "bytes") its UTF-8 bytes, a token
// model with a tokenizer (`tokenizer`, else the one the checkpoint records) its encoding.
// A token model without one reads token ids separated by spaces or commas. An empty prompt
// starts from a newline (bytes), <|endoftext|> (a tokenizer) or token 0. Every field has a
// default ({} at least), so that a designated initializer may leave any out.
struct LOCKSTEP_API SampleRequest {
  // A checkpoint directory (its newest) or either file of one, or a Hugging Face directory
  // (`export --format hf`'s): its config.json and weights, its tokenizer unless `tokenizer`.
  std::filesystem::path checkpoint{};
  std::string prompt{};
  SamplingOptions options{};  // its defaults; the CLI's are 200 tokens at temperature 0.8
  BackendKind backend = BackendKind::automatic;  // the model runs on device 0 of it
  // DIR|FILE, checked against the hash the checkpoint records (recorded_tokenizer in
  // lockstep/tokenizer.hpp); empty: the recorded one, or none.
  std::filesystem::path tokenizer{};
  // Where sampling stops (SamplingOptions::stop_tokens, which this sets): unset, the model's
  // end-of-sequence ids: those the checkpoint records (config.json's eos_token_id, an int or a
  // list, when training began from a Hugging Face directory; Note [Hugging Face token ids] in
  // src/io/hf_model.cpp), else its tokenizer's end token, else none (a byte model, token ids).
  // Set: these ids (none when empty), each in [0, vocab).
  std::optional<std::vector<int>> stop_at{};
  // Each token one position through a key/value cache (SamplingOptions::kv_cache).
  bool kv_cache = true;
  // The prompt's text of the tokenizer's special tokens ("<|im_start|>") encodes as those
  // tokens, as a chat template renders them (`tokenize --allow-special`); false: as text.
  bool allow_special = false;
  OptionSpelling spelling = OptionSpelling::field;
  CheckpointManager::Warn warn{};  // what loading the checkpoint warns about (a skipped newer one)
};

// What a sample drew. prompt_text followed by text is what `lockstep sample` prints (less its
// final newline).
struct LOCKSTEP_API SampleResult {
  std::vector<int> prompt_tokens{};  // what the model was given
  std::vector<int> tokens{};         // what it drew, without the prompt
  std::string prompt_text{};         // the prompt as given (text model), else its ids, spaced
  std::string text{};                // the pieces of `tokens`, joined
  bool text_model = false;           // the pieces are text, not " <id>"
  bool stopped = false;              // drew a stop token (not in `tokens`) before the last
};

// Called with each token as it is drawn and its piece: its bytes for a text model (a token may
// hold part of a UTF-8 character), else " <id>"; also " <id>" for a padded id the tokenizer
// lacks. It runs on the thread that called run() or sample(), between two draws.
using TokenCallback = std::function<void(int token, std::string_view piece)>;

// A GPT checkpoint loaded to sample `request.prompt`. The constructor checks the request,
// InputError naming the option in request.spelling: tokens, temperature or top_k below 0, no
// checkpoint, one that is not a GPT's or does not hold its tensors, a tokenizer that is not the
// recorded one or has more ids than the model, prompt ids outside the vocabulary. It then
// loads the weights onto device 0 of `request.backend` and encodes the prompt.
class LOCKSTEP_API CheckpointSampler {
 public:
  explicit CheckpointSampler(const SampleRequest& request);
  ~CheckpointSampler();
  CheckpointSampler(CheckpointSampler&&) noexcept;
  CheckpointSampler& operator=(CheckpointSampler&&) noexcept;

  const std::vector<int>& prompt_tokens() const noexcept;
  const std::string& prompt_text() const noexcept;  // as SampleResult's
  bool text_model() const noexcept;
  const std::vector<int>& stop_tokens() const noexcept;  // where run() stops (stop_at)

  // Draws request.options.tokens tokens after the prompt (generate() above). Each run starts
  // again from the prompt and the seed, so runs are the same.
  SampleResult run(const TokenCallback& on_token = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// CheckpointSampler(request).run(on_token).
LOCKSTEP_API SampleResult sample(const SampleRequest& request, const TokenCallback& on_token = {});

}  // namespace lockstep
