// The checks of a config's values: each key's rule again (Checker, for a Config filled by
// hand), then the rules that tie keys together, and the data files the dataset needs.
#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/problems.hpp"
#include "config/schema.hpp"
#include "lockstep/config.hpp"
#include "lockstep/model.hpp"
#include "model/lora_targets.hpp"

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

  void choice_list(std::string_view key, const std::vector<std::string>& values,
                   std::span<const std::string_view> choices, std::string_view) {
    for (const std::string& v : values)
      if (std::find(choices.begin(), choices.end(), v) == choices.end())
        reject(key, fmt::format("some of {}", fmt::join(choices, ", ")), v);
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

// What a rule that ties keys together needs: where each key was written, and the problems.
class Rules {
 public:
  Rules(const Origins& origins, Problems& problems) : origins_(origins), problems_(problems) {}

  void fail_at(std::string_view path, std::string_view what) const {
    problems_.add(origins_.of(path), path, what);
  }
  // None of `paths` failed to read (Note [Every config error at once]).
  bool readable(std::initializer_list<std::string_view> paths) const {
    return std::none_of(paths.begin(), paths.end(),
                        [&](std::string_view p) { return problems_.failed(p); });
  }
  // "trainer.steps (20, set at --set trainer.steps=20)": the other key of a rule, which may
  // have been written somewhere else than the key the message is about.
  template <class V>
  std::string other(std::string_view path, const V& value) const {
    const Place* at = origins_.written(path);
    return at ? fmt::format("{} ({}, set at {})", path, value, at->text)
              : fmt::format("{} ({})", path, value);
  }

 private:
  const Origins& origins_;
  Problems& problems_;
};

// The decoder's parts (Note [One decoder] in src/model/decoder.cpp): GPT-2's set or the Llama
// family's, each key checked against the set it belongs to.
void check_decoder(const ModelConfig& m, const Rules& r) {
  if (!r.readable({"model.family", "model.norm", "model.positions", "model.mlp",
                   "model.n_head", "model.d_model"}))
    return;
  const bool gpt2 = m.norm == NormKind::layernorm && m.positions == PositionKind::learned &&
                    m.mlp == MlpKind::gelu;
  const bool llama = m.norm == NormKind::rmsnorm && m.positions == PositionKind::rope &&
                     m.mlp == MlpKind::swiglu;
  if (!gpt2 && !llama) {
    r.fail_at("model.norm",
              fmt::format("{} with {} and {}: the decoder is built with GPT-2's parts "
                          "(layernorm, learned, gelu) or the Llama family's (rmsnorm, rope, "
                          "swiglu); other mixes are not implemented",
                          to_string(m.norm), r.other("model.positions", to_string(m.positions)),
                          r.other("model.mlp", to_string(m.mlp))));
    return;
  }
  // A key of the other set, written by the user: GPT-2's parts have no choice of it.
  const auto refuse_unless = [&](bool fits, std::string_view path, std::string_view why) {
    if (!fits && r.readable({path}))
      r.fail_at(path, fmt::format("{} (model.norm {}, model.positions {}, model.mlp {})", why,
                                  to_string(m.norm), to_string(m.positions),
                                  to_string(m.mlp)));
  };
  const int heads = m.n_head;
  const int head_dim = m.head_dim > 0 ? m.head_dim : (heads > 0 ? m.d_model / heads : 0);
  if (gpt2) {
    refuse_unless(m.norm_eps == 1e-5, "model.norm_eps",
                  "applies to rmsnorm: layernorm's epsilon is 1e-5, GPT-2's");
    // By value, not by whether it was written: `config --print` writes every key.
    refuse_unless(m.rope_theta == ModelConfig{}.rope_theta, "model.rope_theta",
                  "applies to model.positions rope");
    refuse_unless(m.rope_scaling.type == RopeScalingKind::none, "model.rope_scaling.type",
                  "applies to model.positions rope");
    refuse_unless(m.intermediate_size == 0 || m.intermediate_size == 4 * m.d_model,
                  "model.intermediate_size",
                  "applies to model.mlp swiglu: gelu's hidden width is 4 x d_model");
    refuse_unless(m.n_kv_head == 0 || m.n_kv_head == heads, "model.n_kv_head",
                  "grouped-query attention is built for the Llama family's parts");
    refuse_unless(m.head_dim == 0 || m.head_dim * heads == m.d_model, "model.head_dim",
                  "GPT-2's parts have d_model / n_head channels per head");
    refuse_unless(m.qkv_bias && m.proj_bias, m.qkv_bias ? "model.proj_bias" : "model.qkv_bias",
                  "GPT-2's parts have every bias");
    refuse_unless(m.tie_embeddings, "model.tie_embeddings",
                  "GPT-2's parts tie the LM head to the token embedding");
    return;
  }
  if (r.readable({"model.n_kv_head"}) && m.n_kv_head > 0 && heads % m.n_kv_head != 0)
    r.fail_at("model.n_kv_head", fmt::format("must divide {}, got {}",
                                             r.other("model.n_head", heads), m.n_kv_head));
  if (r.readable({"model.head_dim"}) && head_dim % 2 != 0)
    r.fail_at(m.head_dim > 0 ? "model.head_dim" : "model.d_model",
              fmt::format("rope rotates pairs of channels: the head size must be even, got {}",
                          head_dim));
  const RopeScalingConfig& s = m.rope_scaling;
  if (s.type == RopeScalingKind::llama3 &&
      r.readable({"model.rope_scaling.low_freq_factor", "model.rope_scaling.high_freq_factor"}) &&
      !(s.high_freq_factor > s.low_freq_factor))
    r.fail_at("model.rope_scaling.high_freq_factor",
              fmt::format("must be > {}, got {}",
                          r.other("model.rope_scaling.low_freq_factor", s.low_freq_factor),
                          s.high_freq_factor));
}

// model.lora (Note [LoRA] in src/model/lora.cpp): LoRA on a decoder's blocks, the Llama
// family's and GPT-2's, in any precision (under bf16 the base is held in bf16 only: Note
// [Frozen parameters]); targets by the family's PEFT module names.
void check_lora(const Config& c, const Rules& r) {
  const ModelConfig& m = c.model;
  if (!r.readable({"model.lora.rank"}) || m.lora.rank == 0) return;
  if (!r.readable({"model.type", "model.norm"})) return;
  if (m.type != "gpt")
    r.fail_at("model.lora.rank",
              fmt::format("LoRA is built for the decoders (model.type gpt), not {}: the mlp's "
                          "layers have no adapters",
                          r.other("model.type", m.type)));
  const bool gpt2 = m.norm != NormKind::rmsnorm;
  if (r.readable({"model.lora.targets"})) {
    try {
      (void)detail::parse_lora_targets(m.lora.targets, gpt2);
    } catch (const std::invalid_argument& e) {
      r.fail_at("model.lora.targets", e.what());
    }
  }
}

}  // namespace

void check_config(const Config& c, const Origins& origins, Problems& problems) {
  Checker checker(origins, problems);
  visit_schema(checker, c);

  const Rules rules{origins, problems};
  const auto fail_at = [&](std::string_view path, std::string_view what) {
    rules.fail_at(path, what);
  };
  const auto readable = [&](std::initializer_list<std::string_view> paths) {
    return rules.readable(paths);
  };
  const auto other = [&](std::string_view path, auto value) { return rules.other(path, value); };

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
  if (readable({"model.type", "model.d_model", "model.n_head", "model.head_dim"}) &&
      m.type == "gpt" && m.head_dim == 0 && m.d_model % m.n_head != 0)
    fail_at("model.n_head", fmt::format("must divide {}, got {}", other("model.d_model", m.d_model),
                                        m.n_head));
  if (m.type == "gpt") check_decoder(m, rules);
  check_lora(c, rules);
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
  const bool language =
      kind == DatasetKind::tokens || kind == DatasetKind::text || kind == DatasetKind::chat;
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
                 fmt::format("gpt needs data.dataset tokens, text or chat, got {}",
                             to_string(kind)));
  if (!c.data.tokenizer.empty() && !language)
    problems.add(origins.of("data.tokenizer"), "data.tokenizer",
                 fmt::format("a key of tokens and text data, got data.dataset {}",
                             to_string(kind)));
  if (c.data.tokenizer_family != DataConfig{}.tokenizer_family && c.data.tokenizer.empty())
    problems.add(origins.of("data.tokenizer_family"), "data.tokenizer_family",
                 "says how to read data.tokenizer, which is not set");
  if (kind == DatasetKind::chat && c.data.tokenizer.empty())
    problems.add(written_or_dataset("data.tokenizer"), "data.tokenizer",
                 "required when data.dataset is chat: conversations are tokenised with the "
                 "model's tokenizer, its special tokens included");
  // The chat keys away from their defaults (a printed config lists them at their defaults).
  const DataConfig defaults;
  const std::pair<const char*, bool> chat_keys[] = {
      {"data.template", c.data.chat_template != defaults.chat_template},
      {"data.train_on", c.data.train_on != defaults.train_on},
      {"data.pack", c.data.pack},
      {"data.skip_bad_records", c.data.skip_bad_records}};
  if (kind != DatasetKind::chat)
    for (const auto& [key, set] : chat_keys)
      if (set)
        problems.add(origins.of(key), key,
                     fmt::format("a key of chat data, got data.dataset {}", to_string(kind)));
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
