// What reading and checking a config share: where a message points (Place, Origins) and the
// list of problems found so far (Problems, Note [Every config error at once]).
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "lockstep/config.hpp"

namespace lockstep::config_impl {

// ---- Messages -------------------------------------------------------------------------------

// Where a message points: "FILE:LINE:COL", "--set KEY=VALUE", or the file alone. `order` puts
// messages in reading order: the file's lines, then the overrides as given, then the file as a
// whole (a missing key has no line).
struct Place {
  std::string text;
  std::array<std::size_t, 3> order{2, 0, 0};
};

// yaml-cpp counts lines and columns from 0; editors count from 1.
Place mark_place(std::string_view source, const YAML::Mark& mark);

// Note [Every config error at once]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A config is checked to the end, so that one run reports every mistake rather than the first
// of them (a user who fixes a typo should not meet the next one on the next run). Each key is
// read on its own: a bad value is recorded, the key keeps its default, and reading goes on with
// the next key. A rule that ties keys together is checked only when none of its keys failed,
// nor a key that an unknown key's did-you-mean names (a misspelt trainer.steps does not add
// "set trainer.steps or trainer.epochs"). The ConfigError lists the problems one per line in
// the file's order, so that its first line is the first problem, as it was when only one was
// reported. A document YAML cannot parse stops at its syntax error.
class Problems {
 public:
  void add(const Place& where, std::string_view path, std::string_view what) {
    problems_.push_back({where.order, path.empty() ? fmt::format("{}: {}", where.text, what)
                                                   : fmt::format("{}: {}: {}", where.text, path,
                                                                 what)});
  }

  // Marks a key (or a section) whose value is unknown: its default stands in for it.
  void mark_failed(std::string_view path) {
    if (!path.empty()) failed_.emplace_back(path);
  }

  // True when `path`, a section above it or a key below it failed ("model.hidden[1]" fails
  // "model.hidden").
  bool failed(std::string_view path) const;

  void throw_if_any() {
    if (problems_.empty()) return;
    std::stable_sort(problems_.begin(), problems_.end(),
                     [](const Problem& a, const Problem& b) { return a.order < b.order; });
    std::vector<std::string> lines;  // one problem reached twice (a rule and its re-check) once
    for (const Problem& p : problems_)
      if (std::find(lines.begin(), lines.end(), p.text) == lines.end()) lines.push_back(p.text);
    throw ConfigError(fmt::format("{}", fmt::join(lines, "\n")));
  }

 private:
  struct Problem {
    std::array<std::size_t, 3> order;
    std::string text;
  };
  std::vector<Problem> problems_;
  std::vector<std::string> failed_;
};

// A problem found deep inside the reading of one key; the key's reader records it and goes on.
struct Rejected {
  Place where;
  std::string path;
  std::string what;
};

[[noreturn]] inline void fail(const Place& where, std::string_view path, std::string_view what) {
  throw Rejected{where, std::string(path), std::string(what)};
}


// True when `path` is `parent` or lies below it ("a.b" and "a.b[0]" lie below "a").
bool is_within(std::string_view path, std::string_view parent);

// ---- Origins --------------------------------------------------------------------------------

// Where the keys of the merged tree came from, so that messages can point at them.
class Origins {
 public:
  explicit Origins(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }
  Place whole() const { return {source_}; }
  // Where the next override is named, before add_override() takes it.
  Place next_override(const std::string& text) const {
    return {"--set " + text, {1, overrides_.size(), 0}};
  }

  void add_override(std::string key, std::string text) {
    overrides_.push_back({std::move(key), std::move(text)});
  }
  // A default (ConfigDefaults): where it came from, in place of "--set".
  void add_default(std::string key, std::string location) {
    defaulted_.push_back(key);
    overrides_.push_back({std::move(key), std::move(location), true});
  }

  // "--set KEY=VALUE" for a node that an override set, else "FILE:LINE:COL".
  Place locate(std::string_view path, const YAML::Mark& mark) const {
    // The latest override that set this path or one of its parents wins.
    for (std::size_t i = overrides_.size(); i-- > 0;)
      if (is_within(path, overrides_[i].key)) return override_place(i);
    if (!mark.is_null()) return mark_place(source_, mark);
    // Nodes without a mark were made by an override that set something below them.
    for (std::size_t i = overrides_.size(); i-- > 0;)
      if (is_within(overrides_[i].key, path)) return override_place(i);
    return whole();
  }

  // Remembers where a key was written, for the cross-field checks after parsing.
  void remember(const std::string& path, Place place) {
    written_.insert_or_assign(path, std::move(place));
  }

  const Place* written(std::string_view path) const {
    const auto it = written_.find(path);
    return it == written_.end() ? nullptr : &it->second;
  }

  // Where the file and the overrides set each key (Config::set_at): the defaults left out.
  std::map<std::string, std::string, std::less<>> set_by_user() const {
    std::map<std::string, std::string, std::less<>> out;
    for (const auto& [key, place] : written_) out.emplace(key, place.text);
    for (const std::string& key : defaulted_) out.erase(key);
    return out;
  }

  // Where `path` was written, or just the source when that is not known.
  Place of(std::string_view path) const {
    const Place* at = written(path);
    return at ? *at : whole();
  }

  // True when an override set `path` or a section above it.
  bool overridden(std::string_view path) const {
    return std::any_of(overrides_.begin(), overrides_.end(),
                       [&](const Override& o) { return is_within(path, o.key); });
  }

 private:
  struct Override {
    std::string key;   // "trainer.steps"
    std::string text;  // "trainer.steps=100"; a default's location
    bool is_default = false;
  };
  Place override_place(std::size_t i) const {
    const Override& o = overrides_[i];
    return {o.is_default ? o.text : "--set " + o.text, {1, i, 0}};
  }

  std::string source_;
  std::vector<Override> overrides_;
  std::vector<std::string> defaulted_;  // keys a default set
  std::map<std::string, Place, std::less<>> written_;
};

// ---- The checks (checks.cpp) ----------------------------------------------------------------

// Every value, then the rules that tie keys together; a rule only when none of its keys failed
// to read (Note [Every config error at once]).
void check_config(const Config& c, const Origins& origins, Problems& problems);

// The files data.dataset needs. Checked when a config is read, not by Config::validate(): an
// embedder who hands the Trainer its own datasets never sets them. Nothing is checked when the
// model or the dataset failed to read.
void check_data_source(const Config& c, const Origins& origins, Problems& problems);

// A data file the dataset needs that is not there, named by its key with how its path was
// resolved (Note [Config paths]): a problem found before any data is read, with the others.
void check_data_files(const Config& written, const Config& resolved, const Origins& origins,
                      Problems& problems, const std::filesystem::path& dir);

}  // namespace lockstep::config_impl
