// The YAML config loader: parse, apply "--set" overrides, check every value, then the
// cross-field rules.
//
// The schema is written once, in visit_schema(), as sections of typed keys with their rules.
// Three visitors walk it:
//   KeyCollector - learns the valid names, to reject unknown keys with a suggestion;
//   Parser       - reads a YAML tree into a Config, checking type and range of each value;
//   Checker      - re-checks a Config's values, so that Config::validate() also catches a
//                  bad value in a Config filled by hand;
//   Renderer     - writes each key's value as YAML, with the values it takes and its line of
//                  help (to_yaml for `lockstep config --print`, config_key_help for
//                  `lockstep train --help`);
// and PathResolver and Hasher, below.
//
// Every problem is reported at once (Note [Every config error at once]). Messages start with
// where the problem is: "FILE:LINE:COL" for what the file says, "--set KEY=VALUE" for what an
// override says. Overrides are applied to the YAML tree before it is read, so both pass
// through the same checks; Origins tells them apart by key path.
//
// A null value ("steps:", "steps: ~", "--set trainer.steps=null") keeps the default. That is
// how an override unsets a key, e.g. trainer.epochs when switching a file to trainer.steps.
//
// The schema is in schema.hpp, the checks in checks.cpp, the hash in hash.cpp and the text of
// `config --print` and `train --help` in render.cpp.

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "config/problems.hpp"
#include "config/schema.hpp"
#include "io/file_roles.hpp"
#include "io/open_input.hpp"
#include "lockstep/config.hpp"

namespace lockstep {
namespace config_impl {
namespace {

// yaml-cpp tags a quoted scalar "!" (a plain one "?").
bool is_quoted(const YAML::Node& node) { return node.Tag() == "!"; }

// How a node reads after "got": 'text' for a plain scalar, the string "text" for a quoted
// one (so that "got the string \"5\"" explains why 5 was not taken as a number), else its kind.
std::string got(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return node.size() == 0 ? "an empty list" : "a list";
  if (!node.IsScalar()) return "an empty value";
  constexpr std::size_t kMaxShown = 60;  // keep the message on one line
  std::string text = node.Scalar();
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown) + "...";
  return is_quoted(node) ? fmt::format("the string \"{}\"", text) : fmt::format("'{}'", text);
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Optimal string alignment distance (Levenshtein plus adjacent transpositions), ignoring case.
std::size_t edit_distance(std::string_view a_in, std::string_view b_in) {
  const std::string a = lowercase(a_in), b = lowercase(b_in);
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

struct UnknownName {
  std::string message;  // "unknown key; did you mean 'model.hidden'?"
  std::string suggestion;  // "model.hidden", or empty
};

// "unknown key; did you mean 'model.hidden'?", or the valid names when none is close. `kind` is
// "key" or "section"; `prefix` is prepended to the names ("model."). A key is also compared
// with the leaves of the nested sections: "checkpoint_dir" finds "checkpoint.dir".
UnknownName unknown_name(std::string_view kind, std::string_view name,
                         const std::vector<std::string_view>& candidates, std::string_view prefix) {
  std::vector<std::string> names(candidates.begin(), candidates.end());
  const std::vector<std::string> leaves =
      prefix.empty() ? names : leaf_names(prefix.substr(0, prefix.size() - 1));
  for (const std::string& leaf : leaves)
    if (std::find(names.begin(), names.end(), leaf) == names.end()) names.push_back(leaf);
  const std::string* best = nullptr;
  std::size_t best_distance = 0;
  for (const std::string& candidate : names) {
    const std::size_t distance = edit_distance(name, candidate);
    // One edit per three letters: "hiden" finds "hidden", "x" does not find "lr".
    const std::size_t close_enough = std::max<std::size_t>(1, candidate.size() / 3);
    if (distance <= close_enough && (!best || distance < best_distance)) {
      best = &candidate;
      best_distance = distance;
    }
  }
  if (best) {
    const std::string suggestion = fmt::format("{}{}", prefix, *best);
    return {fmt::format("unknown {}; did you mean '{}'?", kind, suggestion), suggestion};
  }
  return {fmt::format("unknown {}; valid {}s: {}", kind, kind, fmt::join(leaves, ", ")), ""};
}

// What people write for a list without brackets: "128,64", or one value.
std::string list_hint(const YAML::Node& node) {
  return node.IsScalar() ? fmt::format("; a list is written [{}]", node.Scalar()) : "";
}

// ---- Scalars --------------------------------------------------------------------------------

// The text of a plain scalar. Quoted scalars are strings, even "5" or "true".
std::optional<std::string_view> plain_text(const YAML::Node& node) {
  if (!node.IsScalar() || is_quoted(node)) return std::nullopt;
  return std::string_view(node.Scalar());
}

// YAML allows a leading '+'; from_chars does not.
std::string_view strip_plus(std::string_view s) {
  if (s.size() > 1 && s[0] == '+' &&
      (std::isdigit(static_cast<unsigned char>(s[1])) || s[1] == '.'))
    return s.substr(1);
  return s;
}

std::optional<double> parse_number(std::string_view text) {
  text = strip_plus(text);
  double value = 0.0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  // from_chars accepts "inf" and "nan"; neither is a usable setting.
  if (ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(value))
    return std::nullopt;
  return value;
}

// The YAML 1.1 spellings, which people expect to work, in any case.
std::optional<bool> parse_bool(std::string_view text) {
  const std::string s = lowercase(text);
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  return std::nullopt;
}

// ---- Loading the tree -----------------------------------------------------------------------

// Where each document of a YAML stream starts (its first token) and where its root node is.
class DocumentMarks : public YAML::EventHandler {
 public:
  struct Document {
    YAML::Mark start;
    YAML::Mark root = YAML::Mark::null_mark();
  };
  std::vector<Document> documents;

  void OnDocumentStart(const YAML::Mark& mark) override { documents.push_back({mark}); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& mark) {
    if (documents.back().root.is_null()) documents.back().root = mark;
  }
};

// A document that YAML cannot read, or that is not a map of sections, stops the reading.
[[noreturn]] void stop(const Place& where, std::string_view what) {
  throw ConfigError(fmt::format("{}: {}", where.text, what));
}

// Parses `yaml` into a map of sections; an empty document is an empty map.
//
// The documents are counted with YAML::Parser rather than YAML::LoadAll: on a token that cannot
// start a node ("," alone, "- 1\n,"), yaml-cpp 0.7 returns an empty document without consuming
// it, and LoadAll loops forever, allocating (yaml-cpp issue #1040). Here a document that starts
// where the previous one did is that stuck token, and an error.
// yaml-cpp's syntax errors name the parser's state ("illegal map value"); a config's author
// needs the mistake that leads there, in words, and the line with a caret under the column.
std::string explain_yaml_error(std::string_view text, const YAML::Mark& mark, const std::string& msg) {
  std::string_view line;
  if (!mark.is_null()) {
    std::size_t begin = 0;
    for (int l = 0; l < mark.line && begin != std::string_view::npos; ++l) {
      begin = text.find('\n', begin);
      if (begin != std::string_view::npos) ++begin;
    }
    if (begin != std::string_view::npos && begin <= text.size())
      line = text.substr(begin, text.find('\n', begin) - begin);
  }
  const bool tab = line.substr(0, line.find_first_not_of(" \t")).find('\t') != std::string_view::npos;
  std::string words;
  if (tab || msg == YAML::ErrorMsg::TAB_IN_INDENTATION)
    words = "a tab in the indentation: YAML indents with spaces only";
  else if (msg == YAML::ErrorMsg::MAP_VALUE)
    words = "a ':' where no value can start: a value holding ': ' must be quoted (key: \"a: b\"), "
            "or this key is indented deeper than the keys of its section";
  else if (msg == YAML::ErrorMsg::END_OF_SEQ_FLOW)
    words = "a list opened with '[' is not closed with ']' (or an item lacks its ',')";
  else if (msg == YAML::ErrorMsg::END_OF_MAP_FLOW)
    words = "a map opened with '{' is not closed with '}' (or an entry lacks its ',')";
  else if (msg == YAML::ErrorMsg::END_OF_MAP || msg == YAML::ErrorMsg::END_OF_SEQ ||
           msg == YAML::ErrorMsg::MAP_KEY || msg == YAML::ErrorMsg::BLOCK_ENTRY)
    words = "the indentation does not match the lines above: keys of one section line up, and a "
            "list's '- ' items too";
  else if (msg == YAML::ErrorMsg::EOF_IN_SCALAR || msg == YAML::ErrorMsg::CHAR_IN_SCALAR)
    words = "a quoted string is not closed";
  else if (msg.starts_with(YAML::ErrorMsg::INVALID_ESCAPE))
    words = "a backslash in a double-quoted string that starts no escape: write the value in "
            "single quotes, or double the backslash";
  std::string out = words.empty() ? "YAML syntax: " + msg
                                  : fmt::format("YAML syntax: {} (yaml-cpp: {})", words, msg);
  if (!line.empty() || !mark.is_null()) {
    std::string shown;  // tabs shown as one space each, so the caret lines up
    for (const char c : line) shown += c == '\t' ? ' ' : c;
    const std::string number = std::to_string(mark.line + 1);
    out += fmt::format("\n  {} | {}\n  {} | {}^", number, shown, std::string(number.size(), ' '),
                       std::string(static_cast<std::size_t>(std::max(0, mark.column)), ' '));
  }
  return out;
}

YAML::Node load_tree(std::string_view yaml, const std::string& source) {
  const std::string text(yaml);
  DocumentMarks marks;
  YAML::Node root;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(marks)) {
      const auto& docs = marks.documents;
      if (docs.size() > 1 && docs.back().start.pos == docs[docs.size() - 2].start.pos) {
        const YAML::Mark at = docs.back().start;
        const auto pos = static_cast<std::size_t>(at.pos);
        const bool shown = pos < text.size() && std::isprint(static_cast<unsigned char>(text[pos]));
        stop(mark_place(source, at),
             shown ? fmt::format("unexpected '{}': expected a YAML node", text[pos])
                   : std::string("unexpected token: expected a YAML node"));
      }
    }
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: {}", mark_place(source, e.mark).text,
                                  explain_yaml_error(text, e.mark, e.msg)));
  }
  if (marks.documents.size() > 1)
    stop(mark_place(source, marks.documents[1].root),
         fmt::format("expected one YAML document, found {}", marks.documents.size()));
  if (!root.IsDefined() || root.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap())
    stop(mark_place(source, root.Mark()),
         fmt::format("expected a map of sections ({}), got {}", fmt::join(section_names(), ", "),
                     got(root)));
  return root;
}

// Sets "a.b.c=value" in the tree, making maps along the way. A scalar in the way is replaced
// by a map, so that its key then reports "expected ..., got a map". A default (`default_from`
// names where it came from) sets only a key the tree has no value for, and replaces nothing.
void apply_override(YAML::Node& root, const std::string& text, Origins& origins,
                    const std::string* default_from = nullptr) {
  const Place where = origins.next_override(text);
  const auto malformed = [&] { fail(where, "", "expected KEY=VALUE"); };
  const std::size_t equals = text.find('=');
  if (equals == std::string::npos) malformed();
  const std::string key = text.substr(0, equals);

  std::vector<std::string> parts;
  for (std::size_t begin = 0;;) {
    const std::size_t dot = key.find('.', begin);
    parts.push_back(key.substr(begin, dot - begin));
    if (parts.back().empty()) malformed();
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }

  // The value is YAML too, so that "model.hidden=[32, 32]" gives a list.
  const YAML::Node value = [&] {
    try {
      return YAML::Load(text.substr(equals + 1));
    } catch (const YAML::Exception& e) {
      fail(where, key, fmt::format("invalid YAML value: {}", e.msg));
    }
  }();

  YAML::Node node = root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    const YAML::Node existing = std::as_const(node)[parts[i]];
    if (default_from && existing.IsDefined() && !existing.IsNull() && !existing.IsMap()) return;
    if (!node[parts[i]].IsMap()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
    node.reset(node[parts[i]]);  // rebinds the handle; `node = ...` would overwrite the map
  }
  if (default_from) {
    const YAML::Node existing = std::as_const(node)[parts.back()];
    if (existing.IsDefined() && !existing.IsNull()) return;
    node[parts.back()] = value;
    origins.add_default(key, fmt::format("{} ({})", *default_from, text));
    return;
  }
  node[parts.back()] = value;
  origins.add_override(key, text);
}

// The part keys of model.family's preset that nothing else set (Note [Model families]). A
// family that is not one of the table's is left to the Parser to report.
void apply_family_preset(YAML::Node& root, Origins& origins) {
  const YAML::Node model = std::as_const(root)["model"];
  if (!model.IsDefined() || !model.IsMap()) return;
  const YAML::Node family = model["family"];
  if (!family.IsDefined() || !family.IsScalar()) return;
  for (const FamilyPreset& preset : family_presets()) {
    if (preset.name != family.Scalar()) continue;
    const std::string source = fmt::format("model.family {}", preset.name);
    for (const std::string_view setting : preset.settings)
      apply_override(root, std::string(setting), origins, &source);
  }
}

// ---- Parser ---------------------------------------------------------------------------------

// Reads a YAML tree into a Config, one visit_schema() key at a time, recording every problem
// (Note [Every config error at once]). The constructor checks the names of every section and
// key first.
class Parser {
 public:
  Parser(const YAML::Node& root, Origins& origins, Problems& problems)
      : origins_(origins), problems_(problems) {
    for (const Entry& section : entries(root, "", section_names())) {
      if (section.value.IsNull()) continue;  // "model:" alone keeps every default
      if (!section.value.IsMap()) {
        reject(section.name, [&] { expected(section.name, section.value, "a map"); });
        continue;
      }
      sections_.emplace(section.name,
                        entries(section.value, section.name, find_section(section.name)->keys));
    }
    // Nested sections ("trainer.checkpoint"): a key of the parent whose value is a map.
    for (const SectionKeys& nested : schema()) {
      const std::size_t dot = nested.name.find('.');
      if (dot == std::string_view::npos) continue;
      const auto parent = sections_.find(nested.name.substr(0, dot));
      if (parent == sections_.end()) continue;
      const Entry* entry = find(parent->second, nested.name.substr(dot + 1));
      if (!entry || entry->value.IsNull()) continue;
      const std::string path(nested.name);
      if (!entry->value.IsMap()) {
        const std::string keys =
            fmt::format("{}.{}", path, fmt::join(nested.keys, ", " + path + "."));
        reject(path, [&] { expected(path, entry->value, "a map of " + keys); });
        continue;
      }
      sections_.emplace(path, entries(entry->value, path, nested.keys));
    }
  }

  void section(std::string_view name) {
    section_ = name;
    const auto it = sections_.find(name);
    current_ = it == sections_.end() ? &no_entries_ : &it->second;
  }

  template <class T>
  void integer(std::string_view key, T& out, IntRule rule, std::string_view) {
    read(key, [&](const std::string& path, const YAML::Node& node) {
      out = read_integer<T>(path, node, rule);
    });
  }

  void number(std::string_view key, double& out, const NumberRule& rule, std::string_view) {
    read(key, [&](const std::string& path, const YAML::Node& node) {
      out = read_number(path, node, rule);
    });
  }

  void flag(std::string_view key, bool& out, std::string_view) {
    read(key, [&](const std::string& path, const YAML::Node& node) {
      const auto word = plain_text(node);
      const auto value = word ? parse_bool(*word) : std::nullopt;
      if (!value) expected(path, node, "true or false");
      out = *value;
    });
  }

  void text(std::string_view key, std::string& out, std::string_view) {
    read(key, [&](const std::string& path, const YAML::Node& node) {
      if (!node.IsScalar()) expected(path, node, "a string");
      out = node.Scalar();
    });
  }
  void path(std::string_view key, std::string& out, std::string_view doc) { text(key, out, doc); }

  void choice(std::string_view key, std::string& out, std::span<const std::string_view> choices,
              std::string_view) {
    read(key, [&](const std::string& path, const YAML::Node& node) {
      if (!node.IsScalar() ||
          std::find(choices.begin(), choices.end(), node.Scalar()) == choices.end())
        expected(path, node, fmt::format("one of {}", fmt::join(choices, ", ")));
      out = node.Scalar();
    });
  }

  template <class E, class Table>
  void enumeration(std::string_view key, E& out, const Table& table, std::string_view) {
    read(key, [&](const std::string& path, const YAML::Node& node) {
      const auto it = std::find_if(std::begin(table), std::end(table), [&](const auto& s) {
        return node.IsScalar() && s.name == node.Scalar();
      });
      if (it == std::end(table)) expected(path, node, "one of " + join_names(table));
      out = it->value;
    });
  }

  void integer_list(std::string_view key, std::vector<int>& out, IntRule rule, std::string_view) {
    read(key, [&](const std::string& path, const YAML::Node& node) {
      if (!node.IsSequence()) expected(path, node, "a list of integers", list_hint(node));
      out = read_integer_list(path, node, rule);
    });
  }

  // A list of words, each one of `choices`: [a, b], or one word alone.
  void choice_list(std::string_view key, std::vector<std::string>& out,
                   std::span<const std::string_view> choices, std::string_view) {
    read(key, [&](const std::string& path, const YAML::Node& node) {
      const std::string what = fmt::format("a list of {}", fmt::join(choices, ", "));
      std::vector<std::string> words;
      if (node.IsScalar()) words.push_back(node.Scalar());
      else if (node.IsSequence())
        for (const YAML::Node& item : node) {
          if (!item.IsScalar()) expected(path, node, what);
          words.push_back(item.Scalar());
        }
      else
        expected(path, node, what);
      for (const std::string& w : words)
        if (std::find(choices.begin(), choices.end(), w) == choices.end()) expected(path, node, what);
      out = std::move(words);
    });
  }

  // Either a count n, meaning ids 0..n-1, or a non-empty list of ids.
  void devices(std::string_view key, std::vector<int>& out, std::string_view) {
    read(key, [&](const std::string& path, const YAML::Node& node) {
      if (node.IsSequence()) {
        if (node.size() == 0) expected(path, node, "an integer or a non-empty list of device ids");
        out = read_integer_list(path, node, IntRule{.min = 0});
        return;
      }
      const auto text = plain_text(node);
      const std::string_view digits = text ? strip_plus(*text) : std::string_view();
      int count = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), count);
      if (!text || ec != std::errc{} || end != digits.data() + digits.size())
        expected(path, node, "an integer or a list of device ids",
                 text && text->find(',') != std::string_view::npos ? list_hint(node) : "");
      if (count < 1) expected(path, node, "an integer >= 1 or a list of device ids");
      if (count > kMaxDevices) expected(path, node, fmt::format("at most {} devices", kMaxDevices));
      out.resize(static_cast<std::size_t>(count));
      std::iota(out.begin(), out.end(), 0);
    });
  }

  // "betas: [b1, b2]", another spelling of two keys of the same section.
  void number_pair(std::string_view key, std::string_view first_key, double& first,
                   std::string_view second_key, double& second, const NumberRule& rule,
                   std::string_view) {
    read(key, [&](const std::string& path, const YAML::Node& node) {
      for (const std::string_view other : {first_key, second_key}) {
        if (find(*current_, other))
          fail(origins_.locate(path, find(*current_, key)->key.Mark()), path,
               fmt::format("conflicts with {}; set one or the other", path_of(other)));
      }
      if (!node.IsSequence() || node.size() != 2)
        expected(path, node, fmt::format("a list [{}, {}]", first_key, second_key),
                 list_hint(node));
      first = read_number(path + "[0]", node[0], rule);
      second = read_number(path + "[1]", node[1], rule);
    });
  }
  // A nested section's map is read by the constructor, as a section of its own.
  void nested(std::string_view) {}

 private:
  struct Entry {
    std::string name;
    YAML::Node key;
    YAML::Node value;
  };
  using Entries = std::vector<Entry>;  // in document order; a section has a dozen keys at most

  static const Entry* find(const Entries& entries, std::string_view name) {
    const auto it = std::find_if(entries.begin(), entries.end(),
                                 [&](const Entry& e) { return e.name == name; });
    return it == entries.end() ? nullptr : &*it;
  }

  // Runs `check`; a problem it finds is recorded against `path`, which then keeps its default.
  template <class F>
  void reject(const std::string& path, F&& check) {
    try {
      check();
    } catch (const Rejected& r) {
      problems_.add(r.where, r.path, r.what);
      problems_.mark_failed(r.path);
      problems_.mark_failed(path);
    }
  }

  // Reads `key` of the current section with `reader`, unless it is absent or null (it keeps
  // its default then).
  template <class F>
  void read(std::string_view key, F&& reader) {
    const Entry* entry = find(*current_, key);
    if (!entry || entry->value.IsNull()) return;
    const std::string path = path_of(key);
    reject(path, [&] { reader(path, entry->value); });
  }

  // The pairs of the map at `path` ("" for the top level) whose keys are among `valid`, each
  // once; every other pair is a problem. Remembers where each key was written.
  Entries entries(const YAML::Node& map, const std::string& path,
                  const std::vector<std::string_view>& valid) {
    const bool top = path.empty();
    Entries out;
    for (const auto& pair : map) {
      const YAML::Node& key = pair.first;
      const std::string key_path =
          key.IsScalar() ? (top ? key.Scalar() : path + "." + key.Scalar()) : path;
      reject(key_path, [&] {
        if (!key.IsScalar()) expected(path, key, top ? "a section name" : "a key name");
        const std::string& name = key.Scalar();
        const Place where = origins_.locate(key_path, key.Mark());
        if (std::find(valid.begin(), valid.end(), name) == valid.end()) {
          for (const ReplacedKey& replaced : kReplacedKeys)
            if (replaced.path == key_path) fail(where, key_path, replaced.message);
          const UnknownName unknown =
              unknown_name(top ? "section" : "key", name, valid, top ? "" : path + ".");
          // What the user meant is unknown: no rule about it is checked.
          if (!unknown.suggestion.empty()) problems_.mark_failed(unknown.suggestion);
          fail(where, key_path, unknown.message);
        }
        if (const Entry* first = find(out, name))
          fail(where, key_path,
               fmt::format("duplicate key (first at {})",
                           origins_.locate(key_path, first->key.Mark()).text));
        out.push_back({name, key, pair.second});
        origins_.remember(key_path, where);
      });
    }
    return out;
  }

  std::string path_of(std::string_view key) const { return fmt::format("{}.{}", section_, key); }

  [[noreturn]] void expected(const std::string& path, const YAML::Node& node,
                             std::string_view what, std::string_view hint = "") const {
    fail(origins_.locate(path, node.Mark()), path,
         fmt::format("expected {}, got {}{}", what, got(node), hint));
  }

  template <class T>
  T read_integer(const std::string& path, const YAML::Node& node, IntRule rule) const {
    const auto text = plain_text(node);
    if (!text) expected(path, node, describe(rule));
    const std::string_view digits = strip_plus(*text);
    T value{};
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec == std::errc::result_out_of_range) {
      if (digits.starts_with('-'))
        expected(path, node,
                 fmt::format("an integer >= {}",
                             std::max<std::int64_t>(rule.min, std::numeric_limits<T>::min())));
      expected(path, node, fmt::format("an integer <= {}", std::numeric_limits<T>::max()));
    }
    if (ec != std::errc{} || end != digits.data() + digits.size() ||
        std::cmp_less(value, rule.min) ||
        (rule.max != kNoMax && std::cmp_greater(value, rule.max)))
      expected(path, node, describe(rule));
    return value;
  }

  std::vector<int> read_integer_list(const std::string& path, const YAML::Node& list,
                                     IntRule rule) const {
    std::vector<int> values;
    for (std::size_t i = 0; i < list.size(); ++i)
      values.push_back(read_integer<int>(fmt::format("{}[{}]", path, i), list[i], rule));
    return values;
  }

  double read_number(const std::string& path, const YAML::Node& node,
                     const NumberRule& rule) const {
    const auto text = plain_text(node);
    const auto value = text ? parse_number(*text) : std::nullopt;
    if (!value || !satisfies(*value, rule)) expected(path, node, rule.description);
    return *value;
  }

  Origins& origins_;
  Problems& problems_;
  std::map<std::string, Entries, std::less<>> sections_;
  const Entries no_entries_;
  const Entries* current_ = &no_entries_;
  std::string section_;
};

// ---- PathResolver ---------------------------------------------------------------------------

// Note [Config paths]
// ~~~~~~~~~~~~~~~~~~~
// One rule for every path key, inputs and outputs alike: a relative path written in a config
// file is relative to that file's directory, so a config means the same files from wherever it
// is run; a relative path given with --set (or a flag) is relative to the working directory,
// as a shell user expects. load_config() rewrites the file's relative paths to
// `config_dir / path` (lexically normalised), so that the rest of the program only ever sees
// paths relative to the working directory. parse_config(), which has no file, leaves them as
// they are. config_hash() hashes a data path as the absolute file it names.
class PathResolver {
 public:
  PathResolver(const Origins& origins, std::filesystem::path dir)
      : origins_(origins), dir_(std::move(dir)) {}

  void section(std::string_view name) { section_ = name; }
  void path(std::string_view key, std::string& value, std::string_view) {
    if (value.empty() || std::filesystem::path(value).is_absolute()) return;
    if (origins_.overridden(fmt::format("{}.{}", section_, key))) return;
    value = (dir_ / value).lexically_normal().string();
  }
  template <class... Any> void integer(Any&&...) {}
  template <class... Any> void number(Any&&...) {}
  template <class... Any> void flag(Any&&...) {}
  template <class... Any> void text(Any&&...) {}
  template <class... Any> void choice(Any&&...) {}
  template <class... Any> void enumeration(Any&&...) {}
  template <class... Any> void integer_list(Any&&...) {}
  template <class... Any> void choice_list(Any&&...) {}
  template <class... Any> void devices(Any&&...) {}
  template <class... Any> void number_pair(Any&&...) {}
  template <class... Any> void nested(Any&&...) {}

 private:
  const Origins& origins_;
  std::filesystem::path dir_;
  std::string section_;
};

std::string read_config_file(const std::filesystem::path& file) {
  // Note [Opening an input]; the error keeps its config type.
  try {
    return detail::read_input(file, detail::InputKind::config);
  } catch (const ConfigError&) {
    throw;
  } catch (const InputError& e) {
    throw ConfigError(e.what());
  }
}

// `dir`: the config file's directory, against which its relative paths are resolved; empty
// for text that came from no file (Note [Config paths]).
Config parse_config_in(std::string_view yaml, std::string_view source,
                       std::span<const std::string> overrides, const std::filesystem::path* dir,
                       const ConfigDefaults* defaults = nullptr,
                       const ConfigReading& reading = {}) {
  Origins origins{std::string(source)};
  YAML::Node root = load_tree(yaml, origins.source());
  Problems problems;
  for (const std::string& text : overrides) {
    try {
      apply_override(root, text, origins);
    } catch (const Rejected& r) {
      problems.add(r.where, r.path, r.what);
    }
  }
  if (defaults) {
    for (const std::string& text : defaults->values) {
      try {
        apply_override(root, text, origins, &defaults->source);
      } catch (const Rejected& r) {
        problems.add(r.where, r.path, r.what);
      }
    }
  }
  apply_family_preset(root, origins);

  Config config;
  config.source = source;
  Parser parser(root, origins, problems);
  visit_schema(parser, config);
  config.set_at = origins.set_by_user();
  if (dir) {
    const Config written = config;
    PathResolver resolver(origins, *dir);
    visit_schema(resolver, config);
    if (reading.data_files_exist) check_data_files(written, config, origins, problems, *dir);
  }
  // Text is read byte by byte: its vocabulary is 256 unless a larger one is asked for. With a
  // tokenizer, 0 stays: the tokenizer's size, known once it is read (load_dataset).
  if (config.data.dataset == DatasetKind::text && config.data.tokenizer.empty() &&
      config.model.vocab_size == 0)
    config.model.vocab_size = kByteVocabSize;
  check_config(config, origins, problems);
  check_data_source(config, origins, problems);
  problems.throw_if_any();
  return config;
}

}  // namespace
}  // namespace config_impl

using namespace config_impl;

Config parse_config(std::string_view yaml, std::string_view source,
                    std::span<const std::string> overrides) {
  return parse_config_in(yaml, source, overrides, nullptr);
}

// A bare file name's directory is "." (the working directory): Note [Config paths].
Config load_config(const std::filesystem::path& file, std::span<const std::string> overrides) {
  const std::filesystem::path dir = detail::directory_of(file);
  return parse_config_in(read_config_file(file), file.string(), overrides, &dir);
}

Config load_config(const std::filesystem::path& file, std::span<const std::string> overrides,
                   const ConfigDefaults& defaults) {
  const std::filesystem::path dir = detail::directory_of(file);
  return parse_config_in(read_config_file(file), file.string(), overrides, &dir, &defaults);
}

Config load_config(const std::filesystem::path& file, std::span<const std::string> overrides,
                   const ConfigDefaults& defaults, const ConfigReading& reading) {
  const std::filesystem::path dir = detail::directory_of(file);
  return parse_config_in(read_config_file(file), file.string(), overrides, &dir, &defaults,
                         reading);
}

}  // namespace lockstep
