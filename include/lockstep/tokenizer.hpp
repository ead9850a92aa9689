// GPT-2's byte-level BPE tokenizer, and text files made into llm.c token files with it.
//
//   // A Hugging Face GPT-2 directory (vocab.json + merges.txt), or gpt2.tiktoken
//   const lockstep::Tokenizer gpt2 = lockstep::Tokenizer::load("gpt2/");
//   std::vector<lockstep::TokenId> ids = gpt2.encode("Hello world");      // {15496, 995}
//   std::string text = gpt2.decode(ids);                                   // "Hello world"
//
//   lockstep::TokenizeOptions opt;
//   opt.inputs = {"book.txt", "web.jsonl"};
//   opt.out = "train.bin";
//   lockstep::TokenizeCounts counts = lockstep::tokenize_files(gpt2, opt);
//
// Encoding is tiktoken's `gpt2` encoding exactly, for every byte string (Note [Pre-tokens] in
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

// Immutable once loaded; copies share it, and every method may be called from any thread.
class LOCKSTEP_API Tokenizer {
 public:
  // Reads a Hugging Face GPT-2 directory (tokenizer.json, else vocab.json and merges.txt), a
  // tokenizer.json, or a tiktoken rank file (*.tiktoken: "BASE64 RANK" per line; <|endoftext|>
  // takes the id after the last rank, as in tiktoken's gpt2). Throws InputError naming the file
  // and line for anything else, a malformed or truncated file, duplicate ids, ranks or tokens,
  // and merges naming tokens the vocabulary lacks.
  static Tokenizer load(const std::filesystem::path& path);

  // The ids of `text`. <|endoftext|> in the text is ordinary text here, never the special id.
  std::vector<TokenId> encode(std::string_view text) const;
  // The same, appended to `out`.
  void encode(std::string_view text, std::vector<TokenId>& out) const;
  // The ids of `text`, where each "<|endoftext|>" is the special token.
  std::vector<TokenId> encode_with_special(std::string_view text) const;
  // The bytes of `ids`. Throws InputError for an id outside the vocabulary.
  std::string decode(std::span<const TokenId> ids) const;
  // The bytes of one token (a piece of UTF-8, or not: a token may hold part of a character).
  std::string_view token_bytes(TokenId id) const;

  std::size_t vocab_size() const noexcept;        // ids are in [0, vocab_size)
  std::optional<TokenId> end_of_text() const noexcept;
  const std::filesystem::path& source() const noexcept;  // as given to load
  // FNV-1a 64 of the tokens, <|endoftext|>'s id and the order of the merges, as 16 hex digits:
  // the same for GPT-2's rank file and its vocab.json + merges.txt.
  std::string content_hash() const;

  explicit Tokenizer(std::shared_ptr<const detail::TokenizerImpl> impl);
  const detail::TokenizerImpl& impl() const noexcept { return *impl_; }

 private:
  std::shared_ptr<const detail::TokenizerImpl> impl_;
};

// --- what checkpoints record ---

// A run whose config names data.tokenizer records it in each checkpoint's metadata:
// "lockstep.tokenizer" = "bpe", "lockstep.tokenizer.hash" = content_hash() and
// "lockstep.tokenizer.path" = the absolute path it was read from.
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
// document preceded by <|endoftext|>, uint16 tokens when vocab_size <= 65,536 and uint32 (llm.c
// version 2) above. Each output is written atomically: on an error (InputError naming the file
// and line for bad input) or a stop, neither exists afterwards unless it did before, unchanged.
LOCKSTEP_API TokenizeCounts tokenize_files(const Tokenizer& tokenizer,
                                           const TokenizeOptions& options);

}  // namespace lockstep
