// Fuzzes the tokenizer: the input read as a tiktoken rank file, as a tokenizer.json (its
// pre-tokenizers, normaliser, added tokens and post-processor included), as a
// vocab.json (with the merges.txt of a fixed vocabulary) and as a merges.txt (with its
// vocab.json); the input's bytes encoded with the fixed vocabulary and with any vocabulary the
// input made must decode back to the input. Bad input is an InputError that names its file.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz_input.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"
#include "text/tokenizer_impl.hpp"
#include "text/vocabulary.hpp"

namespace {

// merges.txt for vocab_json(): "a b" and "Ġ ab".
constexpr std::string_view kMergesTxt = "#version: 0.2\na b\n\u0120 ab\n";

// vocab.json of the 256 bytes (GPT-2's stand-ins, ids in byte order), "ab" and " ab".
std::string vocab_json() {
  std::string out = "{";
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = lockstep::detail::byte_to_char(static_cast<unsigned char>(b));
    std::string utf8;
    if (cp < 0x80) utf8 = std::string(1, static_cast<char>(cp));
    else utf8 = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    if (utf8 == "\"" || utf8 == "\\") utf8 = "\\" + utf8;
    out += "\"" + utf8 + "\": " + std::to_string(b) + ", ";
  }
  return out + "\"ab\": 256, \"\u0120ab\": 257}";
}

// Whether `t` gives back every byte of a text: not when it normalises, removes split matches,
// adds a prefix space or lets an added token swallow white space.
bool lossless(const lockstep::Tokenizer& t) {
  const lockstep::detail::Pipeline& p = t.impl().pipeline;
  for (const lockstep::detail::PreTokenizerStep& step : p.steps)
    if (!step.pattern || step.behavior == lockstep::detail::SplitBehavior::removed) return false;
  for (const lockstep::detail::AddedToken& token : p.added)
    if (token.lstrip || token.rstrip) return false;
  return !p.nfc;
}

// The input's bytes round-trip through `t` (encoded at least, when it is not lossless); aborts
// (libFuzzer saves the input) if not.
void round_trip(const lockstep::Tokenizer& t, std::string_view bytes) {
  if (!lossless(t)) {
    t.encode(bytes);
    t.encode_with_special(bytes);
    return;
  }
  if (t.decode(t.encode(bytes)) != bytes || t.decode(t.encode_with_special(bytes)) != bytes) {
    std::fprintf(stderr, "fuzz: decode(encode(x)) != x\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  static const std::string fixed_vocab = vocab_json();
  static const lockstep::Tokenizer fixed(std::make_shared<const lockstep::detail::TokenizerImpl>(
      lockstep::detail::parse_hf_vocab(fixed_vocab, "vocab.json", kMergesTxt, "merges.txt"),
      "fixed"));
  round_trip(fixed, input);
  const auto attempt = [&](auto read, std::initializer_list<std::string_view> names) {
    try {
      round_trip(lockstep::Tokenizer(
                     std::make_shared<const lockstep::detail::TokenizerImpl>(read(), "fuzz")),
                 input);
    } catch (const lockstep::InputError& e) {
      lockstep::fuzz::require_named(e, names);
    }
  };
  using namespace lockstep::detail;
  attempt([&] { return parse_tiktoken(input, "input.tiktoken"); }, {"input.tiktoken"});
  attempt([&] { return parse_tokenizer_json(input, "tokenizer.json"); }, {"tokenizer.json"});
  attempt([&] { return parse_hf_vocab(input, "vocab.json", kMergesTxt, "merges.txt"); },
          {"vocab.json", "merges.txt"});
  attempt([&] { return parse_hf_vocab(fixed_vocab, "vocab.json", input, "merges.txt"); },
          {"merges.txt", "vocab.json"});
  return 0;
}
