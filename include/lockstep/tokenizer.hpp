// Byte-level BPE tokenizers (GPT-2's, Llama 3's, Qwen2's, SmolLM2's, ...), and text files made
// into llm.c token files with them.
//
//   // A Hugging Face GPT-2 directory (vocab.json + merges.txt), or gpt2.tiktoken
//   const lockstep::Tokenizer gpt2 = lockstep::Tokenizer::load("gpt2/");
//   std::vector<lockstep::TokenId> ids = gpt2.encode("Hello world");      // {15496, 995}
//   std::string text = gpt2.decode(ids);                                   // "Hello world"
//   // Any tokenizer.json of a byte-level BPE (Note [Tokenizer pipeline] in src/text/pipeline.hpp
//   // says what is read), or a tiktoken rank file of a named family
//   const auto llama = lockstep::Tokenizer::load("llama3/tokenizer.model",
//                                                lockstep::TokenizerFamily::llama3);
//
//   lockstep::TokenizeOptions opt;
//   opt.inputs = {"book.txt", "web.jsonl"};
//   opt.out = "train.bin";
//   lockstep::TokenizeCounts counts = lockstep::tokenize_files(gpt2, opt);
//
// GPT-2's encoding is tiktoken's `gpt2` encoding exactly, for every byte string (Note [Pre-tokens] in
// src/text/pretokenize.hpp says how invalid UTF-8 is split); decode(encode(x)) == x.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/export.hpp"
#include "lockstep/types.hpp"

namespace lockstep {

using TokenId = std::uint32_t;

namespace detail {
struct TokenizerImpl;
}

// What a tiktoken rank file is, which the file does not say: its split pattern, normaliser and
// special tokens. automatic: GPT-2's for a *.tiktoken file.
enum class TokenizerFamily { automatic, gpt2, llama3, qwen2 };
// "gpt2", "llama3" or "qwen2"; nullopt for anything else.
LOCKSTEP_API std::optional<TokenizerFamily> parse_tokenizer_family(std::string_view name);

// Immutable once loaded; copies share it, and every method may be called from any thread.
class LOCKSTEP_API Tokenizer {
 public:
  // Reads a Hugging Face directory (tokenizer.json and the tokenizer_config.json beside it, else
  // GPT-2's vocab.json and merges.txt), a tokenizer.json, or a tiktoken rank file ("BASE64 RANK"
  // per line: *.tiktoken, GPT-2's unless `family` says otherwise; any name with a family; the
  // family's special tokens take the ids after the last rank, as in tiktoken). Throws InputError
  // naming the file and line (and a tokenizer.json's JSON path) for anything else, a malformed
  // or truncated file, duplicate ids, ranks or tokens, merges naming tokens the vocabulary lacks,
  // and a tokenizer.json asking for what lockstep does not do.
  static Tokenizer load(const std::filesystem::path& path,
                        TokenizerFamily family = TokenizerFamily::automatic);

  // The ids of `text`. Special tokens' text ("<|endoftext|>") is ordinary text here, never the
  // special id; no post-processor's tokens (BOS) are added.
  std::vector<TokenId> encode(std::string_view text) const;
  // The same, appended to `out`.
  void encode(std::string_view text, std::vector<TokenId>& out) const;
  // The ids of `text`, where each special token's text is that token.
  std::vector<TokenId> encode_with_special(std::string_view text) const;
  void encode_with_special(std::string_view text, std::vector<TokenId>& out) const;
  // The bytes of `ids`. Throws InputError for an id outside the vocabulary.
  std::string decode(std::span<const TokenId> ids) const;
  // The bytes of one token (a piece of UTF-8, or not: a token may hold part of a character).
  std::string_view token_bytes(TokenId id) const;

  std::size_t vocab_size() const noexcept;        // ids are in [0, vocab_size)
  // The end-of-sequence token (tokenizer_config.json's eos_token; GPT-2's <|endoftext|>).
  std::optional<TokenId> end_of_text() const noexcept;
  // The beginning-of-sequence token (bos_token; Llama 3's <|begin_of_text|>), whether or not
  // the tokenizer puts it before a sequence.
  std::optional<TokenId> begin_of_text() const noexcept;
  // The tokens the tokenizer puts before a sequence (its post-processor's, or tokenizer_config's
  // add_bos_token: Llama 3's BOS); empty for GPT-2 and Qwen2.
  std::span<const TokenId> sequence_prefix() const noexcept;
  // What starts each document in a token file: the post-processor's tokens before a sequence
  // (Llama 3's BOS), or the end-of-sequence token when it adds none (GPT-2, Qwen2), as each
  // model was trained. Empty when there is neither.
  std::vector<TokenId> document_start() const;
  // The special token spelled `text` (an added token of a tokenizer.json, a family's), if any.
  std::optional<TokenId> special_token(std::string_view text) const;
  TokenizerFamily family() const noexcept;  // as given to load
  const std::filesystem::path& source() const noexcept;  // as given to load
  // FNV-1a 64 of the tokens, <|endoftext|>'s id and the order of the merges, as 16 hex digits:
  // the same for GPT-2's rank file and its vocab.json + merges.txt; for another tokenizer also
  // of what its pipeline does around the merges (its patterns, normaliser, special tokens).
  std::string content_hash() const;

  explicit Tokenizer(std::shared_ptr<const detail::TokenizerImpl> impl);
  const detail::TokenizerImpl& impl() const noexcept { return *impl_; }

 private:
  std::shared_ptr<const detail::TokenizerImpl> impl_;
};

// --- what checkpoints record ---

// A run whose config names data.tokenizer records it in each checkpoint's metadata:
// "lockstep.tokenizer" = "bpe", "lockstep.tokenizer.hash" = content_hash() and
// "lockstep.tokenizer.path" = the absolute path it was read from, and for a rank file of a
// named family "lockstep.tokenizer.family".
LOCKSTEP_API void record_tokenizer(std::map<std::string, std::string>& metadata,
                                   const Tokenizer& tokenizer);

// The tokenizer `metadata` (a checkpoint's, from `file`) records: read from `path` when given,
// else from the recorded path, and refused (InputError naming both) when its content hash is
// not the recorded one. Without a record: `path` read as it is, or nullopt when none is given.
LOCKSTEP_API std::optional<Tokenizer> recorded_tokenizer(
    const std::map<std::string, std::string>& metadata, const std::filesystem::path& file,
    const std::filesystem::path& path = {});

// --- text files into token files ---

struct LOCKSTEP_API TokenizeProgress {
  std::uint64_t bytes = 0;      // of input read
  std::uint64_t documents = 0;
  std::uint64_t tokens = 0;     // written to both outputs, <|endoftext|> included
  double elapsed_s = 0.0;
};

struct LOCKSTEP_API TokenizeOptions {
  // Special tokens' text in the input is that token (tiktoken's allowed_special="all"); false:
  // it is ordinary text.
  bool allow_special = false;
  // Each a document (a text file), a document per line (.jsonl, its "text" field), or "-":
  // standard input, one document.
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path out;
  std::filesystem::path eval_out;  // empty: everything goes to `out`
  double eval_fraction = 0.0;      // of the tokens, when eval_out is given
  TokenFormat format = TokenFormat::llmc;  // llmc or raw (uint16 only)
  std::function<void(const TokenizeProgress&)> on_progress;  // after each batch
  const std::atomic<bool>* stop = nullptr;  // when set, the run ends (Interrupted), writing nothing
};

struct LOCKSTEP_API TokenizeCounts {
  std::uint64_t documents = 0;
  std::uint64_t bytes = 0;          // of text
  std::uint64_t train_tokens = 0;   // in `out`
  std::uint64_t eval_tokens = 0;    // in `eval_out`
  int token_bytes = 2;              // 2 (uint16) or 4 (uint32)
  double seconds = 0.0;
};

// Thrown by tokenize_files when `stop` was set.
class LOCKSTEP_API Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted") {}
};

// Tokenizes `inputs` into llm.c token files (Note [Tokenizing files] in src/text/tokenize_files.cpp
// says how documents are split between the outputs and how much memory it takes): each
// document preceded by the tokenizer's document_start() (<|endoftext|> for GPT-2), uint16 tokens when vocab_size <= 65,536 and uint32 (llm.c
// version 2) above. Each output is written atomically: on an error (InputError naming the file
// and line for bad input) or a stop, neither exists afterwards unless it did before, unchanged.
LOCKSTEP_API TokenizeCounts tokenize_files(const Tokenizer& tokenizer,
                                           const TokenizeOptions& options);

}  // namespace lockstep
