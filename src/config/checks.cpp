// The checks of a config's values: each key's rule again (Checker, for a Config filled by
// hand), then the rules that tie keys together, and the data files the dataset needs.
#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/problems.hpp"
#include "config/schema.hpp"
#include "lockstep/config.hpp"

namespace lockstep {
namespace config_impl {
namespace {

// ---- Checker --------------------------------------------------------------------------------

// Re-checks the values of a Config against the rules in visit_schema().
class Checker {
 public:
  Checker(const Origins& origins, Problems& problems) : origins_(origins), problems_(problems) {}

  void section(std::string_view name) { section_ = name; }

  template <class T>
  void integer(std::string_view key, T value, IntRule rule, std::string_view = {}) {
    if (rule.zero_means_unset && value == 0) return;
    if (std::cmp_less(value, rule.min)) reject(key, describe(rule), value);
  }

  void number(std::string_view key, double value, const NumberRule& rule, std::string_view) {
    if (!satisfies(value, rule)) reject(key, rule.description, value);
  }

  void flag(std::string_view, bool, std::string_view) {}
  void text(std::string_view, const std::string&, std::string_view) {}
  void path(std::string_view, const std::string&, std::string_view) {}

  void choice(std::string_view key, const std::string& value,
              std::span<const std::string_view> choices, std::string_view) {
    if (std::find(choices.begin(), choices.end(), value) == choices.end())
      reject(key, fmt::format("one of {}", fmt::join(choices, ", ")), value);
  }

  template <class E, class Table>
  void enumeration(std::string_view key, E value, const Table& table, std::string_view) {
    if (!find_name(table, value))
      reject(key, "one of " + join_names(table), static_cast<long long>(value));
  }

  void integer_list(std::string_view key, const std::vector<int>& values, IntRule rule,
                    std::string_view = {}) {
    for (std::size_t i = 0; i < values.size(); ++i)
      integer(fmt::format("{}[{}]", key, i), values[i], rule);
  }

  void devices(std::string_view key, const std::vector<int>& ids, std::string_view) {
    if (ids.empty()) reject(key, "a non-empty list of device ids", "[]");
    integer_list(key, ids, IntRule{.min = 0});
  }

  // betas is checked as beta1 and beta2.
  void number_pair(std::string_view, std::string_view, double, std::string_view, double,
                   const NumberRule&, std::string_view) {}
  void nested(std::string_view) {}

 private:
  template <class V>
  void reject(std::string_view key, std::string_view what, const V& value) {
    const std::string path = fmt::format("{}.{}", section_, key);
    problems_.add(origins_.of(path), path, fmt::format("expected {}, got '{}'", what, value));
    problems_.mark_failed(path);
  }

  const Origins& origins_;
  Problems& problems_;
  std::string section_;
};

// `dir` absolute, without the trailing separator that "." would leave ("/home/me/run/").
std::filesystem::path absolute_directory(const std::filesystem::path& dir) {
  const std::filesystem::path out = std::filesystem::absolute(dir).lexically_normal();
  return out.has_filename() || !out.has_relative_path() ? out : out.parent_path();
}

}  // namespace

void check_config(const Config& c, const Origins& origins, Problems& problems) {
  Checker checker(origins, problems);
  visit_schema(checker, c);

  const auto fail_at = [&](std::string_view path, std::string_view what) {
    problems.add(origins.of(path), path, what);
  };
  const auto readable = [&](std::initializer_list<std::string_view> paths) {
    return std::none_of(paths.begin(), paths.end(),
                        [&](std::string_view p) { return problems.failed(p); });
  };
  // "trainer.steps (20, set at --set trainer.steps=20)": the other key of a rule, which may
  // have been written somewhere else than the key the message is about.
  const auto other = [&](std::string_view path, auto value) {
    const Place* at = origins.written(path);
    return at ? fmt::format("{} ({}, set at {})", path, value, at->text)
              : fmt::format("{} ({})", path, value);
  };

  const TrainerConfig& t = c.trainer;
  if (readable({"trainer.steps", "trainer.epochs"})) {
    if (t.steps == 0 && t.epochs == 0)
      problems.add(origins.whole(), "trainer", "set trainer.steps or trainer.epochs");
    if (t.steps != 0 && t.epochs != 0)
      fail_at("trainer.steps", fmt::format("conflicts with {}; set only one (null unsets a key)",
                                           other("trainer.epochs", t.epochs)));
  }
  if (readable({"trainer.grad_reduce_dtype", "trainer.zero"}) &&
      t.grad_reduce_dtype == ReduceDtype::bf16 && t.zero >= 1)
    fail_at("trainer.grad_reduce_dtype",
            fmt::format("bf16 with {} is not implemented yet; use fp32 with ZeRO",
                        other("trainer.zero", t.zero)));
  const OptimizerConfig& o = c.optimizer;
  if (readable({"optimizer.type", "optimizer.momentum"}) && o.type == OptimizerKind::adamw &&
      o.momentum != 0.0)
    fail_at("optimizer.momentum", "not a key of adamw (it is sgd's; adamw's first-moment decay is "
                                  "optimizer.beta1)");
  if (readable({"optimizer.type", "optimizer.nesterov"}) && o.type == OptimizerKind::adamw &&
      o.nesterov)
    fail_at("optimizer.nesterov", "not a key of adamw (it is sgd's)");
  else if (readable({"optimizer.nesterov", "optimizer.momentum"}) && o.nesterov &&
           !(o.momentum > 0))
    fail_at("optimizer.nesterov", "requires optimizer.momentum > 0");
  const ModelConfig& m = c.model;
  if (readable({"model.vocab_size"}) && m.vocab_size > kMaxVocabSize)
    fail_at("model.vocab_size",
            fmt::format("expected an integer <= {} (token ids reach the embedding as floats, "
                        "exact below 2^24), got {}",
                        kMaxVocabSize, m.vocab_size));
  if (readable({"model.type", "model.d_model", "model.n_head"}) && m.type == "gpt" &&
      m.d_model % m.n_head != 0)
    fail_at("model.n_head", fmt::format("must divide {}, got {}", other("model.d_model", m.d_model),
                                        m.n_head));
  if (readable({"schedule.min_lr", "optimizer.lr"}) && c.schedule.min_lr > o.lr)
    fail_at("schedule.min_lr",
            fmt::format("must be <= {}, got {}", other("optimizer.lr", o.lr), c.schedule.min_lr));
}

void check_data_source(const Config& c, const Origins& origins, Problems& problems) {
  if (problems.failed("data.dataset") || problems.failed("model.type")) return;
  // A missing file key has no place of its own; point at the dataset choice if it was written.
  const auto written_or_dataset = [&](std::string_view path) {
    const Place* at = origins.written(path);
    return at ? *at : origins.of("data.dataset");
  };
  const auto require_file = [&](std::string_view path, const std::string& value) {
    if (value.empty() && !problems.failed(path))
      problems.add(written_or_dataset(path), path,
                   fmt::format("required when data.dataset is {}", to_string(c.data.dataset)));
  };
  const DatasetKind kind = c.data.dataset;
  const bool language = kind == DatasetKind::tokens || kind == DatasetKind::text;
  if (kind == DatasetKind::csv || language) require_file("data.path", c.data.path);
  if (c.data.dataset == DatasetKind::idx) {
    require_file("data.images", c.data.images);
    require_file("data.labels", c.data.labels);
  }

  // A gpt reads token windows; an mlp reads feature vectors with one class each.
  if (language && c.model.type != "gpt")
    problems.add(origins.of("data.dataset"), "data.dataset",
                 fmt::format("{} data needs model.type gpt, got {}", to_string(kind),
                             c.model.type));
  if (!language && kind != DatasetKind::given && c.model.type == "gpt")
    problems.add(origins.of("model.type"), "model.type",
                 fmt::format("gpt needs data.dataset tokens or text, got {}", to_string(kind)));
  if (!c.data.tokenizer.empty() && !language)
    problems.add(origins.of("data.tokenizer"), "data.tokenizer",
                 fmt::format("a key of tokens and text data, got data.dataset {}",
                             to_string(kind)));
  if (problems.failed("model.vocab_size")) return;
  if (!c.data.tokenizer.empty()) return;  // the vocabulary is checked against it at load
  const int vocab = c.model.vocab_size;
  if (kind == DatasetKind::tokens && vocab == 0)
    problems.add(written_or_dataset("model.vocab_size"), "model.vocab_size",
                 "required when data.dataset is tokens: token files do not record it (GPT-2: "
                 "50257; train --init-from a GPT-2 directory gives it, or data.tokenizer)");
  if (kind == DatasetKind::text && vocab < kByteVocabSize)
    problems.add(origins.of("model.vocab_size"), "model.vocab_size",
                 fmt::format("expected at least {} for text data (one token per byte), got {}",
                             kByteVocabSize, vocab));
}

void check_data_files(const Config& written, const Config& resolved, const Origins& origins,
                      Problems& problems, const std::filesystem::path& dir) {
  if (problems.failed("data.dataset")) return;
  const auto check = [&](std::string_view key, const std::string& as_written,
                         const std::string& path) {
    std::error_code ignored;
    if (path.empty() || problems.failed(key) || std::filesystem::exists(path, ignored)) return;
    const std::string absolute = std::filesystem::absolute(path).lexically_normal().string();
    std::string how;
    if (std::filesystem::path(as_written).is_relative()) {
      how = origins.overridden(key)
                ? fmt::format(" (given with --set: relative to the working directory, {})",
                              std::filesystem::current_path().string())
                : fmt::format(" (the config says '{}': relative to the config's directory, {})",
                              as_written,
                              absolute_directory(dir).string());
    }
    problems.add(origins.of(key), key, fmt::format("no such file: {}{}", absolute, how));
  };
  const DatasetKind kind = written.data.dataset;
  if (kind == DatasetKind::idx) {
    check("data.images", written.data.images, resolved.data.images);
    check("data.labels", written.data.labels, resolved.data.labels);
  } else if (kind != DatasetKind::synthetic && kind != DatasetKind::given) {
    check("data.path", written.data.path, resolved.data.path);
    check("data.eval_path", written.data.eval_path, resolved.data.eval_path);
    check("data.tokenizer", written.data.tokenizer, resolved.data.tokenizer);
  }
}

}  // namespace config_impl

void Config::validate() const {
  config_impl::Problems problems;
  config_impl::check_config(*this, config_impl::Origins(source), problems);
  problems.throw_if_any();
}

}  // namespace lockstep
