// A tokenizer.json's normaliser, pre-tokenizers, added tokens and post-processor read into a
// Pipeline (Note [Tokenizer pipeline]), and the pipelines of tiktoken's families.
#include "text/pipeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "io/json.hpp"
#include "lockstep/error.hpp"
#include "text/vocabulary.hpp"

namespace lockstep::detail {
namespace {

using Kind = JsonValue::Kind;

// Llama 3's and Qwen2's patterns, as their tokenizer.json files and tiktoken write them; they
// differ in how many digits make a piece.
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-2's, as `tokenizers` writes it (a Split of SmolLM2-like files may name it).
constexpr std::string_view kGpt2FilePattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A tokenizer.json being read: every message names the file, the line and the JSON path.
class JsonReader {
 public:
  JsonReader(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  [[noreturn]] void fail(const JsonValue& at, std::string_view path, std::string_view what) const {
    throw InputError(fmt::format("{}:{}: {}: {}", name_, line_of(text_, at.offset), path, what));
  }
  const JsonValue& expect(const JsonValue& v, Kind kind, std::string_view path,
                          std::string_view expected) const {
    if (v.kind != kind) fail(v, path, fmt::format("expected {}, got {}", expected, v.kind_name()));
    return v;
  }
  // A member that must be there, of `kind`.
  const JsonValue& need(const JsonValue& object, std::string_view key, Kind kind,
                        std::string_view path, std::string_view expected) const {
    const JsonValue* v = json_member(object, key);
    const std::string at = fmt::format("{}.{}", path, key);
    if (!v) fail(object, at, fmt::format("missing: expected {}", expected));
    return expect(*v, kind, at, expected);
  }
  bool flag(const JsonValue& object, std::string_view key, std::string_view path,
            bool fallback) const {
    const JsonValue* v = json_member(object, key);
    if (!v || v->kind == Kind::null) return fallback;
    return expect(*v, Kind::boolean, fmt::format("{}.{}", path, key), "true or false").boolean;
  }
  std::string_view text() const { return text_; }

 private:
  std::string_view text_;
  const std::string& name_;
};

std::shared_ptr<const PretokenPattern> compile(const JsonReader& r, const JsonValue& at,
                                               std::string_view path, std::string_view pattern,
                                               bool literal) {
  try {
    return std::make_shared<const PretokenPattern>(pattern, literal);
  } catch (const PatternError& e) {
    r.fail(at, path, fmt::format("PCRE2 refused the pattern at offset {}: {}", e.offset,
                                 e.message));
  }
}

SplitBehavior behavior_of(const JsonReader& r, const JsonValue& v, std::string_view path) {
  static constexpr std::array<std::pair<std::string_view, SplitBehavior>, 5> kNames = {{
      {"Removed", SplitBehavior::removed},
      {"Isolated", SplitBehavior::isolated},
      {"MergedWithPrevious", SplitBehavior::merged_with_previous},
      {"MergedWithNext", SplitBehavior::merged_with_next},
      {"Contiguous", SplitBehavior::contiguous},
  }};
  constexpr std::string_view kExpected =
      "\"Removed\", \"Isolated\", \"MergedWithPrevious\", \"MergedWithNext\" or \"Contiguous\"";
  r.expect(v, Kind::string, path, kExpected);
  for (const auto& [name, b] : kNames)
    if (v.text == name) return b;
  r.fail(v, path, fmt::format("expected {}, got \"{}\"", kExpected, v.text));
}

struct PreTokenizers {
  std::vector<PreTokenizerStep> steps;
  bool byte_level = false;       // a ByteLevel step: the vocabulary is byte-level
  // Every Split's pattern is one whose pieces always break in "a\nb" (Note [Tokenizing files]).
  bool known_patterns = true;
  std::vector<std::string> description;
};

void read_pre_tokenizer(const JsonReader& r, const JsonValue& pre, const std::string& path,
                        PreTokenizers& out) {
  r.expect(pre, Kind::object, path, "a pre-tokenizer object");
  const std::string type = r.need(pre, "type", Kind::string, path, "a type name").text;
  if (type == "Sequence") {
    const JsonValue& list = r.need(pre, "pretokenizers", Kind::array, path, "an array");
    for (std::size_t i = 0; i < list.items.size(); ++i)
      read_pre_tokenizer(r, list.items[i], fmt::format("{}.pretokenizers[{}]", path, i), out);
  } else if (type == "Split") {
    const JsonValue& pattern = r.need(pre, "pattern", Kind::object, path,
                                      "{\"Regex\": \"...\"} or {\"String\": \"...\"}");
    const JsonValue* regex = json_member(pattern, "Regex");
    const JsonValue* literal = json_member(pattern, "String");
    const std::string at = path + ".pattern." + (regex ? "Regex" : "String");
    const JsonValue* given = regex ? regex : literal;
    if (!given || pattern.members.size() != 1)
      r.fail(pattern, path + ".pattern", "expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    r.expect(*given, Kind::string, at, "a string");
    if (given->text.empty()) r.fail(*given, at, "expected a pattern, got \"\"");
    PreTokenizerStep step{compile(r, *given, at, given->text, !regex),
                          behavior_of(r, r.need(pre, "behavior", Kind::string, path, "a string"),
                                      path + ".behavior"),
                          r.flag(pre, "invert", path, false)};
    out.known_patterns = out.known_patterns && regex &&
                         (given->text == kLlama3Pattern || given->text == kQwen2Pattern ||
                          given->text == kGpt2FilePattern);
    out.description.push_back(fmt::format("Split({},{},{},{})", regex ? "regex" : "string",
                                          given->text, static_cast<int>(step.behavior),
                                          step.invert));
    out.steps.push_back(std::move(step));
  } else if (type == "Digits") {
    const bool individual = r.flag(pre, "individual_digits", path, false);
    out.steps.push_back({compile(r, pre, path, individual ? "\\p{N}" : "\\p{N}+", false),
                         SplitBehavior::isolated, false});
    out.description.push_back(fmt::format("Digits({})", individual));
  } else if (type == "ByteLevel") {
    const bool prefix = r.flag(pre, "add_prefix_space", path, true);
    const bool regex = r.flag(pre, "use_regex", path, true);
    if (prefix) out.steps.push_back({nullptr, SplitBehavior::isolated, false});
    if (regex) out.steps.push_back({compile(r, pre, path, kGpt2Pattern, false),
                                    SplitBehavior::isolated, false});
    out.byte_level = true;
    out.description.push_back(fmt::format("ByteLevel({},{})", prefix, regex));
  } else {
    r.fail(pre, path + ".type",
           fmt::format("\"{}\" is not a pre-tokenizer lockstep knows: expected Split, Digits, "
                       "ByteLevel or a Sequence of them", type));
  }
}

// NFC, or a Sequence of NFCs; anything else is refused.
bool read_normalizer(const JsonReader& r, const JsonValue& n, const std::string& path) {
  if (n.kind == Kind::null) return false;
  r.expect(n, Kind::object, path, "a normalizer object or null");
  const std::string type = r.need(n, "type", Kind::string, path, "a type name").text;
  if (type == "NFC") return true;
  if (type == "Sequence") {
    const JsonValue& list = r.need(n, "normalizers", Kind::array, path, "an array");
    bool any = false;
    for (std::size_t i = 0; i < list.items.size(); ++i)
      any = read_normalizer(r, list.items[i], fmt::format("{}.normalizers[{}]", path, i)) || any;
    return any;
  }
  r.fail(n, path + ".type",
         fmt::format("\"{}\" is not a normalizer lockstep knows: expected NFC, a Sequence of "
                     "them, or null", type));
}

std::vector<AddedToken> read_added_tokens(const JsonReader& r, const JsonValue* added) {
  std::vector<AddedToken> out;
  if (!added || added->kind == Kind::null) return out;
  r.expect(*added, Kind::array, "added_tokens", "an array");
  for (std::size_t i = 0; i < added->items.size(); ++i) {
    const JsonValue& t = added->items[i];
    const std::string path = fmt::format("added_tokens[{}]", i);
    r.expect(t, Kind::object, path, "{\"id\": ID, \"content\": \"TEXT\", ...}");
    if (r.flag(t, "single_word", path, false))
      r.fail(t, path + ".single_word", "true is not supported: expected false");
    AddedToken token;
    token.content = r.need(t, "content", Kind::string, path, "a string").text;
    token.id = static_cast<TokenId>(std::stoul(r.need(t, "id", Kind::number, path, "an id").text));
    token.special = r.flag(t, "special", path, false);
    token.lstrip = r.flag(t, "lstrip", path, false);
    token.rstrip = r.flag(t, "rstrip", path, false);
    token.normalized = r.flag(t, "normalized", path, !token.special);
    out.push_back(std::move(token));
  }
  return out;
}

// TemplateProcessing's "single": special tokens around {"Sequence": {"id": "A"}}.
void read_template(const JsonReader& r, const JsonValue& post, const std::string& path,
                   Pipeline& p) {
  const JsonValue& single = r.need(post, "single", Kind::array, path, "an array");
  const JsonValue* specials = json_member(post, "special_tokens");
  bool seen_a = false;
  for (std::size_t i = 0; i < single.items.size(); ++i) {
    const std::string at = fmt::format("{}.single[{}]", path, i);
    const JsonValue& item = r.expect(single.items[i], Kind::object, at,
                                     "{\"SpecialToken\": ...} or {\"Sequence\": ...}");
    if (const JsonValue* seq = json_member(item, "Sequence")) {
      const JsonValue& id = r.need(*seq, "id", Kind::string, at + ".Sequence", "\"A\"");
      if (id.text != "A" || seen_a) r.fail(id, at + ".Sequence.id", "expected one \"A\"");
      seen_a = true;
    } else if (const JsonValue* special = json_member(item, "SpecialToken")) {
      const std::string name =
          r.need(*special, "id", Kind::string, at + ".SpecialToken", "a token name").text;
      const JsonValue* entry = specials ? json_member(*specials, name) : nullptr;
      if (!entry)
        r.fail(*special, at + ".SpecialToken.id",
               fmt::format("\"{}\" is not in {}.special_tokens", name, path));
      const std::string entry_path = fmt::format("{}.special_tokens.{}", path, name);
      const JsonValue& ids = r.need(*entry, "ids", Kind::array, entry_path, "an array of ids");
      for (const JsonValue& id : ids.items)
        (seen_a ? p.suffix : p.prefix)
            .push_back(static_cast<TokenId>(std::stoul(
                r.expect(id, Kind::number, entry_path + ".ids", "an id").text)));
    } else {
      r.fail(item, at, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
  }
  if (!seen_a) r.fail(single, path + ".single", "expected the sequence {\"Sequence\": {\"id\": \"A\"}}");
}

void read_post_processor(const JsonReader& r, const JsonValue& post, const std::string& path,
                         Pipeline& p) {
  if (post.kind == Kind::null) return;
  r.expect(post, Kind::object, path, "a post-processor object or null");
  const std::string type = r.need(post, "type", Kind::string, path, "a type name").text;
  if (type == "ByteLevel") return;  // offsets only
  if (type == "TemplateProcessing") return read_template(r, post, path, p);
  if (type == "Sequence") {
    const JsonValue& list = r.need(post, "processors", Kind::array, path, "an array");
    for (std::size_t i = 0; i < list.items.size(); ++i)
      read_post_processor(r, list.items[i], fmt::format("{}.processors[{}]", path, i), p);
    return;
  }
  r.fail(post, path + ".type",
         fmt::format("\"{}\" is not a post-processor lockstep knows: expected ByteLevel, "
                     "TemplateProcessing, a Sequence of them, or null", type));
}

// Which cut rule a pipeline allows (Note [Tokenizing files]): "a\nb" breaks the pieces of GPT-2's,
// Llama 3's and Qwen2's patterns and of Digits, and NFC composes nothing across it, unless an
// added token could span it or strip its white space, or a prefix space would be added to
// each part.
CutRule cut_rule(const Pipeline& p, const PreTokenizers& pre) {
  if (!pre.known_patterns) return CutRule::none;
  for (const PreTokenizerStep& step : p.steps)
    if (!step.pattern) return CutRule::none;
  for (const AddedToken& t : p.added)
    if (t.content.find('\n') != std::string::npos || t.lstrip || t.rstrip) return CutRule::none;
  return CutRule::newline_between_letters;
}

}  // namespace

TokenizerConfig parse_tokenizer_config(std::string_view text, const std::string& name) {
  JsonValue root;
  try {
    root = parse_json(text);
  } catch (const JsonError& e) {
    throw InputError(fmt::format("{}:{}: {}", name, line_of(text, e.offset()), e.what()));
  }
  const JsonReader r(text, name);
  r.expect(root, Kind::object, "(the file)", "an object");
  TokenizerConfig c;
  c.name = name;
  // bos_token / eos_token: "TEXT", {"content": "TEXT", ...} (an AddedToken) or null.
  const auto token = [&](std::string_view key) -> std::optional<std::string> {
    const JsonValue* v = json_member(root, key);
    if (!v || v->kind == Kind::null) return std::nullopt;
    if (v->kind == Kind::string) return v->text;
    if (v->kind == Kind::object)
      return r.need(*v, "content", Kind::string, key, "a string").text;
    r.fail(*v, key, fmt::format("expected a string, {{\"content\": \"TEXT\"}} or null, got {}",
                                v->kind_name()));
  };
  c.bos_token = token("bos_token");
  c.eos_token = token("eos_token");
  if (const JsonValue* v = json_member(root, "add_bos_token"); v && v->kind != Kind::null)
    c.add_bos_token = r.expect(*v, Kind::boolean, "add_bos_token", "true or false").boolean;
  return c;
}

Pipeline read_pipeline(const JsonValue& root, const Vocabulary& v, std::string_view text,
                       const std::string& name, const TokenizerConfig& config) {
  const JsonReader r(text, name);
  Pipeline p;
  const JsonValue* normalizer = json_member(root, "normalizer");
  p.nfc = normalizer && read_normalizer(r, *normalizer, "normalizer");
  const JsonValue* pre = json_member(root, "pre_tokenizer");
  if (!pre || pre->kind == Kind::null)
    r.fail(pre ? *pre : root, "pre_tokenizer",
           "expected a ByteLevel pre-tokenizer: lockstep reads byte-level BPE only");
  PreTokenizers steps;
  read_pre_tokenizer(r, *pre, "pre_tokenizer", steps);
  if (!steps.byte_level)
    r.fail(*pre, "pre_tokenizer",
           "no ByteLevel step: lockstep reads byte-level BPE only (its vocabulary is in GPT-2's "
           "byte-level alphabet)");
  p.added = read_added_tokens(r, json_member(root, "added_tokens"));
  if (const JsonValue* post = json_member(root, "post_processor"))
    read_post_processor(r, *post, "post_processor", p);
  // GPT-2's own: ByteLevel(use_regex) alone, no normaliser.
  const bool gpt2 = !p.nfc && steps.steps.size() == 1 && steps.description.size() == 1 &&
                    steps.description[0] == "ByteLevel(false,true)";
  p.gpt2 = gpt2;
  if (!gpt2) {
    p.steps = std::move(steps.steps);
    p.description = fmt::format("nfc={};{}", p.nfc, fmt::join(steps.description, ";"));
  }
  p.cut = gpt2 ? CutRule::gpt2 : cut_rule(p, steps);
  // BOS and EOS: tokenizer_config.json's names (null: none), else GPT-2's <|endoftext|> as both.
  const auto named = [&](const std::optional<std::string>& token) -> std::optional<TokenId> {
    if (!token) return std::nullopt;
    const auto it = v.by_bytes.find(*token);
    if (it == v.by_bytes.end())
      throw InputError(fmt::format("{}: \"{}\" is not a token of {}", config.name, *token, name));
    return it->second;
  };
  const bool configured = !config.name.empty();  // else GPT-2's convention
  p.eos = configured ? named(config.eos_token) : v.end_of_text;
  p.bos = configured ? named(config.bos_token) : v.end_of_text;
  if (config.add_bos_token) {
    p.prefix.clear();
    if (*config.add_bos_token) {
      if (!p.bos)
        throw InputError(fmt::format("{}: add_bos_token is true but no bos_token is named",
                                     config.name));
      p.prefix.push_back(*p.bos);
    }
  }
  return p;
}

Pipeline family_pipeline(TokenizerFamily family, Vocabulary& v, const std::string& name) {
  Pipeline p;
  std::vector<std::string> specials;
  std::string_view pattern;
  switch (family) {
    case TokenizerFamily::automatic:
    case TokenizerFamily::gpt2:
      p.eos = p.bos = v.end_of_text;
      if (v.end_of_text) p.added.push_back({std::string(kEndOfText), *v.end_of_text});
      return p;
    case TokenizerFamily::llama3:
      // The names of llama-models 0.3.0's llama3/tokenizer.py (Llama 3.2's, <|image|> at 128011,
      // where 3.1 has <|reserved_special_token_3|>): 256 special tokens after the ranks.
      specials = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                  "<|python_tag|>", "<|image|>"};
      for (int i = 2; specials.size() < 256; ++i)
        specials.push_back(fmt::format("<|reserved_special_token_{}|>", i));
      pattern = kLlama3Pattern;
      break;
    case TokenizerFamily::qwen2:
      p.nfc = true;
      // qwen.tiktoken's (Qwen's tokenization_qwen.py): then <|extra_0|> to <|extra_204|>.
      specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
      for (int i = 0; i < 205; ++i) specials.push_back(fmt::format("<|extra_{}|>", i));
      pattern = kQwen2Pattern;
      break;
  }
  // The rank file's reader gave it GPT-2's <|endoftext|> after the ranks: the family's replace it.
  if (v.end_of_text) {
    v.by_bytes.erase(v.tokens.back());
    v.tokens.pop_back();
    v.end_of_text.reset();
    v.outside_model.clear();
  }
  for (const std::string& s : specials) {
    if (v.by_bytes.count(s))
      throw InputError(fmt::format("{}: \"{}\" is a ranked token: expected it after the ranks",
                                   name, s));
    const auto id = static_cast<TokenId>(v.tokens.size());
    v.tokens.push_back(s);
    v.by_bytes.emplace(s, id);
    v.outside_model.push_back(id);
    p.added.push_back({s, id, true, false, false, false});
  }
  p.gpt2 = false;
  p.steps.push_back({std::make_shared<const PretokenPattern>(pattern, false),
                     SplitBehavior::isolated, false});
  p.cut = CutRule::newline_between_letters;
  const TokenId first = p.added.front().id;
  if (family == TokenizerFamily::llama3) {
    p.bos = first;
    p.eos = first + 1;
    p.prefix = {first};
  } else {
    p.eos = first;
  }
  p.description = fmt::format("family={}", family == TokenizerFamily::llama3 ? "llama3" : "qwen2");
  return p;
}

}  // namespace lockstep::detail
