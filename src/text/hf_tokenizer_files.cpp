#include "text/hf_tokenizer_files.hpp"

#include <fmt/format.h>

#include <limits>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "io/durable_file.hpp"
#include "io/file_roles.hpp"
#include "lockstep/error.hpp"
#include "text/tokenizer_impl.hpp"

namespace lockstep::detail {
namespace fs = std::filesystem;
namespace {

void write_text(const fs::path& file, const std::string& text) {
  const std::span<const std::byte> bytes = std::as_bytes(std::span(text));
  write_file_atomically(file, std::span(&bytes, 1));
}

// A token's bytes in GPT-2's printable form (byte_to_char), as UTF-8.
std::string printable(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const char32_t cp = byte_to_char(static_cast<unsigned char>(c));
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {  // below U+0800: two bytes
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// A JSON string of printable() text, in which only '"' and '\\' need escaping.
std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + '"';
}

// Note [merges.txt from ranks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A rank file has no merges, only tokens by rank; merges.txt needs the pair each token is made
// of. Byte-pair encoding a token's bytes with the merges of lower rank alone leaves the two
// tokens its own merge joins (that is how tiktoken's ranks were made from GPT-2's merges), so
// each token's line is those two, in rank order: the merges.txt GPT-2 ships, from its rank file.
std::pair<TokenId, TokenId> merge_of(const Vocabulary& v, TokenId token, const fs::path& source) {
  const std::string& bytes = v.tokens[token];
  std::vector<TokenId> parts;
  for (const char c : bytes) parts.push_back(v.byte_token[static_cast<unsigned char>(c)]);
  const auto fail = [&] {
    throw InputError(fmt::format("{}: token {} ('{}') is not a merge of two tokens of lower rank: "
                                 "it cannot be written as merges.txt", source.string(), token,
                                 printable(bytes)));
  };
  const std::uint32_t rank = token;  // a rank file's ids are its ranks
  while (parts.size() > 2) {
    std::size_t best = parts.size();
    std::uint32_t best_priority = rank;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i)
      if (const Merge* m = v.find_merge(parts[i], parts[i + 1]); m && m->priority < best_priority) {
        best = i;
        best_priority = m->priority;
      }
    if (best == parts.size()) fail();
    parts[best] = v.find_merge(parts[best], parts[best + 1])->merged;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  const Merge* own = parts.size() == 2 ? v.find_merge(parts[0], parts[1]) : nullptr;
  if (!own || own->merged != token) fail();
  return {parts[0], parts[1]};
}

// vocab.json and merges.txt of a rank file's vocabulary.
void write_vocab_and_merges(const Vocabulary& v, const fs::path& dir, const fs::path& source) {
  std::string vocab = "{";
  std::string merges = "#version: 0.2\n";
  for (TokenId id = 0; id < v.tokens.size(); ++id) {
    const bool special = v.end_of_text && id == *v.end_of_text;
    vocab += fmt::format("{}{}: {}", id == 0 ? "" : ", ",
                         json_string(special ? std::string(kEndOfText) : printable(v.tokens[id])),
                         id);
    if (special || v.tokens[id].size() < 2) continue;
    const auto [left, right] = merge_of(v, id, source);
    merges += printable(v.tokens[left]) + " " + printable(v.tokens[right]) + "\n";
  }
  write_text(dir / "vocab.json", vocab + "}\n");
  write_text(dir / "merges.txt", merges);
}

}  // namespace

void write_hf_tokenizer(const Tokenizer& tokenizer, const fs::path& dir, int context) {
  const fs::path& source = tokenizer.source();
  const bool gpt2 = tokenizer.impl().pipeline.gpt2 && tokenizer.impl().pipeline.prefix.empty();
  std::error_code ec;
  bool has_config = false;
  if (fs::is_directory(source, ec)) {
    for (const std::string_view name : kTokenizerFiles)
      if (fs::exists(source / name, ec)) {
        fs::copy_file(source / name, dir / name, fs::copy_options::overwrite_existing);
        has_config = has_config || name == "tokenizer_config.json";
      }
  } else if (source.extension() == ".json") {
    fs::copy_file(source, dir / "tokenizer.json", fs::copy_options::overwrite_existing);
    if (fs::exists(source.parent_path() / "tokenizer_config.json", ec)) {
      fs::copy_file(source.parent_path() / "tokenizer_config.json", dir / "tokenizer_config.json",
                    fs::copy_options::overwrite_existing);
      has_config = true;
    }
  } else if (gpt2) {
    write_vocab_and_merges(tokenizer.impl().vocabulary, dir, source);
  } else {
    throw InputError(fmt::format("{}: a rank file of a family other than GPT-2's has no Hugging "
                                 "Face form lockstep can write (vocab.json and merges.txt mean "
                                 "GPT-2's pattern): give --tokenizer the model's own "
                                 "tokenizer.json directory", source.string()));
  }
  if (has_config) return;  // the tokenizer's own, verbatim
  const auto name = [&](std::optional<TokenId> id) {
    return id ? json_string(tokenizer.token_bytes(*id)) : std::string("null");
  };
  write_text(dir / "tokenizer_config.json",
             fmt::format("{{\n  \"tokenizer_class\": \"{}\",\n"
                         "  \"model_max_length\": {},\n  \"add_prefix_space\": false,\n"
                         "  \"bos_token\": {},\n  \"eos_token\": {},\n  \"unk_token\": {}\n}}\n",
                         gpt2 ? "GPT2Tokenizer" : "PreTrainedTokenizerFast", context,
                         name(tokenizer.begin_of_text()), name(tokenizer.end_of_text()),
                         gpt2 ? name(tokenizer.end_of_text()) : "null"));
}

}  // namespace lockstep::detail
