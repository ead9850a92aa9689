// config_hash() and config_values(): the keys that change the math of training, as a
// canonical text and its hash.
#include <algorithm>
#include <filesystem>
#include <iterator>
#include <map>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/fnv1a.hpp"
#include "config/schema.hpp"
#include "lockstep/config.hpp"

namespace lockstep {
namespace {

using namespace config_impl;

// ---- Hasher ---------------------------------------------------------------------------------

// Lists every key as "section.key" and its value, as `lockstep train` would print it, and renders
// the keys that change the math of training as "section.key=value" lines, for config_hash().
// Left out of the hash are data.prefetch, model.attention and every trainer key but trainer.seed:
// they say how fast, where and for how long to train, and a resumed run may change them
// (model.attention, like trainer.precision, changes how the same function is computed, not
// which). A key added to the schema is hashed unless it is listed here.
//
// The decoder's part keys (model.family to model.rope_scaling, issue 41) came after checkpoints
// had recorded hashes: each is hashed only when it differs from its default, GPT-2's, so that
// a GPT-2 config hashes as it did before they existed and its checkpoints resume. So are the
// chat keys (data.template to data.skip_bad_records, issue 44).
class Hasher {
 public:
  Hasher() = default;
  // `defaults`: the rendering of the default Config, key by key, or null while making it.
  explicit Hasher(const std::map<std::string, std::string, std::less<>>* defaults)
      : defaults_(defaults) {}

  void section(std::string_view name) { section_ = name; }

  template <class T>
  void integer(std::string_view key, T value, IntRule, std::string_view) {
    add(key, fmt::format("{}", value));
  }
  // fmt prints the shortest text that reads back as the same double: stable across platforms.
  void number(std::string_view key, double value, const NumberRule&, std::string_view) {
    add(key, fmt::format("{}", value));
  }
  void flag(std::string_view key, bool value, std::string_view) {
    add(key, value ? "true" : "false");
  }
  // Length-prefixed in the hash, so that no text can pass for the end of its line and another key.
  void text(std::string_view key, const std::string& value, std::string_view = {}) {
    add(key, fmt::format("{}:{}", value.size(), value), value.empty() ? "\"\"" : value);
  }
  // The file a path names, wherever the run starts from (see Note [Config paths]).
  void path(std::string_view key, const std::string& value, std::string_view) {
    // Unset, data.tokenizer is left out: checkpoints from before the key name the same config.
    if (section_ == "data" && key == "tokenizer" && value.empty()) return;
    text(key, value.empty() ? value
                            : std::filesystem::absolute(value).lexically_normal().string());
  }
  void choice(std::string_view key, const std::string& value, std::span<const std::string_view>,
              std::string_view) {
    text(key, value);
  }
  template <class E, class Table>
  void enumeration(std::string_view key, E value, const Table& table, std::string_view) {
    add(key, spelling(table, value));
  }
  void integer_list(std::string_view key, const std::vector<int>& values, IntRule,
                    std::string_view) {
    add(key, fmt::format("[{}]", fmt::join(values, ",")));
  }
  void choice_list(std::string_view key, const std::vector<std::string>& values,
                   std::span<const std::string_view>, std::string_view) {
    add(key, fmt::format("[{}]", fmt::join(values, ",")));
  }
  void devices(std::string_view key, const std::vector<int>& ids, std::string_view) {
    add(key, fmt::format("[{}]", fmt::join(ids, ",")));
  }
  // betas is listed as beta1 and beta2.
  void number_pair(std::string_view, std::string_view, double, std::string_view, double,
                   const NumberRule&, std::string_view) {}
  void nested(std::string_view) {}

  const std::string& rendering() const { return rendering_; }
  // Each key's hashed text, by "section.key".
  const std::map<std::string, std::string, std::less<>>& hashed() const { return hashed_; }
  const ConfigValues& values() const { return values_; }

 private:
  void add(std::string_view key, std::string_view hashed) { add(key, hashed, hashed); }
  void add(std::string_view key, std::string_view hashed, std::string_view shown) {
    const std::string path = fmt::format("{}.{}", section_, key);
    values_.emplace_back(path, std::string(shown));
    hashed_.emplace(path, std::string(hashed));
    const bool run_setting = section_.starts_with("trainer")
                                 ? key != "seed"
                                 : (section_ == "data" && key == "prefetch") ||
                                       (section_ == "model" && key == "attention");
    if (!run_setting && !at_later_default(path, hashed))
      rendering_ += fmt::format("{}={}\n", path, hashed);
  }

  // A key added after the hash was first defined (the decoder's, LoRA's, the chat data's,
  // data.tokenizer_family) at its default: left out, so older configs and checkpoints keep
  // their hash.
  bool at_later_default(const std::string& path, std::string_view hashed) const {
    if (!defaults_) return false;
    const bool later =
        path.starts_with("model.")
            ? path.starts_with("model.rope_scaling.") || path.starts_with("model.lora.") ||
                  std::find(std::begin(kDecoderKeys), std::end(kDecoderKeys),
                            std::string_view(path).substr(6)) != std::end(kDecoderKeys)
            : std::find(std::begin(kLaterDataKeys), std::end(kLaterDataKeys), path) != std::end(kLaterDataKeys);
    const auto it = defaults_->find(path);
    return later && it != defaults_->end() && it->second == hashed;
  }
  static constexpr std::string_view kDecoderKeys[] = {
      "family", "norm", "norm_eps", "positions", "rope_theta", "mlp", "intermediate_size",
      "n_kv_head", "head_dim", "qkv_bias", "proj_bias", "tie_embeddings"};
  static constexpr std::string_view kLaterDataKeys[] = {
      "data.template", "data.train_on", "data.pack", "data.skip_bad_records",
      "data.tokenizer_family"};

  const std::map<std::string, std::string, std::less<>>* defaults_ = nullptr;
  std::map<std::string, std::string, std::less<>> hashed_;
  std::string section_;
  std::string rendering_;
  ConfigValues values_;
};

const std::map<std::string, std::string, std::less<>>& default_rendering() {
  static const std::map<std::string, std::string, std::less<>> rendering = [] {
    Hasher hasher;
    const Config defaults;
    visit_schema(hasher, defaults);
    return hasher.hashed();
  }();
  return rendering;
}

}  // namespace

std::uint64_t config_hash(const Config& config) {
  Hasher hasher(&default_rendering());
  visit_schema(hasher, config);
  return detail::fnv1a64(hasher.rendering().data(), hasher.rendering().size());
}

ConfigValues config_values(const Config& config) {
  Hasher hasher;
  visit_schema(hasher, config);
  return hasher.values();
}

}  // namespace lockstep
