// Small byte-level BPE vocabularies for tests, written as a tiktoken rank file and as a Hugging
// Face vocab.json + merges.txt, so that tests need neither Python nor GPT-2's files; and the
// pre-tokens of a text and the tokens of a token file.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "text/pretokenize.hpp"
#include "text/vocabulary.hpp"  // byte_to_char

namespace lockstep::test {

// A vocabulary: the 256 bytes (id = byte), then one token per merge (id 256 + i) in priority
// order, then <|endoftext|>.
struct SmallVocab {
  std::vector<std::pair<std::string, std::string>> merges;

  std::vector<std::string> tokens() const {
    std::vector<std::string> out;
    for (int b = 0; b < 256; ++b) out.emplace_back(1, static_cast<char>(b));
    for (const auto& [left, right] : merges) out.push_back(left + right);
    return out;
  }
  std::uint32_t end_of_text() const { return static_cast<std::uint32_t>(256 + merges.size()); }
};

// abcd = ab + cd; the = th + e; eee merges its left pair first.
inline SmallVocab hand_vocab() {
  return {{{"t", "h"}, {"th", "e"}, {" ", "the"}, {"a", "b"}, {"b", "c"}, {"c", "d"},
           {"ab", "cd"}, {"e", "e"}, {"\n", "\n"}}};
}

// `count` merges of random pairs of earlier tokens over a few letters and a space, so that
// they fire often in text of those letters.
inline SmallVocab random_vocab(int count, std::uint32_t seed) {
  SmallVocab v;
  std::vector<std::string> pool = {"a", "b", "c", "d", "e", " ", "\xc3", "\xa9"};
  std::mt19937 rng(seed);
  std::unordered_set<std::string> seen(pool.begin(), pool.end());
  while (static_cast<int>(v.merges.size()) < count) {
    // Short tokens more often than long ones: most pairs of two long ones are too long.
    const std::size_t a = rng() % pool.size(), b = rng() % (rng() % pool.size() + 1);
    if (pool[a].size() + pool[b].size() > 16) continue;
    std::string joined = pool[a] + pool[b];
    if (!seen.insert(joined).second) continue;
    v.merges.emplace_back(pool[a], pool[b]);
    pool.push_back(std::move(joined));
  }
  return v;
}

inline std::string base64(std::string_view bytes) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    std::uint32_t group = 0;
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    for (std::size_t k = 0; k < 3; ++k)
      group = (group << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (std::size_t k = 0; k < 4; ++k)
      out += k <= n ? kAlphabet[(group >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// "BASE64 RANK" per line, rank = id.
inline std::string rank_file(const SmallVocab& v) {
  std::string out;
  const std::vector<std::string> tokens = v.tokens();
  for (std::size_t id = 0; id < tokens.size(); ++id)
    out += fmt::format("{} {}\n", base64(tokens[id]), id);
  return out;
}

// GPT-2's printable form of a token's bytes, as vocab.json and merges.txt write them.
inline std::string printable_token(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const char32_t cp = detail::byte_to_char(static_cast<unsigned char>(c));
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// A JSON string literal of printable_token's output (which has only '"' and '\\' to escape).
inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + '"';
}

inline std::string vocab_json(const SmallVocab& v) {
  std::string out = "{";
  const std::vector<std::string> tokens = v.tokens();
  for (std::size_t id = 0; id < tokens.size(); ++id)
    out += fmt::format("{}{}: {}", id ? ", " : "", json_string(printable_token(tokens[id])), id);
  return out + fmt::format(", \"<|endoftext|>\": {}}}", v.end_of_text());
}

inline std::string merges_txt(const SmallVocab& v) {
  std::string out = "#version: 0.2\n";
  for (const auto& [left, right] : v.merges)
    out += printable_token(left) + " " + printable_token(right) + "\n";
  return out;
}

// The tokens of an llm.c token file, checked against its header (doctest REQUIREs).
inline std::vector<std::uint32_t> read_llmc(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  REQUIRE(bytes.size() >= 1024);
  std::int32_t head[3];
  std::memcpy(head, bytes.data(), sizeof head);
  REQUIRE(head[0] == 20240520);
  REQUIRE((head[1] == 1 || head[1] == 2));
  const std::size_t width = head[1] == 1 ? 2 : 4;
  REQUIRE(bytes.size() == 1024 + width * static_cast<std::size_t>(head[2]));
  std::vector<std::uint32_t> out(static_cast<std::size_t>(head[2]));
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint32_t v = 0;
    std::memcpy(&v, bytes.data() + 1024 + i * width, width);
    out[i] = v;
  }
  return out;
}

// The pre-tokens of `text`, as the tokenizer splits it.
inline std::vector<std::string> pieces(std::string_view text) {
  static const detail::PretokenPattern pattern;
  detail::PieceSplitter splitter(pattern);
  std::vector<std::string_view> views;
  splitter.split(text, views);
  return {views.begin(), views.end()};
}

}  // namespace lockstep::test
