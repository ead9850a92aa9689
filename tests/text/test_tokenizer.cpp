// The tokenizer without Python: GPT-2's byte alphabet, pre-tokenisation, merges by hand, the
// two merge rules, round trips of every byte string, and the readers' refusals.
// (tests/interop/test_tokenizer_reference.cpp compares ids with tiktoken's.)
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "../data/temp_files.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"
#include "text/byte_pair.hpp"
#include "text/tokenizer_impl.hpp"
#include "text/vocabulary.hpp"
#include "vocab_files.hpp"

namespace fs = std::filesystem;
using lockstep::TokenId;
using lockstep::Tokenizer;
using lockstep::test::pieces;
using lockstep::test::TempDir;

namespace {

using Strings = std::vector<std::string>;

// A tokenizer from a rank file, and one from vocab.json + merges.txt, of the same vocabulary.
struct BothForms {
  TempDir dir;
  Tokenizer ranks, hf;
  explicit BothForms(const lockstep::test::SmallVocab& v)
      : ranks(Tokenizer::load(dir.write("small.tiktoken", lockstep::test::rank_file(v)))),
        hf((dir.write("vocab.json", lockstep::test::vocab_json(v)),
            dir.write("merges.txt", lockstep::test::merges_txt(v)), Tokenizer::load(dir.path()))) {}
};

// The message of the InputError loading `path` throws ("" when it loads).
std::string load_error(const fs::path& path) {
  try {
    Tokenizer::load(path);
  } catch (const lockstep::InputError& e) {
    return e.what();
  }
  return "";
}

// Random bytes: mostly text-like, with invalid UTF-8, spaces of every kind and long runs.
std::string random_bytes(std::mt19937& rng, std::size_t size) {
  static const Strings kParts = {"a", "b", "cd", "e", " ", "  ", "\n", "\t", "\xc3\xa9", "'s",
                                 "'LL", "1", "42", "!", "\xe2\x80\x83", "\xe1\xa0\x8e", "\xff",
                                 "\xc3", "\xed\xa0\x80", "\xf0\x9f\x98\x80", "<|endoftext|>"};
  std::string out;
  while (out.size() < size) {
    if (rng() % 4 == 0) out += static_cast<char>(rng() % 256);
    else out += kParts[rng() % kParts.size()];
  }
  return out;
}

}  // namespace

TEST_CASE("tokenizer: GPT-2's printable stand-ins for bytes") {
  using lockstep::detail::byte_to_char;
  CHECK(byte_to_char('A') == U'A');
  CHECK(byte_to_char('!') == U'!');
  CHECK(byte_to_char(' ') == U'\u0120');   // "Ġ", as in " the" = "Ġthe"
  CHECK(byte_to_char('\n') == U'\u010A');  // "Ċ"
  CHECK(byte_to_char(0x00) == U'\u0100');
  CHECK(byte_to_char(0xAD) == U'\u0143');  // the last of the 68 non-printing bytes
  CHECK(byte_to_char(0xFF) == U'\u00FF');
}

TEST_CASE("tokenizer: pre-tokens follow GPT-2's pattern") {
  CHECK(pieces("Hello world") == Strings{"Hello", " world"});
  CHECK(pieces("I'm here, you're 42!") ==
        Strings{"I", "'m", " here", ",", " you", "'re", " 42", "!"});
  // Contractions are lower case only: 'S is a quote and a word.
  CHECK(pieces("IT'S") == Strings{"IT", "'", "S"});
  // A run of spaces leaves its last space to the word after it.
  CHECK(pieces("a   b") == Strings{"a", "  ", " b"});
  CHECK(pieces("a\n\n  b\n") == Strings{"a", "\n\n ", " b", "\n"});
  CHECK(pieces("x  ") == Strings{"x", "  "});
  CHECK(pieces("123abc") == Strings{"123", "abc"});
  CHECK(pieces("caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87") ==
        Strings{"caf\xc3\xa9", " \xe4\xb8\xad\xe6\x96\x87"});
  // U+2003 EM SPACE is a space; U+180E MONGOLIAN VOWEL SEPARATOR is not (PCRE2's \s says it is),
  // so it joins the punctuation before it.
  CHECK(pieces("a!\xe2\x80\x83") == Strings{"a", "!", "\xe2\x80\x83"});
  CHECK(pieces("a!\xe1\xa0\x8e") == Strings{"a", "!\xe1\xa0\x8e"});
  // Invalid UTF-8: each bad run is a piece, and the good text around it splits on its own.
  CHECK(pieces("ab\xff\xfe" "cd") == Strings{"ab", "\xff\xfe", "cd"});
  CHECK(pieces("a \xff") == Strings{"a", " ", "\xff"});
  CHECK(pieces("\xc3(") == Strings{"\xc3", "("});
}

TEST_CASE("tokenizer: merges by hand, in both files") {
  const BothForms t(lockstep::test::hand_vocab());
  for (const Tokenizer* tok : {&t.ranks, &t.hf}) {
    CAPTURE(tok->source().string());
    CHECK(tok->vocab_size() == 266);
    CHECK(tok->end_of_text() == 265u);
    CHECK(tok->encode("the") == std::vector<TokenId>{257});
    CHECK(tok->encode(" the") == std::vector<TokenId>{258});
    CHECK(tok->encode("abcd") == std::vector<TokenId>{262});  // ab, then cd, then abcd
    CHECK(tok->encode("bcd") == std::vector<TokenId>{260, 'd'});
    CHECK(tok->encode("eee") == std::vector<TokenId>{263, 'e'});  // the left pair first
    CHECK(tok->encode("the abcd\n\n") == std::vector<TokenId>{257, ' ', 262, 264});
    CHECK(tok->encode("") == std::vector<TokenId>{});
  }
  CHECK(t.ranks.content_hash() == t.hf.content_hash());
}

TEST_CASE("tokenizer: a rank file merges any two tokens that make a token, merges.txt only its pairs") {
  // abc is a token, but merges.txt lists only "a bc" for it: after "a b" merges first, the
  // pair "ab c" is not listed. The rank file merges ab + c all the same (tiktoken's rule).
  const lockstep::test::SmallVocab v{{{"a", "b"}, {"b", "c"}, {"a", "bc"}}};
  const BothForms t(v);
  CHECK(t.ranks.encode(" abc") == std::vector<TokenId>{' ', 258});
  CHECK(t.hf.encode(" abc") == std::vector<TokenId>{' ', 256, 'c'});
}

TEST_CASE("tokenizer: <|endoftext|> is special only when asked") {
  const BothForms t(lockstep::test::hand_vocab());
  const std::vector<TokenId> ordinary = t.ranks.encode("a<|endoftext|>b");
  CHECK(std::find(ordinary.begin(), ordinary.end(), 265u) == ordinary.end());
  CHECK(t.ranks.decode(ordinary) == "a<|endoftext|>b");
  CHECK(t.ranks.encode_with_special("the<|endoftext|>the") == std::vector<TokenId>{257, 265, 257});
  CHECK(t.hf.encode_with_special("<|endoftext|>") == std::vector<TokenId>{265});
  CHECK(t.ranks.decode(std::vector<TokenId>{265}) == "<|endoftext|>");
  CHECK_THROWS_AS(t.ranks.decode(std::vector<TokenId>{266}), lockstep::InputError);
}

TEST_CASE("tokenizer: every byte string decodes back to itself, and scan and heap agree") {
  const lockstep::test::SmallVocab v = lockstep::test::random_vocab(400, 7);
  const BothForms t(v);
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    const std::string text = random_bytes(rng, rng() % 400);
    CAPTURE(round);
    for (const Tokenizer* tok : {&t.ranks, &t.hf}) {
      const std::vector<TokenId> ids = tok->encode(text);
      REQUIRE(tok->decode(ids) == text);
      // Again, now from the cache: the same ids.
      REQUIRE(tok->encode(text) == ids);
    }
  }
  // Long pieces (a run of letters) through both searches for the lowest pair.
  const auto& vocabulary = t.hf.impl().vocabulary;
  for (int round = 0; round < 200; ++round) {
    std::string piece;
    const std::size_t size = 1 + rng() % 300;
    while (piece.size() < size) piece += "abcde"[rng() % 5];
    std::vector<TokenId> scan, heap;
    lockstep::detail::byte_pair_encode(piece, vocabulary, scan, lockstep::detail::MergeSearch::scan);
    lockstep::detail::byte_pair_encode(piece, vocabulary, heap, lockstep::detail::MergeSearch::heap);
    REQUIRE(scan == heap);
    REQUIRE(t.hf.decode(scan) == piece);
  }
}

TEST_CASE("tokenizer: a megabyte-long piece encodes (the heap search, and PCRE2's JIT stack)") {
  const BothForms t(lockstep::test::random_vocab(400, 3));
  std::string letters(1 << 20, 'a');
  for (std::size_t i = 0; i < letters.size(); i += 7) letters[i] = "bcde"[i % 4];
  CHECK(t.hf.decode(t.hf.encode(letters)) == letters);
  std::string spaces(1 << 20, ' ');
  spaces += 'x';
  CHECK(t.ranks.decode(t.ranks.encode(spaces)) == spaces);
}

TEST_CASE("tokenizer: a pre-token past kMaxPieceBytes is merged in pieces cut at characters") {
  // Note [Long pre-tokens]: 'a' x (limit - 1), a 3-byte character across the limit, then 'b's
  // past a second limit. The first cut backs up to the character's first byte; the second
  // falls between two 'b's, kMaxPieceBytes on.
  using lockstep::detail::byte_pair_encode;
  using lockstep::detail::kMaxPieceBytes;
  using lockstep::detail::MergeSearch;
  const BothForms t(lockstep::test::random_vocab(400, 3));
  const auto& vocabulary = t.hf.impl().vocabulary;
  std::string piece(kMaxPieceBytes - 1, 'a');
  piece += "\xE2\x82\xAC";  // U+20AC
  piece += std::string(kMaxPieceBytes + 100, 'b');
  const std::string_view all = piece;
  std::vector<TokenId> expected;
  for (const auto& [at, size] : {std::pair<std::size_t, std::size_t>{0, kMaxPieceBytes - 1},
                                 {kMaxPieceBytes - 1, kMaxPieceBytes},
                                 {2 * kMaxPieceBytes - 1, std::string_view::npos}}) {
    REQUIRE(all.substr(at, size).size() <= kMaxPieceBytes);
    byte_pair_encode(all.substr(at, size), vocabulary, expected, MergeSearch::heap);
  }
  std::vector<TokenId> got;
  byte_pair_encode(all, vocabulary, got);
  CHECK(got == expected);
  CHECK(t.hf.decode(got) == piece);
  // Through the tokenizer: a run of letters is one pre-token, merged in three pieces.
  std::string letters(2 * kMaxPieceBytes + 5, 'a');
  for (std::size_t i = 0; i < letters.size(); i += 7) letters[i] = "bcde"[i % 4];
  std::vector<TokenId> pieces;
  for (std::size_t at = 0; at < letters.size(); at += kMaxPieceBytes)
    byte_pair_encode(std::string_view(letters).substr(at, kMaxPieceBytes), vocabulary, pieces);
  CHECK(t.hf.encode(letters) == pieces);
}

TEST_CASE("tokenizer: a tiktoken rank file is refused with its line for each flaw") {
  const TempDir dir;
  const std::string good = lockstep::test::rank_file(lockstep::test::hand_vocab());
  const auto error = [&](const std::string& text) {
    return load_error(dir.write("bad.tiktoken", text));
  };
  const std::string name = (dir.path() / "bad.tiktoken").string();
  CHECK(error(good) == "");
  CHECK(error("YQ== 0\nYg==\n") == name + ":2: expected \"BASE64 RANK\", got \"Yg==\"");
  CHECK(error("YQ== 0\nY!== 1\n") ==
        name + ":2: \"Y!==\" is not a base64 token (RFC 4648, with padding)");
  CHECK(error("YR== 0\n").starts_with(name + ":1: \"YR==\" is not a base64 token"));
  CHECK(error("YQ== 0\nYg== x1\n").starts_with(name + ":2: rank \"x1\": expected an integer"));
  CHECK(error("YQ== 0\nYg== 0\n") == name + ":2: duplicate rank 0: 'a' (line 1) and 'b' (line 2)");
  CHECK(error("YQ== 0\nYQ== 1\n") == name + ":2: duplicate token 'a': ranks 0 (line 1) and 1 (line 2)");
  CHECK(error("YQ== 0\nYg== 2\n").starts_with(name + ": rank 1 is missing (the ranks run to 2)"));
  CHECK(error(good.substr(0, good.size() - 3)) ==
        name + ":265: the last line has no line end: a truncated file?");
  // The first 255 lines: byte 0xff has no token.
  const std::size_t line_255 = [&] {
    std::size_t at = 0;
    for (int i = 0; i < 255; ++i) at = good.find('\n', at) + 1;
    return at;
  }();
  CHECK(error(good.substr(0, line_255)).starts_with(name + ": byte 0xff has no token"));
  CHECK(error("") == name + ": no tokens: an empty tiktoken rank file");
}

TEST_CASE("tokenizer: a rank file of many pieces loads as read line by line, and its first bad line is named") {
  // 30,000 ranks (about 330 KB: six of parse_tiktoken's 64 KiB pieces): the 256 bytes, then
  // every 2- and 3-letter string of a..z (which merge), then unmergeable 4-byte strings.
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) tokens.push_back({a, b});
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b)
      for (char c = 'a'; c <= 'z'; ++c) tokens.push_back({a, b, c});
  for (int i = 0; tokens.size() < 30000; ++i)
    tokens.push_back({'\x01', static_cast<char>('A' + i % 26), static_cast<char>('A' + i / 26 % 26),
                      static_cast<char>('0' + i / 676)});
  std::string text;
  for (std::size_t id = 0; id < tokens.size(); ++id)
    text += fmt::format("{} {}\n", lockstep::test::base64(tokens[id]), id);
  REQUIRE(text.size() > 5 * (std::size_t{1} << 16));

  // Every split into two tokens merges at the token's rank, as the serial rule gives them.
  const lockstep::detail::Vocabulary v = lockstep::detail::parse_tiktoken(text, "big.tiktoken");
  REQUIRE(v.tokens.size() == tokens.size() + 1);  // and <|endoftext|>
  std::size_t expected = 0;
  for (std::size_t id = 0; id < tokens.size(); ++id)
    for (std::size_t k = 1; k < tokens[id].size(); ++k) {
      const auto left = v.by_bytes.find(tokens[id].substr(0, k));
      const auto right = v.by_bytes.find(tokens[id].substr(k));
      if (left == v.by_bytes.end() || right == v.by_bytes.end()) continue;
      ++expected;
      const lockstep::detail::Merge* m = v.find_merge(left->second, right->second);
      REQUIRE(m != nullptr);
      CHECK(m->merged == id);
      CHECK(m->priority == id);
    }
  CHECK(expected == 26 * 26 + 2 * 26 * 26 * 26);
  CHECK(v.merges.size() == expected);

  // A bad line in a late piece is named by its line in the file; of two, the first.
  const auto line_start = [&](std::size_t line) {
    std::size_t at = 0;
    for (std::size_t i = 1; i < line; ++i) at = text.find('\n', at) + 1;
    return at;
  };
  const auto with_bad = [&](std::size_t line) {
    std::string t = text;
    t.replace(line_start(line), text.find('\n', line_start(line)) - line_start(line), "Yg==");
    return t;
  };
  const auto error = [](const std::string& t) {
    try {
      lockstep::detail::parse_tiktoken(t, "big.tiktoken");
    } catch (const lockstep::InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error(with_bad(27000)) == "big.tiktoken:27000: expected \"BASE64 RANK\", got \"Yg==\"");
  std::string two = with_bad(29000);
  two.replace(line_start(12000), two.find('\n', line_start(12000)) - line_start(12000), "Yw==");
  CHECK(error(two) == "big.tiktoken:12000: expected \"BASE64 RANK\", got \"Yw==\"");
  CHECK(error(text.substr(0, text.size() - 1)) ==
        "big.tiktoken:30000: the last line has no line end: a truncated file?");
}

TEST_CASE("tokenizer: vocab.json and merges.txt are refused with their line for each flaw") {
  const lockstep::test::SmallVocab v = lockstep::test::hand_vocab();
  const std::string vocab = lockstep::test::vocab_json(v), merges = lockstep::test::merges_txt(v);
  const auto error = [&](const std::string& vocab_text, const std::string& merges_text) {
    const TempDir dir;
    dir.write("vocab.json", vocab_text);
    dir.write("merges.txt", merges_text);
    std::string e = load_error(dir.path());
    // Messages name the files by their paths: keep the names only.
    const std::string prefix = dir.path().string() + "/";
    for (std::size_t at; (at = e.find(prefix)) != std::string::npos;) e.erase(at, prefix.size());
    return e;
  };
  CHECK(error(vocab, merges) == "");
  CHECK(error("{\"a\": 0,\n\"b\": }", merges) == "vocab.json:2: expected a value, got '}'");
  CHECK(error("{\"a\": 0,\n\"a\": 1}", merges) == "vocab.json:2: duplicate key \"a\"");
  CHECK(error("{\"a\": 0,\n\"b\": -1}", merges).starts_with(
      "vocab.json:2: the vocabulary: token \"b\": expected an id in [0, 2147483647], got -1"));
  CHECK(error("{\"a\": 0,\n\"b\": 0}", merges) ==
        "vocab.json:2: duplicate id 0: 'a' (line 1) and 'b' (line 2)");
  CHECK(error("{\"a\": 0,\n\"\\u00e9 \": 1}", merges).starts_with(
      "vocab.json:2: the vocabulary: token \"\xc3\xa9 \" has a character outside GPT-2's"));
  CHECK(error("{\"a\": 0, \"b\": 2}", merges).starts_with("vocab.json: id 1 is missing"));
  CHECK(error("[1, 2]", merges).starts_with("vocab.json:1: the vocabulary: expected an object"));
  CHECK(error(vocab, merges + "x y\n") ==
        "merges.txt:11: merge \"x y\": the merged token \"xy\" is not in vocab.json");
  CHECK(error(vocab, merges + "the zz\n") ==
        "merges.txt:11: merge \"the zz\": \"zz\" is not a token of vocab.json");
  CHECK(error(vocab, merges + "t h\n") ==
        "merges.txt:11: merge \"t h\" is listed twice (first as merge 1)");
  CHECK(error(vocab, merges + "th\n") ==
        "merges.txt:11: expected a merge \"LEFT RIGHT\" (two tokens, one space), got \"th\"");
  CHECK(error(vocab, "#version: 0.2\nt h\n\nth e\n") ==
        "merges.txt:3: empty line: expected a merge \"LEFT RIGHT\"");
}

TEST_CASE("tokenizer: what load refuses to guess") {
  const TempDir dir;
  const std::string d = dir.path().string();
  CHECK(load_error(dir.path()).starts_with(d + ": a directory without tokenizer.json"));
  CHECK(load_error(dir.write("vocab.json", "{}")) ==
        d + "/vocab.json: vocab.json needs its merges.txt beside it: give the directory");
  CHECK(load_error(dir.write("gpt2.txt", "x")).starts_with(d + "/gpt2.txt: expected a Hugging Face"));
  CHECK(load_error(dir.path() / "none.tiktoken").starts_with(d + "/none.tiktoken: cannot open"));
}
