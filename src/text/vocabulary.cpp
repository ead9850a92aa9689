// The vocabulary readers (vocabulary.hpp): tiktoken rank files, vocab.json + merges.txt, and
// tokenizer.json.
#include "text/vocabulary.hpp"
#include "text/pipeline.hpp"

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <limits>
#include <unordered_set>
#include <utility>

#include "common/tsan_fork_join.hpp"
#include "io/json.hpp"
#include "io/open_input.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

namespace fs = std::filesystem;

// Ids and ranks are stored as uint32 and written as int32 counts: 2^31 is far beyond any
// vocabulary.
constexpr std::uint64_t kMaxId = std::numeric_limits<std::int32_t>::max();

// Line numbers of offsets that mostly come in increasing order (a document's values), each
// counted from the last: linear in the text, where line_of per value would be quadratic.
class LineCounter {
 public:
  explicit LineCounter(std::string_view text) : text_(text) {}
  std::size_t operator()(std::size_t offset) {
    offset = std::min(offset, text_.size());
    if (offset < offset_) {
      offset_ = 0;
      line_ = 1;
    }
    line_ += static_cast<std::size_t>(
        std::count(text_.begin() + static_cast<std::ptrdiff_t>(offset_),
                   text_.begin() + static_cast<std::ptrdiff_t>(offset), '\n'));
    offset_ = offset;
    return line_;
  }

 private:
  std::string_view text_;
  std::size_t offset_ = 0, line_ = 1;
};

[[noreturn]] void fail_at(const std::string& name, std::size_t line, std::string_view what) {
  throw InputError(fmt::format("{}:{}: {}", name, line, what));
}

[[noreturn]] void fail_file(const std::string& name, std::string_view what) {
  throw InputError(fmt::format("{}: {}", name, what));
}

// A token's bytes for a message: printable ASCII as itself, anything else as \xNN.
std::string printable(std::string_view bytes) {
  std::string out;
  for (const char c : bytes.substr(0, 40)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F && c != '\\') out += c;
    else out += fmt::format("\\x{:02x}", u);
  }
  if (bytes.size() > 40) out += "...";
  return out;
}

// Decimal digits only (no sign, no leading zeros but "0"), below kMaxId.
std::optional<std::uint32_t> parse_id(std::string_view digits) {
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc{} || end != digits.data() + digits.size() || v > kMaxId) return std::nullopt;
  return static_cast<std::uint32_t>(v);
}

// --- GPT-2's byte-level alphabet ---

bool prints_as_itself(unsigned char b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

// The inverse of byte_to_char, indexed by code point (< 0x144); -1 for no byte.
const std::array<int, 0x144>& char_to_byte() {
  static const std::array<int, 0x144> table = [] {
    std::array<int, 0x144> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_char(static_cast<unsigned char>(b))] = b;
    return t;
  }();
  return table;
}

// One UTF-8 code point from s[i..], advancing i; the text is valid UTF-8 (the JSON reader and
// the merges reader check it).
char32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const int length = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  char32_t cp = length == 1 ? c : c & (0x3F >> (length - 1));
  for (int k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += static_cast<std::size_t>(length);
  return cp;
}

// A vocab.json or merges.txt token (GPT-2's printable stand-ins) as its bytes, or nullopt when
// it has a character outside the alphabet.
std::optional<std::string> token_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (std::size_t i = 0; i < token.size();) {
    const char32_t cp = next_code_point(token, i);
    if (cp >= char_to_byte().size() || char_to_byte()[cp] < 0) return std::nullopt;
    out += static_cast<char>(char_to_byte()[cp]);
  }
  return out;
}

// --- the parts every reader shares ---

// A token read from a file, with the line that gave it.
struct Entry {
  std::string bytes;
  std::uint32_t id;
  std::size_t line;
};

// Fills the tokens by id, checking for duplicate ids, duplicate tokens and gaps.
void fill_tokens(Vocabulary& v, std::vector<Entry> entries, const std::string& name,
                 std::string_view id_word) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.id < b.id; });
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i > 0 && entries[i].id == entries[i - 1].id)
      fail_at(name, std::max(entries[i].line, entries[i - 1].line),
              fmt::format("duplicate {} {}: '{}' (line {}) and '{}' (line {})", id_word,
                          entries[i].id, printable(entries[i - 1].bytes), entries[i - 1].line,
                          printable(entries[i].bytes), entries[i].line));
    if (entries[i].id != i)
      fail_file(name, fmt::format("{} {} is missing (the {}s run to {}): expected every {} from 0 "
                                  "to the largest, a truncated or edited file?",
                                  id_word, i, id_word, entries.back().id, id_word));
  }
  v.tokens.reserve(entries.size());
  v.by_bytes.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto [it, fresh] = v.by_bytes.emplace(entries[i].bytes, entries[i].id);
    if (!fresh) {
      const auto earlier = it->second;  // a structured binding a lambda can capture
      const std::size_t first = std::find_if(entries.begin(), entries.end(), [&](const Entry& e) {
                                  return e.id == earlier;
                                })->line;
      fail_at(name, std::max(first, entries[i].line),
              fmt::format("duplicate token '{}': {}s {} (line {}) and {} (line {})",
                          printable(entries[i].bytes), id_word, earlier, first, entries[i].id,
                          entries[i].line));
    }
    v.tokens.push_back(std::move(entries[i].bytes));
  }
}

void find_byte_tokens(Vocabulary& v, const std::string& name) {
  for (int b = 0; b < 256; ++b) {
    const auto it = v.by_bytes.find(std::string(1, static_cast<char>(b)));
    if (it == v.by_bytes.end())
      fail_file(name, fmt::format("byte 0x{:02x} has no token: a byte-level BPE vocabulary has "
                                  "one for each of the 256 bytes", b));
    v.byte_token[static_cast<std::size_t>(b)] = it->second;
  }
}

// --- tiktoken ---

// Standard base64 with padding (RFC 4648, section 4), strictly: nullopt for anything else.
std::optional<std::string> base64_decode(std::string_view s) {
  static const std::array<int, 256> value = [] {
    std::array<int, 256> t{};
    t.fill(-1);
    const std::string_view alphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (std::size_t i = 0; i < alphabet.size(); ++i)
      t[static_cast<unsigned char>(alphabet[i])] = static_cast<int>(i);
    return t;
  }();
  if (s.empty() || s.size() % 4 != 0) return std::nullopt;
  const std::size_t padding = s.ends_with("==") ? 2 : s.ends_with('=') ? 1 : 0;
  std::string out;
  std::uint32_t bits = 0;
  for (std::size_t i = 0; i < s.size() - padding; ++i) {
    const int v = value[static_cast<unsigned char>(s[i])];
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<std::uint32_t>(v);
    if (i % 4 == 3) {
      out += static_cast<char>(bits >> 16);
      out += static_cast<char>(bits >> 8);
      out += static_cast<char>(bits);
      bits = 0;
    }
  }
  // The last group: 2 or 3 characters carry 1 or 2 bytes; their unused low bits must be zero,
  // so that each byte string has exactly one spelling.
  if (padding == 2) {
    if (bits & 0xF) return std::nullopt;
    out += static_cast<char>(bits >> 4);
  } else if (padding == 1) {
    if (bits & 0x3) return std::nullopt;
    out += static_cast<char>(bits >> 10);
    out += static_cast<char>(bits >> 2);
  }
  return out;
}

// Runs body(first, last) over [0, count) in blocks of `block` in parallel; returns the blocks'
// results in block order, so that what follows is independent of the threads.
template <class Result, class Body>
std::vector<Result> in_blocks(std::size_t count, std::size_t block, Body body) {
  std::vector<Result> results((count + block - 1) / block);
  detail::TsanForkJoin fork_join;  // Note [TSan and oneTBB]
  static char site;                // a loop that may follow another
  const auto task = [&](std::size_t b) {
    detail::tsan_acquire(&site);
    fork_join.task_begins();
    results[b] = body(b * block, std::min(count, (b + 1) * block));
    fork_join.task_ends();
  };
  detail::tsan_release(&site);
  tbb::parallel_for(std::size_t{0}, results.size(), task);
  fork_join.joined();
  return results;
}

// FNV-1a, a byte at a time: a token's prefixes' hashes come in one pass over it.
constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr std::uint64_t kFnvPrime = 0x100000001b3ull;

std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = kFnvOffset) {
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * kFnvPrime;
  return h;
}

// Token bytes -> id for merges_from_ranks: open addressing on FNV-1a hashes that the caller
// computes (incrementally, for prefixes), each hit checked against the token's bytes. About 4x
// faster there than Vocabulary::by_bytes, which hashes each substring anew and walks nodes.
class TokenIndex {
 public:
  explicit TokenIndex(const std::vector<std::string>& tokens) : tokens_(tokens) {
    std::size_t size = 1024;
    while (size < 2 * tokens.size()) size *= 2;
    slots_.assign(size, Slot{0, kEmpty});
    for (std::size_t id = 0; id < tokens.size(); ++id) {
      const std::uint64_t h = fnv1a(tokens[id]);
      std::size_t i = h & (size - 1);
      while (slots_[i].id != kEmpty) i = (i + 1) & (size - 1);
      slots_[i] = {h, static_cast<TokenId>(id)};
    }
  }
  // The id of `bytes`, whose hash is h, or kEmpty.
  TokenId find(std::string_view bytes, std::uint64_t h) const {
    for (std::size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (s.id == kEmpty) return kEmpty;
      if (s.hash == h && tokens_[s.id] == bytes) return s.id;
    }
  }
  static constexpr TokenId kEmpty = ~TokenId{0};

 private:
  struct Slot {
    std::uint64_t hash;
    TokenId id;
  };
  const std::vector<std::string>& tokens_;
  std::vector<Slot> slots_;  // a power of two, at most half full
};

// Every split of every token into two tokens may merge, at the token's rank. The lookups (two
// per split: about 600,000 for GPT-2's 50,257 ranks, most of loading its rank file) run on a
// TokenIndex, in parallel over blocks of ids; the merges are inserted in id order.
void merges_from_ranks(Vocabulary& v) {
  struct Found {
    TokenId left, right, id;
  };
  const TokenIndex index(v.tokens);
  const auto found = in_blocks<std::vector<Found>>(
      v.tokens.size(), 4096, [&v, &index](std::size_t first, std::size_t last) {
        std::vector<Found> out;
        for (std::size_t id = first; id < last; ++id) {
          const std::string_view t = v.tokens[id];
          std::uint64_t prefix = kFnvOffset;
          for (std::size_t k = 1; k < t.size(); ++k) {
            prefix = fnv1a(t.substr(k - 1, 1), prefix);
            const TokenId left = index.find(t.substr(0, k), prefix);
            if (left == TokenIndex::kEmpty) continue;
            const TokenId right = index.find(t.substr(k), fnv1a(t.substr(k)));
            if (right == TokenIndex::kEmpty) continue;
            out.push_back({left, right, static_cast<TokenId>(id)});
          }
        }
        return out;
      });
  std::size_t count = 0;
  for (const std::vector<Found>& block : found) count += block.size();
  v.merges.reserve(count);
  for (const std::vector<Found>& block : found)
    for (const Found& f : block) v.merges.insert(f.left, f.right, Merge{f.id, f.id});
}

// --- vocab.json + merges.txt, and tokenizer.json ---

[[noreturn]] void fail_json(const std::string& name, std::string_view text, const JsonError& e) {
  fail_at(name, line_of(text, e.offset()), e.what());
}

JsonValue parse_json_file(std::string_view text, const std::string& name) {
  try {
    return parse_json(text);
  } catch (const JsonError& e) {
    fail_json(name, text, e);
  }
}

// The vocabulary object {"token": id, ...}; `where` names it in messages ("model.vocab").
std::vector<Entry> vocab_entries(const JsonValue& vocab, std::string_view text,
                                 const std::string& name, std::string_view where) {
  if (vocab.kind != JsonValue::Kind::object)
    fail_at(name, line_of(text, vocab.offset),
            fmt::format("{}: expected an object of tokens and ids, got {}", where,
                        vocab.kind_name()));
  std::vector<Entry> entries;
  entries.reserve(vocab.members.size());
  LineCounter line_at(text);
  for (const auto& [token, id_value] : vocab.members) {
    const std::size_t line = line_at(id_value.offset);
    const std::optional<std::uint32_t> id =
        id_value.kind == JsonValue::Kind::number ? parse_id(id_value.text) : std::nullopt;
    if (!id) {
      const std::string got = id_value.kind == JsonValue::Kind::number
                                  ? id_value.text
                                  : std::string(id_value.kind_name());
      fail_at(name, line, fmt::format("{}: token \"{}\": expected an id in [0, {}], got {}", where,
                                      token, kMaxId, got));
    }
    std::optional<std::string> bytes = token_bytes(token);
    if (!bytes)
      fail_at(name, line, fmt::format("{}: token \"{}\" has a character outside GPT-2's byte-level "
                                      "alphabet: not a byte-level BPE vocabulary", where, token));
    entries.push_back({std::move(*bytes), *id, line});
  }
  return entries;
}

struct MergeLine {
  std::string_view left, right;  // in GPT-2's printable stand-ins
  std::size_t line;
};

// `json_path`: the merges' place in a tokenizer.json ("model.merges"), named with each one's
// index in messages; empty for merges.txt, whose messages have the line alone.
void add_merges(Vocabulary& v, const std::vector<MergeLine>& lines, const std::string& name,
                const std::string& vocab_name, std::string_view json_path = {}) {
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const MergeLine& m = lines[i];
    const auto fail_at = [&](const std::string& file, std::size_t line, std::string_view what) {
      if (json_path.empty()) detail::fail_at(file, line, what);
      detail::fail_at(file, line, fmt::format("{}[{}]: {}", json_path, i, what));
    };
    TokenId ids[2] = {};
    std::string joined;
    for (int side = 0; side < 2; ++side) {
      const std::string_view token = side == 0 ? m.left : m.right;
      const std::optional<std::string> bytes = token_bytes(token);
      const auto it = bytes ? v.by_bytes.find(*bytes) : v.by_bytes.end();
      if (it == v.by_bytes.end())
        fail_at(name, m.line, fmt::format("merge \"{} {}\": \"{}\" is not a token of {}", m.left,
                                          m.right, token, vocab_name));
      ids[side] = it->second;
      joined += *bytes;
    }
    const auto merged = v.by_bytes.find(joined);
    if (merged == v.by_bytes.end())
      fail_at(name, m.line, fmt::format("merge \"{} {}\": the merged token \"{}{}\" is not in {}",
                                        m.left, m.right, m.left, m.right, vocab_name));
    const auto priority = static_cast<std::uint32_t>(i);
    const Merge& kept = v.merges.insert(ids[0], ids[1], Merge{priority, merged->second});
    if (kept.priority != priority)
      fail_at(name, m.line, fmt::format("merge \"{} {}\" is listed twice (first as merge {})",
                                        m.left, m.right, kept.priority + 1));
  }
}

// "a b": two tokens, one space.
MergeLine split_merge(std::string_view line, std::size_t number, const std::string& name) {
  const std::size_t space = line.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
      line.find(' ', space + 1) != std::string_view::npos)
    fail_at(name, number, fmt::format("expected a merge \"LEFT RIGHT\" (two tokens, one space), "
                                      "got \"{}\"", printable(line)));
  return {line.substr(0, space), line.substr(space + 1), number};
}

std::vector<MergeLine> merges_txt_lines(std::string_view text, const std::string& name) {
  if (const std::size_t bad = invalid_utf8_at(text); bad != std::string_view::npos)
    fail_at(name, line_of(text, bad), "invalid UTF-8");
  std::vector<MergeLine> out;
  std::size_t number = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++number;
    if (number == 1 && line.starts_with("#version")) continue;
    if (line.empty())
      fail_at(name, number, "empty line: expected a merge \"LEFT RIGHT\"");
    out.push_back(split_merge(line, number, name));
  }
  return out;
}

Vocabulary build_hf(std::vector<Entry> entries, const std::vector<MergeLine>& merges,
                    const std::string& vocab_name, const std::string& merges_name,
                    std::string_view merges_path = {}) {
  Vocabulary v;
  fill_tokens(v, std::move(entries), vocab_name, "id");
  find_byte_tokens(v, vocab_name);
  add_merges(v, merges, merges_name, vocab_name, merges_path);
  if (const auto it = v.by_bytes.find(std::string(kEndOfText)); it != v.by_bytes.end())
    v.end_of_text = it->second;
  return v;
}

// tokenizer.json's model: a BPE without the options that would change the ids (the pre-tokenizers,
// normaliser and post-processor are the pipeline's, pipeline.cpp).
void check_bpe_model(const JsonValue& model, std::string_view text, const std::string& name) {
  const auto refuse = [&](const JsonValue& at, std::string_view what) {
    fail_at(name, line_of(text, at.offset), what);
  };
  const JsonValue* type = json_member(model, "type");
  if (type && (type->kind != JsonValue::Kind::string || type->text != "BPE"))
    refuse(*type, fmt::format("model.type: expected \"BPE\", got {}: lockstep reads byte-level "
                              "BPE only", type->kind == JsonValue::Kind::string
                                              ? "\"" + type->text + "\""
                                              : std::string(type->kind_name())));
  for (const std::string_view key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"})
    if (const JsonValue* v = json_member(model, key);
        v && v->kind != JsonValue::Kind::null &&
        !(v->kind == JsonValue::Kind::string && v->text.empty()))
      refuse(*v, fmt::format("model.{}: expected null: lockstep's BPE has no {}", key, key));
  if (const JsonValue* v = json_member(model, "byte_fallback"); v && v->boolean)
    refuse(*v, "model.byte_fallback: expected false: byte fallback (<0xNN> tokens for bytes the "
               "vocabulary lacks) is not supported; a byte-level vocabulary has every byte");
}

std::vector<MergeLine> tokenizer_json_merges(const JsonValue& merges, std::string_view text,
                                             const std::string& name) {
  if (merges.kind != JsonValue::Kind::array)
    fail_at(name, line_of(text, merges.offset),
            fmt::format("model.merges: expected an array, got {}", merges.kind_name()));
  std::vector<MergeLine> out;
  out.reserve(merges.items.size());
  LineCounter line_at(text);
  for (const JsonValue& m : merges.items) {
    const std::size_t line = line_at(m.offset);
    if (m.kind == JsonValue::Kind::string) {
      try {
        out.push_back(split_merge(m.text, line, name));
      } catch (const InputError&) {
        fail_at(name, line, fmt::format("model.merges[{}]: expected \"LEFT RIGHT\" (two tokens, one "
                                        "space), got \"{}\"", out.size(), printable(m.text)));
      }
    } else if (m.kind == JsonValue::Kind::array && m.items.size() == 2 &&
               m.items[0].kind == JsonValue::Kind::string &&
               m.items[1].kind == JsonValue::Kind::string && !m.items[0].text.empty() &&
               !m.items[1].text.empty()) {
      out.push_back({m.items[0].text, m.items[1].text, line});
    } else {
      fail_at(name, line, fmt::format("model.merges[{}]: expected \"LEFT RIGHT\" or [\"LEFT\", "
                                      "\"RIGHT\"], got {}", out.size(), m.kind_name()));
    }
  }
  return out;
}

// added_tokens: [{"id": 50256, "content": "<|endoftext|>", ...}]. Those model.vocab lacks join
// it (their content is plain text, not byte-level stand-ins).
void add_added_tokens(std::vector<Entry>& entries, const JsonValue* added, std::string_view text,
                      const std::string& name, std::vector<TokenId>& outside_model) {
  if (!added || added->kind == JsonValue::Kind::null) return;
  if (added->kind != JsonValue::Kind::array)
    fail_at(name, line_of(text, added->offset), "added_tokens: expected an array");
  LineCounter line_at(text);
  for (const JsonValue& t : added->items) {
    const std::size_t line = line_at(t.offset);
    const JsonValue* id = t.kind == JsonValue::Kind::object ? json_member(t, "id") : nullptr;
    const JsonValue* content = id ? json_member(t, "content") : nullptr;
    const std::optional<std::uint32_t> number =
        id && id->kind == JsonValue::Kind::number ? parse_id(id->text) : std::nullopt;
    if (!number || !content || content->kind != JsonValue::Kind::string || content->text.empty())
      fail_at(name, line, fmt::format("added_tokens[{}]: expected {{\"id\": ID, \"content\": "
                                      "\"TEXT\", ...}}", &t - added->items.data()));
    const auto same = std::find_if(entries.begin(), entries.end(),
                                   [&](const Entry& e) { return e.id == *number; });
    if (same == entries.end()) {
      entries.push_back({content->text, *number, line});
      outside_model.push_back(*number);
    } else if (same->bytes != content->text) {
      fail_at(name, line, fmt::format("added_tokens[{}]: id {} is \"{}\" here but '{}' in "
                                      "model.vocab", &t - added->items.data(), *number,
                                      content->text, printable(same->bytes)));
    }
  }
}

bool is_dir(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

bool path_exists(const fs::path& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

}  // namespace

std::size_t line_of(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  return 1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + offset, '\n'));
}

const JsonValue* json_member(const JsonValue& object, std::string_view key) {
  for (const auto& [k, value] : object.members)
    if (k == key) return &value;
  return nullptr;
}

const Merge& MergeTable::insert(TokenId left, TokenId right, Merge merge) {
  if (2 * (size_ + 1) > slots_.size()) grow();
  const std::uint64_t key = pack(left, right);
  std::size_t i = slot_of(key);
  while (slots_[i].key != kFree && slots_[i].key != key) i = (i + 1) & (slots_.size() - 1);
  if (slots_[i].key == kFree) {
    slots_[i] = {key, merge};
    ++size_;
  }
  return slots_[i].merge;
}

std::vector<Merge> MergeTable::merges() const {
  std::vector<Merge> out;
  out.reserve(size_);
  for (const Slot& s : slots_)
    if (s.key != kFree) out.push_back(s.merge);
  return out;
}

void MergeTable::reserve(std::size_t count) {
  std::size_t slots = 1024;
  while (slots < 2 * count) slots *= 2;
  if (slots > slots_.size()) grow(slots);
}

void MergeTable::grow(std::size_t slots) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(slots ? slots : old.empty() ? 1024 : 2 * old.size(), Slot{kFree, {}});
  shift_ = 64 - std::countr_zero(slots_.size());
  for (const Slot& s : old) {
    if (s.key == kFree) continue;
    std::size_t i = slot_of(s.key);
    while (slots_[i].key != kFree) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = s;
  }
}

char32_t byte_to_char(unsigned char byte) {
  if (prints_as_itself(byte)) return byte;
  int n = 0;  // how many non-printing bytes come before this one
  for (int b = 0; b < byte; ++b) n += prints_as_itself(static_cast<unsigned char>(b)) ? 0 : 1;
  return static_cast<char32_t>(256 + n);
}

Vocabulary parse_tiktoken(std::string_view text, const std::string& name) {
  // Lines are parsed in parallel, in pieces of about 64 KiB cut after a '\n'; each piece's line
  // numbers count from its start until the pieces are joined, and the first bad line in the
  // file is the one reported, whatever the threads.
  std::vector<std::size_t> starts{0};
  for (std::size_t at = std::size_t{1} << 16; at < text.size();) {
    const std::size_t newline = text.find('\n', at);
    if (newline == std::string_view::npos || newline + 1 == text.size()) break;
    starts.push_back(newline + 1);
    at = newline + 1 + (std::size_t{1} << 16);
  }
  struct Piece {
    std::vector<Entry> entries;
    std::size_t lines = 0;
    std::string error;  // "what" of its first bad line, the line being `lines`
  };
  std::vector<Piece> pieces = in_blocks<Piece>(starts.size(), 1, [&](std::size_t i, std::size_t) {
    Piece piece;
    const std::size_t end = i + 1 < starts.size() ? starts[i + 1] : text.size();
    for (std::size_t pos = starts[i]; pos < end;) {
      const std::size_t newline = text.find('\n', pos);
      ++piece.lines;
      if (newline == std::string_view::npos) {
        piece.error = "the last line has no line end: a truncated file?";
        return piece;
      }
      const std::string_view line = text.substr(pos, newline - pos);
      pos = newline + 1;
      const std::size_t space = line.find(' ');
      if (space == std::string_view::npos) {
        piece.error = fmt::format("expected \"BASE64 RANK\", got \"{}\"", printable(line));
        return piece;
      }
      std::optional<std::string> bytes = base64_decode(line.substr(0, space));
      if (!bytes) {
        piece.error = fmt::format("\"{}\" is not a base64 token (RFC 4648, with padding)",
                                  printable(line.substr(0, space)));
        return piece;
      }
      const std::optional<std::uint32_t> rank = parse_id(line.substr(space + 1));
      if (!rank) {
        piece.error = fmt::format("rank \"{}\": expected an integer in [0, {}]",
                                  printable(line.substr(space + 1)), kMaxId);
        return piece;
      }
      piece.entries.push_back({std::move(*bytes), *rank, piece.lines});
    }
    return piece;
  });
  std::vector<Entry> entries;
  std::size_t lines_before = 0;
  for (Piece& piece : pieces) {
    if (!piece.error.empty()) fail_at(name, lines_before + piece.lines, piece.error);
    for (Entry& e : piece.entries) {
      e.line += lines_before;
      entries.push_back(std::move(e));
    }
    lines_before += piece.lines;
  }
  if (entries.empty()) fail_file(name, "no tokens: an empty tiktoken rank file");
  Vocabulary v;
  fill_tokens(v, std::move(entries), name, "rank");
  find_byte_tokens(v, name);
  merges_from_ranks(v);
  v.whole_piece_lookup = true;
  // GPT-2's <|endoftext|> follows the ranks (tiktoken's gpt2: 50256).
  if (v.by_bytes.count(std::string(kEndOfText)))
    fail_file(name, fmt::format("\"{}\" is a ranked token: expected it after the ranks",
                                kEndOfText));
  v.end_of_text = static_cast<TokenId>(v.tokens.size());
  v.outside_model.push_back(*v.end_of_text);
  v.tokens.emplace_back(kEndOfText);
  return v;
}

Vocabulary parse_hf_vocab(std::string_view vocab_json, const std::string& vocab_name,
                          std::string_view merges_txt, const std::string& merges_name) {
  const JsonValue root = parse_json_file(vocab_json, vocab_name);
  std::vector<Entry> entries = vocab_entries(root, vocab_json, vocab_name, "the vocabulary");
  return build_hf(std::move(entries), merges_txt_lines(merges_txt, merges_name), vocab_name,
                  merges_name);
}

TokenizerSpec parse_tokenizer_json(std::string_view text, const std::string& name,
                                   const TokenizerConfig& config) {
  const JsonValue root = parse_json_file(text, name);
  if (root.kind != JsonValue::Kind::object)
    fail_at(name, 1, fmt::format("expected a tokenizer object, got {}", root.kind_name()));
  const JsonValue* model = json_member(root, "model");
  if (!model || model->kind != JsonValue::Kind::object)
    fail_file(name, "no \"model\" object: not a Hugging Face tokenizer.json");
  check_bpe_model(*model, text, name);
  const JsonValue* vocab = json_member(*model, "vocab");
  const JsonValue* merges = json_member(*model, "merges");
  if (!vocab || !merges) fail_file(name, "model: expected \"vocab\" and \"merges\"");
  std::vector<Entry> entries = vocab_entries(*vocab, text, name, "model.vocab");
  std::vector<TokenId> outside_model;
  add_added_tokens(entries, json_member(root, "added_tokens"), text, name, outside_model);
  Vocabulary v = build_hf(std::move(entries), tokenizer_json_merges(*merges, text, name), name,
                          name, "model.merges");
  v.outside_model = std::move(outside_model);
  // ignore_merges: a pre-token that is a token is that token, as in a rank file.
  if (const JsonValue* ignore = json_member(*model, "ignore_merges"); ignore && ignore->boolean)
    v.whole_piece_lookup = true;
  Pipeline pipeline = read_pipeline(root, v, text, name, config);
  return {std::move(v), std::move(pipeline)};
}

namespace {

// A tokenizer.json, with the tokenizer_config.json beside it when there is one.
TokenizerSpec read_tokenizer_json(const fs::path& file) {
  const auto read = [](const fs::path& f) { return read_input(f, InputKind::data); };
  TokenizerConfig config;
  if (const fs::path c = file.parent_path() / "tokenizer_config.json"; path_exists(c))
    config = parse_tokenizer_config(read(c), c.string());
  return parse_tokenizer_json(read(file), file.string(), config);
}

TokenizerSpec gpt2_spec(Vocabulary v, const std::string& name) {
  Pipeline p = family_pipeline(TokenizerFamily::gpt2, v, name);
  return {std::move(v), std::move(p)};
}

}  // namespace

TokenizerSpec read_tokenizer(const fs::path& path, TokenizerFamily family) {
  const auto read = [](const fs::path& file) { return read_input(file, InputKind::data); };
  const bool json = is_dir(path) ? path_exists(path / "tokenizer.json")
                                 : path.extension() == ".json";
  if (family != TokenizerFamily::automatic && (is_dir(path) || json))
    throw InputError(fmt::format("{}: --tokenizer-family is for a tiktoken rank file; a Hugging "
                                 "Face tokenizer describes its own family", path.string()));
  if (is_dir(path)) {
    if (json) return read_tokenizer_json(path / "tokenizer.json");
    const fs::path vocab = path / "vocab.json", merges = path / "merges.txt";
    if (path_exists(vocab) && path_exists(merges))
      return gpt2_spec(parse_hf_vocab(read(vocab), vocab.string(), read(merges), merges.string()),
                       vocab.string());
    throw InputError(fmt::format("{}: a directory without tokenizer.json, or vocab.json and "
                                 "merges.txt: expected a Hugging Face tokenizer",
                                 path.string()));
  }
  const std::string filename = path.filename().string();
  if (filename == "vocab.json" || filename == "merges.txt")
    throw InputError(fmt::format("{}: {} needs its {} beside it: give the directory",
                                 path.string(), filename,
                                 filename == "vocab.json" ? "merges.txt" : "vocab.json"));
  if (json) return read_tokenizer_json(path);
  if (path.extension() == ".tiktoken" || family != TokenizerFamily::automatic) {
    Vocabulary v = parse_tiktoken(read(path), path.string());
    Pipeline p = family_pipeline(family, v, path.string());
    return {std::move(v), std::move(p)};
  }
  if (!path_exists(path))
    throw InputError(fmt::format("{}: no such file or directory", path.string()));
  throw InputError(fmt::format("{}: expected a Hugging Face tokenizer directory (tokenizer.json, "
                               "or vocab.json and merges.txt), a tokenizer.json or a tiktoken "
                               "rank file (*.tiktoken, or any name with --tokenizer-family)",
                               path.string()));
}

}  // namespace lockstep::detail
