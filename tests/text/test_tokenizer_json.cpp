// tokenizer.json as the description of a tokenizer (Note [Tokenizer pipeline] in
// src/text/pipeline.hpp), on the hand-made vocabulary: each pre-tokenizer, behaviour, normaliser,
// added-token option and post-processor by its ids, and each malformed file refused with its
// line and JSON path. (tests/interop/test_tokenizer_families.cpp compares whole families with
// Hugging Face's `tokenizers`.)
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../cli/cli_runner.hpp"
#include "../data/temp_files.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"
#include "text/hf_tokenizer_files.hpp"
#include "text/tokenizer_impl.hpp"
#include "vocab_files.hpp"

namespace fs = std::filesystem;
using lockstep::TokenId;
using lockstep::Tokenizer;
using lockstep::test::TempDir;
using Ids = std::vector<TokenId>;

namespace {

// hand_vocab(): 'a'..: their bytes; 256 th, 257 the, 258 " the", 259 ab, 260 bc, 261 cd,
// 262 abcd, 263 ee, 264 "\n\n", 265 <|endoftext|>.
constexpr std::string_view kByteLevel =
    R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})";
constexpr std::string_view kBytesOnly =
    R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})";

// A tokenizer.json of hand_vocab(), one part per line: 1 normalizer, 2 pre_tokenizer,
// 3 added_tokens, 4 post_processor, 5 the model's options and vocab, 6 merges.
struct JsonFile {
  std::string normalizer = "null";
  std::string pre{kByteLevel};
  std::string added = R"([{"id": 265, "content": "<|endoftext|>", "special": true}])";
  std::string post = "null";
  std::string model_options;  // e.g. "\"ignore_merges\": true, "
  std::string vocab = lockstep::test::vocab_json(lockstep::test::hand_vocab());
  std::vector<std::string> merges = [] {
    std::vector<std::string> out;
    for (const auto& [l, r] : lockstep::test::hand_vocab().merges)
      out.push_back(lockstep::test::json_string(lockstep::test::printable_token(l) + " " +
                                                lockstep::test::printable_token(r)));
    return out;
  }();

  std::string text() const {
    std::string m;
    for (const std::string& s : merges) m += (m.empty() ? "" : ", ") + s;
    return "{\"version\": \"1.0\", \"normalizer\": " + normalizer + ",\n\"pre_tokenizer\": " + pre +
           ",\n\"added_tokens\": " + added + ",\n\"post_processor\": " + post +
           ",\n\"model\": {\"type\": \"BPE\", \"dropout\": null, " + model_options +
           "\"vocab\": " + vocab + ",\n\"merges\": [" + m + "]}}";
  }
};

std::string split(std::string_view pattern, std::string_view behavior, bool invert = false,
                  std::string_view kind = "String") {
  return fmt::format(R"({{"type": "Sequence", "pretokenizers": [{{"type": "Split", "pattern": )"
                     R"({{"{}": "{}"}}, "behavior": "{}", "invert": {}}}, {}]}})",
                     kind, pattern, behavior, invert, kBytesOnly);
}

struct Loaded {
  TempDir dir;
  Tokenizer t;
  explicit Loaded(const JsonFile& f, std::string_view config = {})
      : t((config.empty() ? fs::path() : dir.write("tokenizer_config.json", std::string(config)),
           dir.write("tokenizer.json", f.text()), Tokenizer::load(dir.path()))) {}
};

// The message loading `f` throws, with the file's path cut to "tokenizer.json".
std::string load_error(const JsonFile& f) {
  const TempDir dir;
  const fs::path path = dir.write("tokenizer.json", f.text());
  try {
    Tokenizer::load(path);
  } catch (const lockstep::InputError& e) {
    std::string message = e.what();
    for (std::size_t at; (at = message.find(path.string())) != std::string::npos;)
      message.replace(at, path.string().size(), "tokenizer.json");
    return message;
  }
  return "";
}

}  // namespace

TEST_CASE("tokenizer.json: GPT-2's own is the GPT-2 tokenizer, hash included") {
  const Loaded json{JsonFile{}};
  CHECK(json.t.impl().pipeline.gpt2);
  CHECK(json.t.encode("the abcd\n\n") == Ids{257, ' ', 262, 264});
  CHECK(json.t.encode("<|endoftext|>").size() > 1);
  CHECK(json.t.encode_with_special("a<|endoftext|>") == Ids{'a', 265});
  CHECK(json.t.end_of_text() == 265u);
  CHECK(json.t.document_start() == Ids{265});
  const TempDir dir;
  const lockstep::test::SmallVocab v = lockstep::test::hand_vocab();
  CHECK(Tokenizer::load(dir.write("r.tiktoken", lockstep::test::rank_file(v))).content_hash() ==
        json.t.content_hash());
}

TEST_CASE("tokenizer.json: Split's behaviours and invert, as `tokenizers` joins the pieces") {
  const auto ids = [](const std::string& pre, std::string_view text) {
    JsonFile f;
    f.pre = pre;
    return Loaded(f).t.encode(text);
  };
  // "abcb" split on "b": a | b | c | b.
  CHECK(ids(split("b", "Isolated"), "abcb") == Ids{'a', 'b', 'c', 'b'});
  CHECK(ids(split("b", "Removed"), "abcb") == Ids{'a', 'c'});
  CHECK(ids(split("b", "MergedWithPrevious"), "abcb") == Ids{259, 'c', 'b'});
  CHECK(ids(split("b", "MergedWithNext"), "abcb") == Ids{'a', 260, 'b'});
  CHECK(ids(split("e", "Contiguous"), "aeec") == Ids{'a', 263, 'c'});
  CHECK(ids(split("e", "Isolated"), "aeec") == Ids{'a', 'e', 'e', 'c'});
  // invert: the gaps are the delimiters.
  CHECK(ids(split("b", "Removed", true), "abcb") == Ids{'b', 'b'});
  CHECK(ids(split("b", "Isolated", true), "abcb") == Ids{'a', 'b', 'c', 'b'});
  // A regex, with \s as White_Space: a no-break space splits, a letter does not.
  CHECK(ids(split("\\\\s", "Removed", false, "Regex"), "ab\xc2\xa0" "cd e") == Ids{259, 261, 'e'});
  // No split at all: ByteLevel without its regex merges across the space.
  CHECK(ids(std::string(kBytesOnly), "the the") == Ids{257, 258});
}

TEST_CASE("tokenizer.json: Digits, ByteLevel's prefix space, and ignore_merges") {
  // Digits in front of GPT-2's pattern: "12" is one number piece without it.
  const std::string digits =
      R"({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, )" +
      std::string(kByteLevel) + "]}";
  JsonFile f;
  f.vocab = lockstep::test::vocab_json(lockstep::test::SmallVocab{{{"1", "2"}}});
  f.merges = {"\"1 2\""};
  f.added = R"([{"id": 257, "content": "<|endoftext|>", "special": true}])";
  CHECK(Loaded(f).t.encode("a12") == Ids{'a', 256});
  f.pre = digits;
  CHECK(Loaded(f).t.encode("a12") == Ids{'a', '1', '2'});

  JsonFile prefix;
  prefix.pre = R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true})";
  const Loaded p(prefix);
  CHECK(p.t.encode("the") == Ids{258});
  // Each stretch between added tokens gets its space.
  CHECK(p.t.encode_with_special("the<|endoftext|>the") == Ids{258, 265, 258});
  CHECK(p.t.impl().pipeline.cut == lockstep::detail::CutRule::none);

  // abcd without its merge "ab cd": reachable only as a whole piece.
  JsonFile whole;
  whole.merges.erase(whole.merges.begin() + 6);
  CHECK(Loaded(whole).t.encode("abcd") == Ids{259, 261});
  whole.model_options = "\"ignore_merges\": true, ";
  CHECK(Loaded(whole).t.encode("abcd") == Ids{262});
  CHECK(Loaded(whole).t.encode("<|endoftext|>") != Ids{265});  // an added token is not the model's
}

TEST_CASE("tokenizer.json: NFC, and added tokens' special, lstrip, rstrip and normalized") {
  JsonFile f;
  f.normalizer = R"({"type": "Sequence", "normalizers": [{"type": "NFC"}]})";
  f.pre = std::string(kBytesOnly);
  f.added = R"([{"id": 265, "content": "<|endoftext|>", "special": true, "lstrip": true, )"
            R"("rstrip": true}, {"id": 266, "content": "zz", "special": false}, )"
            R"({"id": 267, "content": "\u00e9", "special": false, "normalized": true}])";
  const Loaded t(f);
  // e + COMBINING ACUTE is é after NFC: the normalised added token.
  CHECK(t.t.encode("ae\xcc\x81") == Ids{'a', 267});
  CHECK(t.t.encode("\xc3\xa9") == Ids{267});
  // A token that is not special is split out even as ordinary text; a special one only when
  // allowed, swallowing the spaces around it.
  CHECK(t.t.encode("azzb") == Ids{'a', 266, 'b'});
  CHECK(t.t.encode_with_special("ab  <|endoftext|> \tcd") == Ids{259, 265, 261});
  CHECK(t.t.encode("ab <|endoftext|>").front() == 259);
  CHECK(t.t.encode("ab <|endoftext|>").size() > 3);
  // Invalid UTF-8 is bytes, never normalised.
  CHECK(t.t.encode("\xff" "ab") == Ids{0xFF, 259});
  JsonFile plain = f;
  plain.normalizer = "null";
  CHECK(Loaded(plain).t.encode("ae\xcc\x81") == Ids{'a', 'e', 0xCC, 0x81});
}

TEST_CASE("tokenizer.json: the post-processor's BOS and tokenizer_config.json") {
  JsonFile f;
  f.post = R"({"type": "Sequence", "processors": [{"type": "ByteLevel", "trim_offsets": false}, )"
           R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", )"
           R"("type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], )"
           R"("special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [265], )"
           R"("tokens": ["<|endoftext|>"]}}}]})";
  const Loaded bos(f);
  CHECK(bos.t.impl().pipeline.prefix == Ids{265});
  CHECK(bos.t.document_start() == Ids{265});
  CHECK(bos.t.encode("ab") == Ids{259});  // encode adds nothing
  const Loaded off(f, R"({"add_bos_token": false, "eos_token": {"content": "ab"}, "bos_token": null})");
  CHECK(off.t.impl().pipeline.prefix.empty());
  CHECK(off.t.end_of_text() == 259u);
  CHECK_FALSE(off.t.begin_of_text());
  CHECK(off.t.document_start() == Ids{259});
  CHECK(bos.t.content_hash() != off.t.content_hash());
  const Loaded on(JsonFile{}, R"({"add_bos_token": true, "bos_token": "cd", "eos_token": "ee"})");
  CHECK(on.t.document_start() == Ids{261});
  CHECK(on.t.end_of_text() == 263u);
}

TEST_CASE("tokenizer.json: each malformed file is refused with its line and JSON path") {
  const auto with = [](auto change) {
    JsonFile f;
    change(f);
    return load_error(f);
  };
  CHECK(with([](JsonFile& f) { f.pre = R"({"type": "Whitespace"})"; }) ==
        "tokenizer.json:2: pre_tokenizer.type: \"Whitespace\" is not a pre-tokenizer lockstep "
        "knows: expected Split, Digits, ByteLevel or a Sequence of them");
  CHECK(with([](JsonFile& f) {
          f.pre = R"({"type": "Sequence", "pretokenizers": [)" + std::string(kByteLevel) +
                  R"(, {"type": "Punctuation"}]})";
        }).starts_with("tokenizer.json:2: pre_tokenizer.pretokenizers[1].type: \"Punctuation\""));
  CHECK(with([](JsonFile& f) { f.pre = split("(", "Isolated", false, "Regex"); }) ==
        "tokenizer.json:2: pre_tokenizer.pretokenizers[0].pattern.Regex: PCRE2 refused the "
        "pattern at offset 1: missing closing parenthesis");
  CHECK(with([](JsonFile& f) { f.pre = split("b", "Sideways"); })
            .starts_with("tokenizer.json:2: pre_tokenizer.pretokenizers[0].behavior: expected "
                         "\"Removed\", "));
  CHECK(with([](JsonFile& f) {
          f.pre = R"({"type": "Split", "pattern": {"String": "b"}, "behavior": "Isolated"})";
        }).starts_with("tokenizer.json:2: pre_tokenizer: no ByteLevel step"));
  CHECK(with([](JsonFile& f) { f.normalizer = R"({"type": "Lowercase"})"; }) ==
        "tokenizer.json:1: normalizer.type: \"Lowercase\" is not a normalizer lockstep knows: "
        "expected NFC, a Sequence of them, or null");
  CHECK(with([](JsonFile& f) { f.merges[3] = "\"qq zz\""; }) ==
        "tokenizer.json:6: model.merges[3]: merge \"qq zz\": \"qq\" is not a token of "
        "tokenizer.json");
  CHECK(with([](JsonFile& f) { f.merges[3] = "[\"a\"]"; }) ==
        "tokenizer.json:6: model.merges[3]: expected \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"], "
        "got an array");
  CHECK(with([](JsonFile& f) { f.model_options = "\"byte_fallback\": true, "; })
            .starts_with("tokenizer.json:5: model.byte_fallback: expected false: byte fallback"));
  CHECK(with([](JsonFile& f) { f.post = R"({"type": "RobertaProcessing"})"; })
            .starts_with("tokenizer.json:4: post_processor.type: \"RobertaProcessing\" is not a "
                         "post-processor lockstep knows"));
  CHECK(with([](JsonFile& f) {
          f.added = R"([{"id": 265, "content": "<|endoftext|>", "single_word": true}])";
        }) == "tokenizer.json:3: added_tokens[0].single_word: true is not supported: expected "
              "false");
  CHECK(with([](JsonFile& f) { f.vocab = R"({"a": 0, "b": 0})"; })
            .starts_with("tokenizer.json:5: duplicate id 0"));
  JsonFile truncated;
  const std::string cut = truncated.text().substr(0, 400);
  const TempDir dir;
  try {
    Tokenizer::load(dir.write("tokenizer.json", cut));
    FAIL("a truncated tokenizer.json loaded");
  } catch (const lockstep::InputError& e) {
    CHECK(std::string(e.what()).starts_with((dir.path() / "tokenizer.json").string() + ":5: "));
  }
}

TEST_CASE("tokenizer.json: export --format hf copies the files verbatim, or says what it cannot write") {
  const std::string config = R"({"add_bos_token": false, "eos_token": "ee", "bos_token": null})";
  JsonFile prefix;
  prefix.pre = R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true})";
  const Loaded with_config(prefix, config);
  const TempDir out;
  lockstep::detail::write_hf_tokenizer(with_config.t, out.path(), 64);
  CHECK(lockstep::test::read_text(out.path() / "tokenizer.json") == prefix.text());
  CHECK(lockstep::test::read_text(out.path() / "tokenizer_config.json") == config);
  // Without a tokenizer_config.json: one naming its tokens, for `tokenizers` to read.
  const Loaded bare(prefix);
  const TempDir out2;
  lockstep::detail::write_hf_tokenizer(bare.t, out2.path(), 64);
  const std::string written = lockstep::test::read_text(out2.path() / "tokenizer_config.json");
  CHECK(written.find("\"tokenizer_class\": \"PreTrainedTokenizerFast\"") != std::string::npos);
  CHECK(written.find("\"eos_token\": \"<|endoftext|>\"") != std::string::npos);
  // A Llama 3 rank file has no vocab.json + merges.txt form.
  const TempDir dir;
  const Tokenizer llama = Tokenizer::load(
      dir.write("tokenizer.model", lockstep::test::rank_file(lockstep::test::hand_vocab())),
      lockstep::TokenizerFamily::llama3);
  CHECK_THROWS_WITH_AS(lockstep::detail::write_hf_tokenizer(llama, out2.path(), 64),
                       doctest::Contains("give --tokenizer the model's own tokenizer.json"),
                       lockstep::InputError);
}
