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
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "common/fnv1a.hpp"
#include "io/file_roles.hpp"
#include "io/open_input.hpp"
#include "lockstep/config.hpp"

namespace lockstep {
namespace {

// ---- Enum spellings -------------------------------------------------------------------------

template <class E>
struct Spelling {
  E value;
  std::string_view name;
};

constexpr Spelling<Activation> kActivations[] = {
    {Activation::relu, "relu"}, {Activation::gelu, "gelu"}, {Activation::tanh, "tanh"}};
constexpr Spelling<DatasetKind> kDatasetKinds[] = {{DatasetKind::csv, "csv"},
                                                   {DatasetKind::idx, "idx"},
                                                   {DatasetKind::synthetic, "synthetic"},
                                                   {DatasetKind::tokens, "tokens"},
                                                   {DatasetKind::text, "text"},
                                                   {DatasetKind::given, "given"}};
constexpr Spelling<TokenFormat> kTokenFormats[] = {
    {TokenFormat::automatic, "auto"}, {TokenFormat::llmc, "llmc"}, {TokenFormat::raw, "raw"}};
constexpr Spelling<OptimizerKind> kOptimizerKinds[] = {{OptimizerKind::sgd, "sgd"},
                                                       {OptimizerKind::adamw, "adamw"}};
constexpr Spelling<ScheduleKind> kScheduleKinds[] = {
    {ScheduleKind::constant, "constant"}, {ScheduleKind::warmup_cosine, "warmup_cosine"}};
constexpr Spelling<BackendKind> kBackendKinds[] = {
    {BackendKind::automatic, "auto"}, {BackendKind::cpu, "cpu"}, {BackendKind::cuda, "cuda"}};

constexpr Spelling<CommKind> kCommKinds[] = {
    {CommKind::automatic, "auto"}, {CommKind::nccl, "nccl"}, {CommKind::peer, "peer"}};

constexpr Spelling<NonfinitePolicy> kNonfinitePolicies[] = {
    {NonfinitePolicy::stop, "stop"}, {NonfinitePolicy::skip, "skip"}};

constexpr Spelling<WorkerFailurePolicy> kWorkerFailurePolicies[] = {
    {WorkerFailurePolicy::stop, "stop"}, {WorkerFailurePolicy::shrink, "shrink"}};

constexpr Spelling<Precision> kPrecisions[] = {
    {Precision::fp32, "fp32"}, {Precision::tf32, "tf32"}, {Precision::bf16, "bf16"}};

constexpr Spelling<ReduceDtype> kReduceDtypes[] = {{ReduceDtype::fp32, "fp32"},
                                                   {ReduceDtype::bf16, "bf16"}};

constexpr Spelling<AttentionKind> kAttentionKinds[] = {{AttentionKind::automatic, "auto"},
                                                       {AttentionKind::fused, "fused"},
                                                       {AttentionKind::materialized,
                                                        "materialized"}};

constexpr Spelling<GraphMode> kGraphModes[] = {
    {GraphMode::automatic, "auto"}, {GraphMode::on, "on"}, {GraphMode::off, "off"}};

constexpr std::string_view kModelTypes[] = {"mlp", "gpt"};

template <class Table, class E>
const std::string_view* find_name(const Table& table, E value) {
  for (const auto& s : table)
    if (s.value == value) return &s.name;
  return nullptr;  // only for a value cast from an integer outside the enum
}

template <class Table, class E>
std::string_view spelling(const Table& table, E value) {
  const std::string_view* name = find_name(table, value);
  return name ? *name : "invalid";
}

template <class Table>
std::string join_names(const Table& table) {
  std::string out;
  for (const auto& s : table) out += (out.empty() ? "" : ", ") + std::string(s.name);
  return out;
}

// ---- Rules ----------------------------------------------------------------------------------

// The bounds of an integer key. Without `max`, the upper bound is that of the C++ member's type.
constexpr std::int64_t kNoMax = std::numeric_limits<std::int64_t>::max();
struct IntRule {
  std::int64_t min = std::numeric_limits<std::int64_t>::min();
  // trainer.steps and trainer.epochs: 0 in a Config means "not set" (null in YAML).
  bool zero_means_unset = false;
  std::int64_t max = kNoMax;
};

std::string describe(IntRule rule) {
  if (rule.max == rule.min + 1) return fmt::format("{} or {}", rule.min, rule.max);
  if (rule.max != kNoMax)
    return fmt::format("an integer in [{}, {}]", rule.min, rule.max);
  if (rule.min == std::numeric_limits<std::int64_t>::min()) return "an integer";
  return fmt::format("an integer >= {}", rule.min);
}

struct NumberRule {
  double min;
  bool min_inclusive;
  double max_exclusive;  // +inf when unbounded (infinities are rejected anyway)
  std::string_view description;
};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr NumberRule kPositive{0.0, false, kInf, "a number > 0"};
constexpr NumberRule kNonNegative{0.0, true, kInf, "a number >= 0"};
constexpr NumberRule kFraction{0.0, true, 1.0, "a number in [0, 1)"};

// False for NaN, whose comparisons all fail.
bool satisfies(double x, const NumberRule& rule) {
  return (rule.min_inclusive ? x >= rule.min : x > rule.min) && x < rule.max_exclusive;
}

// Keys an earlier version read, with what replaced them: a config that still says one is told
// the new spelling rather than "unknown key".
struct ReplacedKey {
  std::string_view path;
  std::string_view message;
};
constexpr ReplacedKey kReplacedKeys[] = {
    {"trainer.tf32", "replaced by trainer.precision (fp32, tf32 or bf16): 'tf32: true' is now "
                     "'precision: tf32', 'tf32: false' is 'precision: fp32'"},
};

// "devices: 100000" is surely a typo; refuse it before allocating a worker list for it.
constexpr int kMaxDevices = 1024;

// ---- The schema -----------------------------------------------------------------------------

// Every section and key, in the order of config.hpp, each with one line for
// `lockstep train --help`. C is Config or const Config.
template <class Visitor, class C>
void visit_schema(Visitor& v, C& c) {
  v.section("model");
  v.choice("type", c.model.type, kModelTypes,
           "the architecture: mlp for csv, idx and synthetic data, gpt for tokens and text");
  v.integer_list("hidden", c.model.hidden, IntRule{.min = 1},
                 "mlp: hidden layer widths; input and output sizes come from the data");
  v.enumeration("activation", c.model.activation, kActivations,
                "mlp: between the Linear layers (gelu is the tanh approximation)");
  v.integer("vocab_size", c.model.vocab_size, IntRule{.min = 0},
            "gpt: token ids are below it; 0: 256 for text, required for tokens (GPT-2: 50257)");
  v.integer("context", c.model.context, IntRule{.min = 1}, "gpt: tokens per sample");
  v.integer("n_layer", c.model.n_layer, IntRule{.min = 1}, "gpt: transformer blocks");
  v.integer("n_head", c.model.n_head, IntRule{.min = 1},
            "gpt: attention heads; divides model.d_model");
  v.integer("d_model", c.model.d_model, IntRule{.min = 1}, "gpt: width of the residual stream");
  v.enumeration("attention", c.model.attention, kAttentionKinds,
                "gpt: fused (tiled, no (T, T) matrices), materialized, or auto: the faster here");

  v.section("data");
  v.enumeration("dataset", c.data.dataset, kDatasetKinds,
                "where the samples come from (given: the program passes them to the Trainer)");
  v.path("path", c.data.path, "csv, tokens, text: the data file");
  v.enumeration("format", c.data.format, kTokenFormats,
                "tokens: llm.c .bin with its header, headerless uint16, or auto: by the header");
  v.path("eval_path", c.data.eval_path,
         "tokens, text: a separate eval file instead of the held-out tail");
  v.path("tokenizer", c.data.tokenizer,
         "tokens, text: the BPE tokenizer (lockstep tokenize's); text is tokenised at load");
  v.integer("label_column", c.data.label_column, IntRule{},
            "csv: the column of the class; negative counts from the end");
  v.flag("header", c.data.header, "csv: skip the first line");
  v.path("images", c.data.images, "idx: the images file (train-images-idx3-ubyte, ...)");
  v.path("labels", c.data.labels, "idx: the labels file");
  v.integer("samples", c.data.samples, IntRule{.min = 1}, "synthetic: number of samples");
  v.integer("features", c.data.features, IntRule{.min = 1}, "synthetic: features per sample");
  v.integer("classes", c.data.classes, IntRule{.min = 2}, "synthetic: number of classes");
  v.number("eval_fraction", c.data.eval_fraction, kFraction,
           "share of the samples held out for eval (tokens, text: the stream's tail)");
  v.integer("batch_size", c.data.batch_size, IntRule{.min = 1},
            "samples per device and step; the global batch is batch_size x devices");
  v.flag("shuffle", c.data.shuffle, "reshuffle every epoch (seed + epoch)");
  v.flag("drop_last", c.data.drop_last, "drop the tail instead of padding shards by wrap-around");
  v.flag("normalize", c.data.normalize,
         "standardise features with the train split's statistics (not tokens and text)");
  v.integer("prefetch", c.data.prefetch, IntRule{.min = 0},
            "batches each worker's loader thread assembles ahead; 0: no loader thread");

  v.section("optimizer");
  v.enumeration("type", c.optimizer.type, kOptimizerKinds, "the optimiser");
  v.number("lr", c.optimizer.lr, kPositive, "peak learning rate");
  v.number("momentum", c.optimizer.momentum, kFraction, "sgd: momentum");
  v.flag("nesterov", c.optimizer.nesterov, "sgd: Nesterov momentum; needs momentum > 0");
  v.number("weight_decay", c.optimizer.weight_decay, kNonNegative,
           "sgd: L2 added to the gradient; adamw: decoupled; matrices only unless decay_all");
  v.flag("decay_all", c.optimizer.decay_all,
         "weight_decay on every tensor, biases and LayerNorms too");
  v.number("beta1", c.optimizer.beta1, kFraction, "adamw: first-moment decay");
  v.number("beta2", c.optimizer.beta2, kFraction, "adamw: second-moment decay");
  v.number_pair("betas", "beta1", c.optimizer.beta1, "beta2", c.optimizer.beta2, kFraction,
                "adamw: [beta1, beta2] in one key, instead of both");
  v.number("eps", c.optimizer.eps, kPositive, "adamw: added to the second moment's root");
  v.number("clip_grad_norm", c.optimizer.clip_grad_norm, kNonNegative,
           "clip the averaged gradient to this global norm; 0: off");

  v.section("schedule");
  v.enumeration("type", c.schedule.type, kScheduleKinds, "the learning rate over the steps");
  v.integer("warmup_steps", c.schedule.warmup_steps, IntRule{.min = 0},
            "warmup_cosine: linear ramp to lr, then cosine decay to min_lr at the last step");
  v.number("min_lr", c.schedule.min_lr, kNonNegative, "warmup_cosine: floor of the decay");

  v.section("trainer");
  v.enumeration("backend", c.trainer.backend, kBackendKinds,
                "auto: cuda when a GPU is usable, else cpu");
  v.devices("devices", c.trainer.devices,
            "4 means ids [0, 1, 2, 3]; on the CPU each is a worker thread (lockstep devices)");
  v.integer("steps", c.trainer.steps, IntRule{.min = 1, .zero_means_unset = true},
            "optimiser steps of the run; set this or trainer.epochs");
  v.integer("epochs", c.trainer.epochs, IntRule{.min = 1, .zero_means_unset = true},
            "passes over the training split; set this or trainer.steps");
  v.integer("seed", c.trainer.seed, IntRule{.min = 0},
            "seeds the weights, shuffles, split and synthetic data");
  v.integer("log_every", c.trainer.log_every, IntRule{.min = 1}, "steps between log lines");
  v.integer("eval_every", c.trainer.eval_every, IntRule{.min = 0},
            "steps between evals; 0: at the end only (always at the end)");
  v.integer("check_replicas_every", c.trainer.check_replicas_every, IntRule{.min = 0},
            "steps between replica hash checks; 0: at the end only");
  v.integer("threads_per_device", c.trainer.threads_per_device, IntRule{.min = 0},
            "cpu: threads of each worker; 0: hardware threads / workers");
  v.enumeration("comm", c.trainer.comm, kCommKinds,
                "cuda: nccl, or peer (one process; chosen when ids repeat)");
  v.enumeration("precision", c.trainer.precision, kPrecisions,
                "tf32: cuda TF32 GEMMs; bf16: bf16 products, fp32 master weights");
  v.number("bucket_cap_mb", c.trainer.bucket_cap_mb, kPositive,
           "gradient bucket size; the first bucket is capped at 1 MB");
  v.flag("overlap", c.trainer.overlap, "all-reduce each bucket as soon as backward fills it");
  v.enumeration("grad_reduce_dtype", c.trainer.grad_reduce_dtype, kReduceDtypes,
                "bf16: buckets rounded to bf16 for the all-reduce");
  v.integer("accumulate_steps", c.trainer.accumulate_steps, IntRule{.min = 1},
            "micro-batches per optimiser step; all-reduce after the last");
  v.integer("zero", c.trainer.zero, IntRule{.min = 0, .max = 1},
            "1: ZeRO-1, each worker keeps its shard of the optimiser state");
  v.enumeration("cuda_graphs", c.trainer.cuda_graphs, kGraphModes,
                "cuda: replay each micro-batch as graphs; auto: where that measured faster");
  v.path("trace", c.trainer.trace, "write a Chrome trace-event JSON of every worker here");
  v.path("report", c.trainer.report, "write an HTML report of the run here");
  v.path("metrics", c.trainer.metrics, "append JSON lines, one per logged step and eval, here");
  v.enumeration("on_nonfinite", c.trainer.on_nonfinite, kNonfinitePolicies,
                "a NaN/Inf loss or gradient norm: stop the run, or skip the update");
  v.integer("max_nonfinite_skips", c.trainer.max_nonfinite_skips, IntRule{.min = 1},
            "skip: stop after this many skipped steps in a row");
  v.number("step_timeout_s", c.trainer.step_timeout_s, kNonNegative,
           "stop the run when no worker progresses this long; 0: off");
  v.number("stop_grace_s", c.trainer.stop_grace_s, kPositive,
           "after a stop, wait this long for the workers, then report and leave them");
  v.enumeration("on_worker_failure", c.trainer.on_worker_failure, kWorkerFailurePolicies,
                "a lost device: stop the run, or shrink: go on with the other workers");
  v.integer("min_workers", c.trainer.min_workers, IntRule{.min = 1},
            "shrink: stop instead once fewer workers than this are left");
  v.flag("keep_global_batch", c.trainer.keep_global_batch,
         "shrink: raise accumulate_steps to keep the global batch, where it divides");
  v.integer("snapshot_every", c.trainer.snapshot_every, IntRule{.min = 0},
            "steps between in-memory copies of the state a shrink can go on from; 0: none");
  v.nested("checkpoint");

  v.section("trainer.checkpoint");
  v.path("dir", c.trainer.checkpoint.dir, "where checkpoints go; unset: no checkpoints");
  v.integer("every_steps", c.trainer.checkpoint.every_steps, IntRule{.min = 0},
            "steps between checkpoints; 0: at the end only (and on SIGINT/SIGTERM)");
  v.integer("keep_last", c.trainer.checkpoint.keep_last, IntRule{.min = 1},
            "checkpoints kept; older ones go once a newer one is complete");
  v.flag("overwrite", c.trainer.checkpoint.overwrite,
         "a new run may replace the checkpoints already in dir; false: it refuses to start");
}

struct SectionKeys {
  std::string_view name;
  std::vector<std::string_view> keys;
};

// Learns the section and key names from visit_schema().
class KeyCollector {
 public:
  void section(std::string_view name) { sections_.push_back({name, {}}); }
  template <class... Rest> void integer(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void number(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void flag(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void text(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void path(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void choice(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void enumeration(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void integer_list(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void devices(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void number_pair(std::string_view key, Rest&&...) { add(key); }
  void nested(std::string_view key) { add(key); }

  std::vector<SectionKeys> take() && { return std::move(sections_); }

 private:
  void add(std::string_view key) { sections_.back().keys.push_back(key); }
  std::vector<SectionKeys> sections_;
};

const std::vector<SectionKeys>& schema() {
  static const std::vector<SectionKeys> sections = [] {
    KeyCollector collector;
    Config unused;
    visit_schema(collector, unused);
    return std::move(collector).take();
  }();
  return sections;
}

// ---- Messages -------------------------------------------------------------------------------

// Where a message points: "FILE:LINE:COL", "--set KEY=VALUE", or the file alone. `order` puts
// messages in reading order: the file's lines, then the overrides as given, then the file as a
// whole (a missing key has no line).
struct Place {
  std::string text;
  std::array<std::size_t, 3> order{2, 0, 0};
};

// yaml-cpp counts lines and columns from 0; editors count from 1.
Place mark_place(std::string_view source, const YAML::Mark& mark) {
  if (mark.is_null()) return {std::string(source)};
  return {fmt::format("{}:{}:{}", source, mark.line + 1, mark.column + 1),
          {0, static_cast<std::size_t>(mark.line), static_cast<std::size_t>(mark.column)}};
}

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

[[noreturn]] void fail(const Place& where, std::string_view path, std::string_view what) {
  throw Rejected{where, std::string(path), std::string(what)};
}

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

const SectionKeys* find_section(std::string_view name) {
  const auto it = std::find_if(schema().begin(), schema().end(),
                               [&](const SectionKeys& s) { return s.name == name; });
  return it == schema().end() ? nullptr : &*it;
}

// The names a user can write in `section`, a nested section's as its leaves: trainer's
// "checkpoint" is "checkpoint.dir", "checkpoint.every_steps", "checkpoint.keep_last".
std::vector<std::string> leaf_names(std::string_view section) {
  std::vector<std::string> names;
  for (const std::string_view key : find_section(section)->keys) {
    const SectionKeys* nested = find_section(fmt::format("{}.{}", section, key));
    if (!nested) names.emplace_back(key);
    for (const std::string_view leaf : nested ? nested->keys : std::vector<std::string_view>{})
      names.push_back(fmt::format("{}.{}", key, leaf));
  }
  return names;
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

// The top-level sections; "trainer.checkpoint" is a map inside "trainer".
std::vector<std::string_view> section_names() {
  std::vector<std::string_view> names;
  for (const SectionKeys& s : schema())
    if (s.name.find('.') == std::string_view::npos) names.push_back(s.name);
  return names;
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

// ---- Origins --------------------------------------------------------------------------------

// True when `path` is `parent` or lies below it ("a.b" and "a.b[0]" lie below "a").
bool is_within(std::string_view path, std::string_view parent) {
  if (!path.starts_with(parent)) return false;
  return path.size() == parent.size() || path[parent.size()] == '.' || path[parent.size()] == '[';
}

bool Problems::failed(std::string_view path) const {
  return std::any_of(failed_.begin(), failed_.end(), [&](const std::string& f) {
    return is_within(path, f) || is_within(f, path);
  });
}

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
  template <class... Any> void devices(Any&&...) {}
  template <class... Any> void number_pair(Any&&...) {}
  template <class... Any> void nested(Any&&...) {}

 private:
  const Origins& origins_;
  std::filesystem::path dir_;
  std::string section_;
};

// ---- Hasher ---------------------------------------------------------------------------------

// Lists every key as "section.key" and its value, as `lockstep train` would print it, and renders
// the keys that change the math of training as "section.key=value" lines, for config_hash().
// Left out of the hash are data.prefetch, model.attention and every trainer key but trainer.seed:
// they say how fast, where and for how long to train, and a resumed run may change them
// (model.attention, like trainer.precision, changes how the same function is computed, not
// which). A key added to the schema is hashed unless it is listed here.
class Hasher {
 public:
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
  void devices(std::string_view key, const std::vector<int>& ids, std::string_view) {
    add(key, fmt::format("[{}]", fmt::join(ids, ",")));
  }
  // betas is listed as beta1 and beta2.
  void number_pair(std::string_view, std::string_view, double, std::string_view, double,
                   const NumberRule&, std::string_view) {}
  void nested(std::string_view) {}

  const std::string& rendering() const { return rendering_; }
  const ConfigValues& values() const { return values_; }

 private:
  void add(std::string_view key, std::string_view hashed) { add(key, hashed, hashed); }
  void add(std::string_view key, std::string_view hashed, std::string_view shown) {
    values_.emplace_back(fmt::format("{}.{}", section_, key), std::string(shown));
    const bool run_setting = section_.starts_with("trainer")
                                 ? key != "seed"
                                 : (section_ == "data" && key == "prefetch") ||
                                       (section_ == "model" && key == "attention");
    if (!run_setting) rendering_ += fmt::format("{}.{}={}\n", section_, key, hashed);
  }

  std::string section_;
  std::string rendering_;
  ConfigValues values_;
};

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

// Every value, then the rules that tie keys together; a rule only when none of its keys failed
// to read (Note [Every config error at once]).
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
      t.grad_reduce_dtype == ReduceDtype::bf16 && t.zero == 1)
    fail_at("trainer.grad_reduce_dtype",
            fmt::format("bf16 with {} is not implemented yet; use fp32 with ZeRO-1",
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

// The files data.dataset needs. Checked when a config is read, not by Config::validate(): an
// embedder who hands the Trainer its own datasets never sets them. Nothing is checked when the
// model or the dataset failed to read.
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

// A data file the dataset needs that is not there, named by its key with how its path was
// resolved (Note [Config paths]): a problem found before any data is read, with the others.
// `dir` absolute, without the trailing separator that "." would leave ("/home/me/run/").
std::filesystem::path absolute_directory(const std::filesystem::path& dir) {
  const std::filesystem::path out = std::filesystem::absolute(dir).lexically_normal();
  return out.has_filename() || !out.has_relative_path() ? out : out.parent_path();
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

}  // namespace

std::string_view to_string(Activation v) { return spelling(kActivations, v); }
std::string_view to_string(DatasetKind v) { return spelling(kDatasetKinds, v); }

std::optional<BackendKind> backend_kind(std::string_view name) {
  for (const auto& s : kBackendKinds)
    if (s.name == name) return s.value;
  return std::nullopt;
}
std::string_view to_string(TokenFormat v) { return spelling(kTokenFormats, v); }
std::string_view to_string(OptimizerKind v) { return spelling(kOptimizerKinds, v); }
std::string_view to_string(ScheduleKind v) { return spelling(kScheduleKinds, v); }
std::string_view to_string(BackendKind v) { return spelling(kBackendKinds, v); }
std::string_view to_string(CommKind v) { return spelling(kCommKinds, v); }
std::string_view to_string(NonfinitePolicy v) { return spelling(kNonfinitePolicies, v); }
std::string_view to_string(WorkerFailurePolicy v) { return spelling(kWorkerFailurePolicies, v); }
std::string_view to_string(Precision v) { return spelling(kPrecisions, v); }
std::string_view to_string(ReduceDtype v) { return spelling(kReduceDtypes, v); }
std::string_view to_string(GraphMode v) { return spelling(kGraphModes, v); }
std::string_view to_string(AttentionKind v) { return spelling(kAttentionKinds, v); }

void Config::validate() const {
  Problems problems;
  check_config(*this, Origins(source), problems);
  problems.throw_if_any();
}

std::uint64_t config_hash(const Config& config) {
  Hasher hasher;
  visit_schema(hasher, config);
  return detail::fnv1a64(hasher.rendering().data(), hasher.rendering().size());
}

ConfigValues config_values(const Config& config) {
  Hasher hasher;
  visit_schema(hasher, config);
  return hasher.values();
}

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

namespace {

// `dir`: the config file's directory, against which its relative paths are resolved; empty
// for text that came from no file (Note [Config paths]).
Config parse_config_in(std::string_view yaml, std::string_view source,
                       std::span<const std::string> overrides, const std::filesystem::path* dir,
                       const ConfigDefaults* defaults = nullptr) {
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

  Config config;
  config.source = source;
  Parser parser(root, origins, problems);
  visit_schema(parser, config);
  config.set_at = origins.set_by_user();
  if (dir) {
    const Config written = config;
    PathResolver resolver(origins, *dir);
    visit_schema(resolver, config);
    check_data_files(written, config, origins, problems, *dir);
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

}  // namespace lockstep
