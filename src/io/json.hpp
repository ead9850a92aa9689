// A small JSON reader and writer (RFC 8259), enough for safetensors headers.
//
// The reader takes untrusted bytes: it checks UTF-8, limits nesting depth (so a header of a
// million '[' cannot overflow the stack), rejects duplicate object keys, and reports every
// problem as a JsonError with the byte offset in the parsed text. Numbers are kept as their
// literal text; callers convert what they expect.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::detail {

class JsonError : public std::runtime_error {
 public:
  JsonError(std::size_t offset, const std::string& what)
      : std::runtime_error(what), offset_(offset) {}
  std::size_t offset() const noexcept { return offset_; }

 private:
  std::size_t offset_;
};

struct JsonValue {
  enum class Kind { null, boolean, number, string, array, object };

  JsonValue() = default;  // declared first: clang needs it before the members that nest JsonValue

  Kind kind = Kind::null;
  bool boolean = false;
  std::string text;                                         // string: decoded; number: literal
  std::vector<JsonValue> items;                             // array
  std::vector<std::pair<std::string, JsonValue>> members;   // object, in document order
  std::size_t offset = 0;                                   // where the value starts in the text

  std::string_view kind_name() const noexcept;  // "a string", "an object", ... for messages
};

// Parses one JSON value; only whitespace may follow it.
JsonValue parse_json(std::string_view text);

// The offset of the first byte that is not part of valid UTF-8, or npos.
std::size_t invalid_utf8_at(std::string_view text) noexcept;

// The length (1 to 4) of the well-formed UTF-8 sequence at text[i], or 0 when none starts there
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
std::size_t utf8_sequence_at(std::string_view text, std::size_t i) noexcept;

// `s` as a JSON string literal, quotes included. Throws std::invalid_argument if `s` is not
// valid UTF-8.
std::string json_quote(std::string_view s);

}  // namespace lockstep::detail
