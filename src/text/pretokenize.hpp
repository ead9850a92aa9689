// Pre-tokenisation: splitting text into the pieces that byte-pair encoding sees, by GPT-2's
// pattern or a tokenizer.json's (Note [Split patterns] in pretokenize.cpp).
//
// Note [Pre-tokens]
// GPT-2 splits text with one regular expression before any merging, and a merge never crosses
// a piece:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// tiktoken runs it with Rust's regex classes; we run it with PCRE2 and its JIT (Debian's
// libpcre2-dev), chosen over ICU for speed (a JIT-compiled pattern, no UTF-16 conversion) and
// because PCRE2 names the same Unicode classes. Two details make the two engines agree:
// - \s is written \p{White_Space}, Rust's meaning. PCRE2's own \s (with PCRE2_UCP) adds
//   U+180E MONGOLIAN VOWEL SEPARATOR, which Unicode stopped calling a space in 6.3.
// - Both backtrack alike here (leftmost alternative first, greedy repeats), so
//   \s+(?!\S) leaves the last space of a run before a word to that word (" world").
// PCRE2's Unicode tables are its own release's (Debian 12's 10.42: Unicode 14.0); tiktoken's
// Rust regex has Unicode 15.0. The 4,489 code points Unicode 15 added (Kawi, Nag Mundari, CJK
// extension H, ...) are unassigned to PCRE2 10.42, so text in them may split differently.
//
// Invalid UTF-8. tiktoken encodes Python strings, which hold no invalid UTF-8; its private
// bytes entry point (_encode_bytes) merges everything after the first bad byte as one piece.
// We define the bytes case so that every byte string has ids and decode(encode(x)) == x: the
// text is cut into maximal runs of well-formed UTF-8 and maximal runs of bytes that start no
// well-formed sequence; each well-formed run is split by the pattern as if it were the whole
// text (so tiktoken's ids for it are ours), and each bad run is one piece. The reference test
// builds the same from tiktoken's encode_ordinary and _encode_single_piece.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::detail {

// GPT-2's pattern with Rust's \s (Note [Pre-tokens]); also ByteLevel's use_regex in a
// tokenizer.json.
extern const std::string_view kGpt2Pattern;

// A pattern PCRE2 refused: its message and the offset in the pattern.
struct PatternError {
  std::string message;
  std::size_t offset;
};

// The compiled pattern, shared by every thread.
class PretokenPattern {
 public:
  // GPT-2's, matched anchored: it matches at every offset, so its matches tile the text. Throws
  // std::runtime_error if PCRE2 refuses it (a build problem).
  PretokenPattern();
  // A tokenizer.json's Split pattern, searched for (Note [Split patterns]): a regex with \s and
  // \S meaning Rust's and Oniguruma's White_Space, or with `literal` a string. Throws
  // PatternError.
  PretokenPattern(std::string_view pattern, bool literal);
  ~PretokenPattern();
  PretokenPattern(const PretokenPattern&) = delete;
  PretokenPattern& operator=(const PretokenPattern&) = delete;

 private:
  friend class PieceSplitter;
  struct Code;
  std::unique_ptr<Code> code_;
};

// A match of a searched pattern: [begin, end) of the text given to find().
struct MatchSpan {
  std::size_t begin, end;
};

// One thread's splitter: PCRE2's match data and JIT stack.
class PieceSplitter {
 public:
  explicit PieceSplitter(const PretokenPattern& pattern);
  ~PieceSplitter();
  PieceSplitter(PieceSplitter&&) noexcept;
  PieceSplitter& operator=(PieceSplitter&&) = delete;

  // GPT-2's pattern: the pieces of `text` in order, views into it; they tile it. Replaces
  // `pieces`.
  void split(std::string_view text, std::vector<std::string_view>& pieces);
  // A searched pattern: its non-empty, non-overlapping matches in `text` (valid UTF-8), left to
  // right, as PCRE2 finds them from the end of the last. Replaces `matches`.
  void find(std::string_view text, std::vector<MatchSpan>& matches);

 private:
  void split_valid(std::string_view text, std::vector<std::string_view>& pieces);
  const PretokenPattern::Code* code_;
  struct MatchState;
  std::unique_ptr<MatchState> state_;
};

}  // namespace lockstep::detail
