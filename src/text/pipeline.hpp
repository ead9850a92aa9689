// What a tokenizer does to text around byte-pair encoding, as a Hugging Face tokenizer.json
// describes it (or a tiktoken family, --tokenizer-family): added tokens split out, a normaliser,
// pre-tokenizers, and the post-processor's tokens around a sequence.
//
// Note [Tokenizer pipeline]
// Hugging Face's `tokenizers` encodes a text in this order, and so do we:
// 1. Added tokens are split out of the raw text: the earliest match, the longest at a place;
//    `lstrip`/`rstrip` widen a match over the white space before/after it, which the token
//    swallows. Tokens with `normalized` true are matched after step 2, in normalised text.
//    A special token is split out only when the caller allows special tokens (`lockstep
//    tokenize --allow-special`, Tokenizer::encode_with_special); otherwise it is text, as in
//    tiktoken's encode_ordinary. Added tokens that are not special are always split out.
// 2. Each stretch of text between added tokens is normalised (NFC is the one we know).
// 3. The pre-tokenizers cut each stretch into pieces, each step cutting every piece of the last:
//    Split (its pattern, Note [Split patterns], and behaviour), Digits (Split on \p{N}, or on
//    \p{N}+), ByteLevel (a space before each piece that lacks one when add_prefix_space, then
//    Split on GPT-2's pattern when use_regex).
// 4. Each piece is byte-pair encoded (byte_pair.hpp); with ignore_merges, a piece that is a
//    token of the model's vocabulary is that token.
// 5. Tokenizer::encode stops there; a sequence (tokenize's document) adds the post-processor's
//    tokens around it: TemplateProcessing's special tokens before and after $A, or the
//    beginning-of-text token when tokenizer_config.json asks for it with add_bos_token.
// Invalid UTF-8 has no meaning to `tokenizers`, which takes str only: as for GPT-2 (Note
// [Pre-tokens]), the bytes of a stretch are cut into maximal runs of well-formed UTF-8, each
// going through steps 2 and 3 as if it were the whole stretch, and maximal runs of bad bytes,
// each one piece for step 4.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/tokenizer.hpp"
#include "io/json.hpp"
#include "text/pretokenize.hpp"
#include "text/vocabulary.hpp"

namespace lockstep::detail {

// What a Split does with its pattern's matches (its "behavior"), as `tokenizers` names them.
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// One pre-tokenizer step.
struct PreTokenizerStep {
  std::shared_ptr<const PretokenPattern> pattern;  // null: ByteLevel's add_prefix_space
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
};

struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool special = true, lstrip = false, rstrip = false, normalized = false;
};

// Where tokenize_files may cut a long document (Note [Tokenizing files]).
enum class CutRule {
  gpt2,                     // GPT-2's pattern: safe_cut's rule
  newline_between_letters,  // Llama 3's and Qwen2's patterns: after "\n" in "a\nb"
  none,                     // any other: a document is encoded whole
};

struct Pipeline {
  bool gpt2 = true;  // GPT-2's pattern alone, nothing else: the anchored splitter
  bool nfc = false;
  std::vector<PreTokenizerStep> steps;
  std::vector<AddedToken> added;
  std::vector<TokenId> prefix, suffix;  // the post-processor's tokens around a sequence
  std::optional<TokenId> bos, eos;      // tokenizer_config.json's, or the family's
  CutRule cut = CutRule::gpt2;
  std::string description;  // what the content hash adds for it; empty for GPT-2's
};

// tokenizer_config.json beside a tokenizer.json: what read_pipeline takes from it.
struct TokenizerConfig {
  std::string name;  // the file, for messages
  std::optional<std::string> bos_token, eos_token;
  std::optional<bool> add_bos_token;
};

TokenizerConfig parse_tokenizer_config(std::string_view text, const std::string& name);

// A tokenizer.json's pipeline (`root`, parsed from `text`, named `name` in messages), for its
// vocabulary `v`. InputError naming the file, line and JSON path of anything it cannot follow.
Pipeline read_pipeline(const JsonValue& root, const Vocabulary& v, std::string_view text,
                       const std::string& name, const TokenizerConfig& config);

// A vocabulary and what is done around it.
struct TokenizerSpec {
  Vocabulary vocabulary;
  Pipeline pipeline;
};

// A rank file's family (Tokenizer::load): its pattern and special tokens, which `v` (read from
// the rank file) gets after its ranks.
Pipeline family_pipeline(TokenizerFamily family, Vocabulary& v, const std::string& name);

// A tokenizer.json (and the tokenizer_config.json `config` read beside it).
TokenizerSpec parse_tokenizer_json(std::string_view text, const std::string& name,
                                   const TokenizerConfig& config = {});

// `path` as Tokenizer::load describes it.
TokenizerSpec read_tokenizer(const std::filesystem::path& path, TokenizerFamily family);

}  // namespace lockstep::detail
