// to_yaml() (`lockstep config --print`) and config_key_help() (`lockstep train --help`).
#include <algorithm>
#include <filesystem>
#include <span>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "config/schema.hpp"
#include "lockstep/config.hpp"

namespace lockstep {
namespace {

using namespace config_impl;

// ---- Renderer -------------------------------------------------------------------------------

// Each key's value as YAML, with the values it takes and its line of description: the text of
// `lockstep config --print` (to_yaml) and of `lockstep train --help` (config_key_help).
class Renderer {
 public:
  struct Key {
    std::string section;
    ConfigKeyHelp help;
    bool alias = false;  // optimizer.betas: another spelling of keys listed on their own
  };

  void section(std::string_view name) { section_ = name; }

  template <class T>
  void integer(std::string_view key, T value, IntRule rule, std::string_view doc) {
    const bool unset = rule.zero_means_unset && value == 0;
    add(key, describe(rule), unset ? "null" : fmt::format("{}", value), doc);
  }
  // fmt prints the shortest text that reads back as the same double.
  void number(std::string_view key, double value, const NumberRule& rule, std::string_view doc) {
    add(key, rule.description, fmt::format("{}", value), doc);
  }
  void flag(std::string_view key, bool value, std::string_view doc) {
    add(key, "true or false", value ? "true" : "false", doc);
  }
  void text(std::string_view key, const std::string& value, std::string_view doc) {
    add(key, "a string", quoted(value), doc);
  }
  // Absolute, so that the text means the same file wherever it is saved (Note [Config paths]).
  void path(std::string_view key, const std::string& value, std::string_view doc) {
    add(key, "a path",
        quoted(value.empty() ? value
                             : std::filesystem::absolute(value).lexically_normal().string()),
        doc);
  }
  void choice(std::string_view key, const std::string& value,
              std::span<const std::string_view> choices, std::string_view doc) {
    add(key, fmt::format("one of {}", fmt::join(choices, ", ")), value, doc);
  }
  template <class E, class Table>
  void enumeration(std::string_view key, E value, const Table& table, std::string_view doc) {
    add(key, "one of " + join_names(table), std::string(spelling(table, value)), doc);
  }
  void integer_list(std::string_view key, const std::vector<int>& values, IntRule rule,
                    std::string_view doc) {
    add(key, fmt::format("a list of integers >= {}", rule.min),
        fmt::format("[{}]", fmt::join(values, ", ")), doc);
  }
  void choice_list(std::string_view key, const std::vector<std::string>& values,
                   std::span<const std::string_view> choices, std::string_view doc) {
    add(key, fmt::format("a list of {}", fmt::join(choices, ", ")),
        fmt::format("[{}]", fmt::join(values, ", ")), doc);
  }
  void devices(std::string_view key, const std::vector<int>& ids, std::string_view doc) {
    add(key, "an integer or a list of device ids", fmt::format("[{}]", fmt::join(ids, ", ")), doc);
  }
  void number_pair(std::string_view key, std::string_view first_key, double,
                   std::string_view second_key, double, const NumberRule&, std::string_view doc) {
    add(key, fmt::format("a list [{}, {}]", first_key, second_key), "null", doc);
    keys_.back().alias = true;
  }
  void nested(std::string_view) {}

  const std::vector<Key>& keys() const { return keys_; }

 private:
  static std::string quoted(const std::string& value) {
    YAML::Emitter out;
    out << YAML::DoubleQuoted << value;
    return out.c_str();
  }
  void add(std::string_view key, std::string_view type, std::string yaml, std::string_view doc) {
    keys_.push_back({section_,
                     {fmt::format("{}.{}", section_, key), std::string(type), std::move(yaml),
                      std::string(doc)}});
  }

  std::string section_;
  std::vector<Key> keys_;
};

}  // namespace

std::vector<ConfigKeyHelp> config_key_help() {
  Renderer renderer;
  const Config defaults;
  visit_schema(renderer, defaults);
  std::vector<ConfigKeyHelp> out;
  for (const Renderer::Key& key : renderer.keys()) out.push_back(key.help);
  return out;
}

std::string to_yaml(const Config& config) {
  Renderer renderer;
  visit_schema(renderer, config);
  std::string out;
  std::string_view section;
  for (const Renderer::Key& key : renderer.keys()) {
    if (key.alias) continue;
    // "trainer.checkpoint" is a map inside trainer, its keys one level deeper.
    const auto depth =
        static_cast<std::size_t>(std::count(key.section.begin(), key.section.end(), '.'));
    if (key.section != section) {
      section = key.section;
      const std::size_t dot = section.rfind('.');
      out += fmt::format("{:{}}{}:\n", "", 2 * depth,
                         dot == std::string_view::npos ? section : section.substr(dot + 1));
    }
    out += fmt::format("{:{}}{}: {}\n", "", 2 * depth + 2,
                       key.help.key.substr(key.section.size() + 1), key.help.default_value);
  }
  return out;
}

}  // namespace lockstep
