// A byte-level BPE vocabulary, and its three readers: a tiktoken rank file, a Hugging Face
// vocab.json with its merges.txt, and a Hugging Face tokenizer.json.
//
// Every reader is strict: a malformed or truncated file, a duplicate token or rank, a merge that
// names a token the vocabulary lacks, a vocabulary without all 256 single bytes, or ids with a
// gap is an InputError naming the file and line ("vocab.json:3: ...").
//
// Note [Two kinds of merge rule]
// tiktoken and Hugging Face describe the same algorithm two ways. Both start from one token per
// byte and repeatedly merge the adjacent pair of lowest priority, the leftmost among equals,
// until no adjacent pair may merge; they differ in which pairs may merge:
// - a tiktoken rank file lists tokens with ranks (which are also their ids); two adjacent parts
//   may merge when their concatenation is a token, with that token's rank as the priority, and
//   a pre-token that is itself a token is that token without merging at all;
// - merges.txt lists pairs "a b" in priority order; exactly the listed pairs may merge.
// Vocabulary holds both as one table of pairs, (left id, right id) -> (priority, merged id): a
// rank file contributes every split of every token into two tokens, merges.txt its lines. The
// whole-piece shortcut is kept only for rank files (whole_piece_lookup), so each file encodes
// exactly as its own library does. For GPT-2 the two files give the same ids.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lockstep/tokenizer.hpp"

namespace lockstep::detail {

// GPT-2's end-of-text marker.
inline constexpr std::string_view kEndOfText = "<|endoftext|>";

struct Merge {
  std::uint32_t priority;  // lower merges first
  TokenId merged;
};

// (left, right) -> Merge, in one array probed linearly: looked up for every adjacent pair of
// every piece the cache has not seen, it is the encoder's hottest table, and a node-based map
// spent a quarter of the encode time there on non-English text.
class MergeTable {
 public:
  // Adds the pair unless it is there; returns the pair's Merge, the new or the old one.
  const Merge& insert(TokenId left, TokenId right, Merge merge);
  const Merge* find(TokenId left, TokenId right) const noexcept {
    if (slots_.empty()) return nullptr;
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = slot_of(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return &slots_[i].merge;
      if (slots_[i].key == kFree) return nullptr;
    }
  }
  std::size_t size() const noexcept { return size_; }
  // Room for `count` pairs without growing.
  void reserve(std::size_t count);
  // Every merge, in no particular order.
  std::vector<Merge> merges() const;

 private:
  struct Slot {
    std::uint64_t key;
    Merge merge;
  };
  // Ids are below 2^31, so no pair packs to this.
  static constexpr std::uint64_t kFree = ~std::uint64_t{0};
  static std::uint64_t pack(TokenId left, TokenId right) noexcept {
    return (static_cast<std::uint64_t>(left) << 32) | right;
  }
  std::size_t slot_of(std::uint64_t key) const noexcept {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void grow(std::size_t slots = 0);  // to `slots` (a power of two), or twice the size

  std::vector<Slot> slots_;  // a power of two, at most half full
  std::size_t size_ = 0;
  int shift_ = 64;
};

// Heterogeneous lookup: a piece (string_view) finds its token without a std::string.
struct BytesHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

struct Vocabulary {
  std::vector<std::string> tokens;           // by id: the token's bytes
  std::array<TokenId, 256> byte_token{};     // the id of each single byte
  MergeTable merges;
  bool whole_piece_lookup = false;           // Note [Two kinds of merge rule]
  std::unordered_map<std::string, TokenId, BytesHash, std::equal_to<>> by_bytes;
  std::optional<TokenId> end_of_text;        // "<|endoftext|>", never produced from text
  // Ids that are not the model's (added tokens, a rank file's special tokens): never the
  // whole-piece shortcut's answer.
  std::vector<TokenId> outside_model;

  const Merge* find_merge(TokenId left, TokenId right) const {
    return merges.find(left, right);
  }
};

// GPT-2's printable stand-in for each byte in vocab.json and merges.txt: bytes that print as
// themselves ('!'..'~', '¡'..'¬', '®'..'ÿ') keep their code point, the other 68 take U+0100
// onwards in byte order. Returns the code point for `byte`.
char32_t byte_to_char(unsigned char byte);

// The readers take a file's text and its name for messages (the fuzzer gives bytes); those of
// tokenizer.json are in pipeline.hpp.
Vocabulary parse_tiktoken(std::string_view text, const std::string& name);
Vocabulary parse_hf_vocab(std::string_view vocab_json, const std::string& vocab_name,
                          std::string_view merges_txt, const std::string& merges_name);

struct JsonValue;
// The line (from 1) of `offset` in `text`.
std::size_t line_of(std::string_view text, std::size_t offset);
// The member `key` of a JSON object, or null.
const JsonValue* json_member(const JsonValue& object, std::string_view key);

}  // namespace lockstep::detail
