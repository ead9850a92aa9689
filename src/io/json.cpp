#include "io/json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <unordered_set>

namespace lockstep::detail {
namespace {

// Deep enough for any real header (safetensors needs 3), shallow enough for any stack.
constexpr int kMaxDepth = 64;

// Well-formed UTF-8 by its first byte (RFC 3629, section 4): the sequence length and the range
// of the second byte; later bytes are any continuation byte.
struct Utf8Lead {
  unsigned char lo, hi;
  std::size_t length;
  unsigned char second_lo, second_hi;
};
constexpr Utf8Lead kUtf8Leads[] = {
    {0x00, 0x7F, 1, 0x00, 0x00}, {0xC2, 0xDF, 2, 0x80, 0xBF},
    {0xE0, 0xE0, 3, 0xA0, 0xBF},  // no overlong forms
    {0xE1, 0xEC, 3, 0x80, 0xBF},
    {0xED, 0xED, 3, 0x80, 0x9F},  // no UTF-16 surrogates
    {0xEE, 0xEF, 3, 0x80, 0xBF},
    {0xF0, 0xF0, 4, 0x90, 0xBF},  // no overlong forms
    {0xF1, 0xF3, 4, 0x80, 0xBF},
    {0xF4, 0xF4, 4, 0x80, 0x8F},  // nothing above U+10FFFF
};

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// A byte for a message: printable ASCII as itself, anything else as hex.
std::string describe_byte(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7F) return fmt::format("'{}'", c);
  return fmt::format("byte 0x{:02x}", u);
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  JsonValue document() {
    JsonValue v = value(0);
    skip_space();
    if (pos_ != s_.size())
      fail(pos_, fmt::format("expected the end of the JSON text, got {}", describe_byte(s_[pos_])));
    return v;
  }

 private:
  [[noreturn]] static void fail(std::size_t at, const std::string& what) {
    throw JsonError(at, what);
  }

  [[noreturn]] void unexpected(std::string_view expected) const {
    if (pos_ >= s_.size())
      fail(pos_, fmt::format("expected {}, got the end of the text", expected));
    fail(pos_, fmt::format("expected {}, got {}", expected, describe_byte(s_[pos_])));
  }

  void skip_space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  bool consume(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  JsonValue value(int depth) {
    skip_space();
    if (pos_ >= s_.size()) unexpected("a value");
    JsonValue v;
    v.offset = pos_;
    const char c = s_[pos_];
    if (c == '{' || c == '[') {
      if (depth >= kMaxDepth) fail(pos_, fmt::format("nesting deeper than {} levels", kMaxDepth));
      if (c == '{') object(v, depth + 1);
      else array(v, depth + 1);
    } else if (c == '"') {
      v.kind = JsonValue::Kind::string;
      v.text = string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = JsonValue::Kind::number;
      v.text = number();
    } else if (literal("true")) {
      v.kind = JsonValue::Kind::boolean;
      v.boolean = true;
    } else if (literal("false")) {
      v.kind = JsonValue::Kind::boolean;
    } else if (!literal("null")) {
      unexpected("a value");
    }
    return v;
  }

  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  void object(JsonValue& v, int depth) {
    v.kind = JsonValue::Kind::object;
    ++pos_;  // '{'
    skip_space();
    if (consume('}')) return;
    // A set, not a scan of the members: a tokenizer's vocab.json has 50,257 keys.
    std::unordered_set<std::string> keys;
    while (true) {
      skip_space();
      const std::size_t key_at = pos_;
      if (pos_ >= s_.size() || s_[pos_] != '"') unexpected("a string key");
      std::string key = string();
      if (!keys.insert(key).second) fail(key_at, fmt::format("duplicate key \"{}\"", key));
      skip_space();
      if (!consume(':')) unexpected("':'");
      v.members.emplace_back(std::move(key), value(depth));
      skip_space();
      if (consume('}')) return;
      if (!consume(',')) unexpected("',' or '}'");
    }
  }

  void array(JsonValue& v, int depth) {
    v.kind = JsonValue::Kind::array;
    ++pos_;  // '['
    skip_space();
    if (consume(']')) return;
    while (true) {
      v.items.push_back(value(depth));
      skip_space();
      if (consume(']')) return;
      if (!consume(',')) unexpected("',' or ']'");
    }
  }

  // Four hex digits after "\u".
  std::uint32_t hex4() {
    if (s_.size() - pos_ < 4) fail(pos_, "expected 4 hex digits after \\u");
    std::uint32_t cp = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char c = s_[pos_];
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0) unexpected("a hex digit");
      cp = cp * 16 + static_cast<std::uint32_t>(digit);
    }
    return cp;
  }

  std::string string() {
    const std::size_t start = pos_++;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail(start, "unterminated string");
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20)
        unexpected("a string character (control characters must be escaped)");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      const std::size_t escape_at = pos_++;
      if (pos_ >= s_.size()) fail(start, "unterminated string");
      switch (s_[pos_++]) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': append_escaped_code_point(out, escape_at); break;
        default: fail(escape_at, "invalid escape sequence");
      }
    }
  }

  // After "\u": one code point, or a surrogate pair written as two escapes.
  void append_escaped_code_point(std::string& out, std::size_t escape_at) {
    std::uint32_t cp = hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail(escape_at, "unpaired low surrogate");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (!literal("\\u")) fail(escape_at, "high surrogate without a low surrogate");
      const std::uint32_t low = hex4();
      if (low < 0xDC00 || low > 0xDFFF) fail(escape_at, "high surrogate without a low surrogate");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    append_utf8(out, cp);
  }

  std::string number() {
    const std::size_t start = pos_;
    const auto digits = [&] {
      const std::size_t from = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    consume('-');
    // A leading 0 stands alone: JSON allows no leading zeros.
    if (!consume('0') && digits() == 0) unexpected("a digit");
    if (consume('.') && digits() == 0) unexpected("a digit after '.'");
    if (consume('e') || consume('E')) {
      if (!consume('+')) consume('-');
      if (digits() == 0) unexpected("a digit in the exponent");
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

}  // namespace

std::string_view JsonValue::kind_name() const noexcept {
  switch (kind) {
    case Kind::null: return "null";
    case Kind::boolean: return "a boolean";
    case Kind::number: return "a number";
    case Kind::string: return "a string";
    case Kind::array: return "an array";
    case Kind::object: return "an object";
  }
  return "a value";
}

JsonValue parse_json(std::string_view text) {
  if (const std::size_t bad = invalid_utf8_at(text); bad != std::string_view::npos)
    throw JsonError(bad, "invalid UTF-8");
  return Parser(text).document();
}

std::size_t utf8_sequence_at(std::string_view text, std::size_t i) noexcept {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  const auto* lead = std::find_if(std::begin(kUtf8Leads), std::end(kUtf8Leads),
                                  [&](const Utf8Lead& l) { return c >= l.lo && c <= l.hi; });
  if (lead == std::end(kUtf8Leads) || text.size() - i < lead->length) return 0;
  if (lead->length > 1 && (byte(i + 1) < lead->second_lo || byte(i + 1) > lead->second_hi))
    return 0;
  for (std::size_t k = 2; k < lead->length; ++k)
    if (!is_continuation(byte(i + k))) return 0;
  return lead->length;
}

std::size_t invalid_utf8_at(std::string_view text) noexcept {
  for (std::size_t i = 0; i < text.size();) {
    // Eight ASCII bytes at a time: most text is ASCII, and the tokenizer checks all of it.
    if (text.size() - i >= 8) {
      std::uint64_t eight = 0;
      std::memcpy(&eight, text.data() + i, sizeof eight);
      if ((eight & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const std::size_t length = utf8_sequence_at(text, i);
    if (length == 0) return i;
    i += length;
  }
  return std::string_view::npos;
}

std::string json_quote(std::string_view s) {
  if (const std::size_t bad = invalid_utf8_at(s); bad != std::string_view::npos)
    throw std::invalid_argument(
        fmt::format("json_quote: invalid UTF-8 at byte {} of \"{}\"", bad, s.substr(0, bad)));
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out + '"';
}

}  // namespace lockstep::detail
