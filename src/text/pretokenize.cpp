// Pre-tokenisation with PCRE2: GPT-2's pattern (Note [Pre-tokens]) and a tokenizer.json's Split
// patterns (Note [Split patterns]).
//
// Note [Split patterns]
// A tokenizer.json's Split pre-tokenizer names a regex that Hugging Face's `tokenizers` runs with
// Oniguruma, and tiktoken's families (Llama 3, Qwen2) write the same patterns for Rust's
// fancy-regex. We compile it once with PCRE2 and its JIT, with the one change Note [Pre-tokens]
// makes to GPT-2's: \s and \S become \p{White_Space} and \P{White_Space}, the meaning both of
// those engines give them. Unlike GPT-2's pattern, which matches at every offset and is run
// anchored, a file's pattern is searched for, as `tokenizers` does: the text between two matches
// is a piece too (or is dropped, as the Split's behaviour says), and an empty match is skipped.
#include "text/pretokenize.hpp"

#include <pcre2.h>

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "io/json.hpp"  // utf8_sequence_at, invalid_utf8_at

namespace lockstep::detail {

// GPT-2's pattern with Rust's \s (Note [Pre-tokens]).
const std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+|)"
    R"(\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";

// The JIT's stack for one match. A match backtracks over at most one run of spaces, which the
// JIT records in constant space, so 1 MiB is never reached in practice; reaching it is an error.
constexpr std::size_t kJitStackBytes = 1u << 20;

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0)
    return fmt::format("error {}", code);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

struct PretokenPattern::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

PretokenPattern::PretokenPattern() : code_(std::make_unique<Code>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // ANCHORED: each match starts where the last ended (the pieces tile the text). The subject is
  // checked for UTF-8 by split(), so PCRE2 need not.
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern.data()),
                              kGpt2Pattern.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED,
                              &error, &offset, nullptr);
  if (!code_->code)
    throw std::runtime_error(fmt::format("PCRE2 refused GPT-2's pattern at offset {}: {} (PCRE2 "
                                         "10.40 or later is needed for \\p{{White_Space}})",
                                         offset, pcre2_message(error)));
  if (const int rc = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE); rc != 0)
    throw std::runtime_error("PCRE2 cannot JIT-compile GPT-2's pattern: " + pcre2_message(rc));
}

// \s and \S as \p{White_Space} and \P{White_Space} (Note [Split patterns]); an escaped backslash
// is kept as it is.
std::string with_unicode_spaces(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') out += "\\p{White_Space}";
      else if (next == 'S') out += "\\P{White_Space}";
      else {
        out += '\\';
        out += next;
      }
    } else {
      out += pattern[i];
    }
  }
  return out;
}

PretokenPattern::PretokenPattern(std::string_view pattern, bool literal)
    : code_(std::make_unique<Code>()) {
  const std::string text = literal ? std::string(pattern) : with_unicode_spaces(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                              literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP, &error,
                              &offset, nullptr);
  if (!code_->code) throw PatternError{pcre2_message(error), offset};
  if (const int rc = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE); rc != 0)
    throw PatternError{"PCRE2 cannot JIT-compile it: " + pcre2_message(rc), 0};
}

PretokenPattern::~PretokenPattern() = default;

struct PieceSplitter::MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* context = nullptr;
  ~MatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

PieceSplitter::PieceSplitter(const PretokenPattern& pattern)
    : code_(pattern.code_.get()), state_(std::make_unique<MatchState>()) {
  state_->data = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  state_->stack = pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr);
  state_->context = pcre2_match_context_create(nullptr);
  if (!state_->data || !state_->stack || !state_->context) throw std::bad_alloc();
  pcre2_jit_stack_assign(state_->context, nullptr, state_->stack);
}

PieceSplitter::~PieceSplitter() = default;
PieceSplitter::PieceSplitter(PieceSplitter&&) noexcept = default;

void PieceSplitter::split_valid(std::string_view text, std::vector<std::string_view>& pieces) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE* span = pcre2_get_ovector_pointer(state_->data);
  for (std::size_t at = 0; at < text.size();) {
    const int rc = pcre2_jit_match(code_->code, subject, text.size(), at, 0, state_->data,
                                   state_->context);
    // Every character is a letter, a number, a space or none of these, so a piece always starts
    // here; a failure is PCRE2's (its JIT stack), not the text's.
    if (rc < 0)
      throw std::runtime_error(fmt::format("pre-tokenising at byte {}: PCRE2: {}", at,
                                           pcre2_message(rc)));
    pieces.push_back(text.substr(at, span[1] - at));
    at = span[1];
  }
}

void PieceSplitter::find(std::string_view text, std::vector<MatchSpan>& matches) {
  matches.clear();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE* span = pcre2_get_ovector_pointer(state_->data);
  for (std::size_t at = 0; at < text.size();) {
    const int rc = pcre2_jit_match(code_->code, subject, text.size(), at, 0, state_->data,
                                   state_->context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      throw std::runtime_error(fmt::format("pre-tokenising at byte {}: PCRE2: {}", at,
                                           pcre2_message(rc)));
    if (span[1] > span[0]) {
      matches.push_back({span[0], span[1]});
      at = span[1];
    } else {  // an empty match: search again from the next character
      at = span[0] + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
    }
  }
}

void PieceSplitter::split(std::string_view text, std::vector<std::string_view>& pieces) {
  pieces.clear();
  while (!text.empty()) {
    const std::size_t bad = std::min(invalid_utf8_at(text), text.size());
    split_valid(text.substr(0, bad), pieces);
    std::size_t good = bad;  // the end of the bad run: the next byte that starts a sequence
    while (good < text.size() && utf8_sequence_at(text, good) == 0) ++good;
    if (good > bad) pieces.push_back(text.substr(bad, good - bad));
    text.remove_prefix(good);
  }
}

}  // namespace lockstep::detail
