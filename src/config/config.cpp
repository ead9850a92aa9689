// The YAML config loader: parse, apply "--set" overrides, check every value, then the
// cross-field rules.
//
// The schema is written once, in visit_schema(), as sections of typed keys with their rules.
// Three visitors walk it:
//   KeyCollector - learns the valid names, to reject unknown keys with a suggestion;
//   Parser       - reads a YAML tree into a Config, checking type and range of each value;
//   Checker      - re-checks a Config's values, so that Config::validate() also catches a
//                  bad value in a Config filled by hand.
//
// Messages start with where the problem is: "FILE:LINE:COL" for what the file says,
// "--set KEY=VALUE" for what an override says. Overrides are applied to the YAML tree before
// it is read, so both pass through the same checks; Origins tells them apart by key path.
//
// A null value ("steps:", "steps: ~", "--set trainer.steps=null") keeps the default. That is
// how an override unsets a key, e.g. trainer.epochs when switching a file to trainer.steps.
#include <algorithm>
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
                                                   {DatasetKind::text, "text"}};
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

// Every section and key, in the order of config.hpp. C is Config or const Config.
template <class Visitor, class C>
void visit_schema(Visitor& v, C& c) {
  v.section("model");
  v.choice("type", c.model.type, kModelTypes);
  v.integer_list("hidden", c.model.hidden, IntRule{.min = 1});
  v.enumeration("activation", c.model.activation, kActivations);
  v.integer("vocab_size", c.model.vocab_size, IntRule{.min = 0});
  v.integer("context", c.model.context, IntRule{.min = 1});
  v.integer("n_layer", c.model.n_layer, IntRule{.min = 1});
  v.integer("n_head", c.model.n_head, IntRule{.min = 1});
  v.integer("d_model", c.model.d_model, IntRule{.min = 1});
  v.enumeration("attention", c.model.attention, kAttentionKinds);

  v.section("data");
  v.enumeration("dataset", c.data.dataset, kDatasetKinds);
  v.path("path", c.data.path);
  v.enumeration("format", c.data.format, kTokenFormats);
  v.path("eval_path", c.data.eval_path);
  v.integer("label_column", c.data.label_column, IntRule{});
  v.flag("header", c.data.header);
  v.path("images", c.data.images);
  v.path("labels", c.data.labels);
  v.integer("samples", c.data.samples, IntRule{.min = 1});
  v.integer("features", c.data.features, IntRule{.min = 1});
  v.integer("classes", c.data.classes, IntRule{.min = 2});
  v.number("eval_fraction", c.data.eval_fraction, kFraction);
  v.integer("batch_size", c.data.batch_size, IntRule{.min = 1});
  v.flag("shuffle", c.data.shuffle);
  v.flag("drop_last", c.data.drop_last);
  v.flag("normalize", c.data.normalize);
  v.integer("prefetch", c.data.prefetch, IntRule{.min = 0});

  v.section("optimizer");
  v.enumeration("type", c.optimizer.type, kOptimizerKinds);
  v.number("lr", c.optimizer.lr, kPositive);
  v.number("momentum", c.optimizer.momentum, kFraction);
  v.flag("nesterov", c.optimizer.nesterov);
  v.number("weight_decay", c.optimizer.weight_decay, kNonNegative);
  v.flag("decay_all", c.optimizer.decay_all);
  v.number("beta1", c.optimizer.beta1, kFraction);
  v.number("beta2", c.optimizer.beta2, kFraction);
  v.number_pair("betas", "beta1", c.optimizer.beta1, "beta2", c.optimizer.beta2, kFraction);
  v.number("eps", c.optimizer.eps, kPositive);
  v.number("clip_grad_norm", c.optimizer.clip_grad_norm, kNonNegative);

  v.section("schedule");
  v.enumeration("type", c.schedule.type, kScheduleKinds);
  v.integer("warmup_steps", c.schedule.warmup_steps, IntRule{.min = 0});
  v.number("min_lr", c.schedule.min_lr, kNonNegative);

  v.section("trainer");
  v.enumeration("backend", c.trainer.backend, kBackendKinds);
  v.devices("devices", c.trainer.devices);
  v.integer("steps", c.trainer.steps, IntRule{.min = 1, .zero_means_unset = true});
  v.integer("epochs", c.trainer.epochs, IntRule{.min = 1, .zero_means_unset = true});
  v.integer("seed", c.trainer.seed, IntRule{.min = 0});
  v.integer("log_every", c.trainer.log_every, IntRule{.min = 1});
  v.integer("eval_every", c.trainer.eval_every, IntRule{.min = 0});
  v.integer("check_replicas_every", c.trainer.check_replicas_every, IntRule{.min = 0});
  v.integer("threads_per_device", c.trainer.threads_per_device, IntRule{.min = 0});
  v.enumeration("comm", c.trainer.comm, kCommKinds);
  v.enumeration("precision", c.trainer.precision, kPrecisions);
  v.number("bucket_cap_mb", c.trainer.bucket_cap_mb, kPositive);
  v.flag("overlap", c.trainer.overlap);
  v.enumeration("grad_reduce_dtype", c.trainer.grad_reduce_dtype, kReduceDtypes);
  v.integer("accumulate_steps", c.trainer.accumulate_steps, IntRule{.min = 1});
  v.integer("zero", c.trainer.zero, IntRule{.min = 0, .max = 1});
  v.path("trace", c.trainer.trace);
  v.path("report", c.trainer.report);
  v.path("metrics", c.trainer.metrics);
  v.enumeration("on_nonfinite", c.trainer.on_nonfinite, kNonfinitePolicies);
  v.integer("max_nonfinite_skips", c.trainer.max_nonfinite_skips, IntRule{.min = 1});
  v.number("step_timeout_s", c.trainer.step_timeout_s, kNonNegative);
  v.number("stop_grace_s", c.trainer.stop_grace_s, kPositive);
  v.enumeration("on_worker_failure", c.trainer.on_worker_failure, kWorkerFailurePolicies);
  v.integer("min_workers", c.trainer.min_workers, IntRule{.min = 1});
  v.flag("keep_global_batch", c.trainer.keep_global_batch);
  v.integer("snapshot_every", c.trainer.snapshot_every, IntRule{.min = 0});
  v.nested("checkpoint");

  v.section("trainer.checkpoint");
  v.path("dir", c.trainer.checkpoint.dir);
  v.integer("every_steps", c.trainer.checkpoint.every_steps, IntRule{.min = 0});
  v.integer("keep_last", c.trainer.checkpoint.keep_last, IntRule{.min = 1});
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

[[noreturn]] void fail(std::string_view where, std::string_view path, std::string_view what) {
  if (path.empty()) throw ConfigError(fmt::format("{}: {}", where, what));
  throw ConfigError(fmt::format("{}: {}: {}", where, path, what));
}

// yaml-cpp counts lines and columns from 0; editors count from 1.
std::string mark_location(std::string_view source, const YAML::Mark& mark) {
  if (mark.is_null()) return std::string(source);
  return fmt::format("{}:{}:{}", source, mark.line + 1, mark.column + 1);
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

// "unknown key; did you mean 'model.hidden'?", or the valid names when none is close.
// `kind` is "key" or "section"; `prefix` is prepended to the suggestion ("model.").
std::string unknown_name(std::string_view kind, std::string_view name,
                         const std::vector<std::string_view>& candidates, std::string_view prefix) {
  const std::string_view* best = nullptr;
  std::size_t best_distance = 0;
  for (const std::string_view& candidate : candidates) {
    const std::size_t distance = edit_distance(name, candidate);
    // One edit per three letters: "hiden" finds "hidden", "x" does not find "lr".
    const std::size_t close_enough = std::max<std::size_t>(1, candidate.size() / 3);
    if (distance <= close_enough && (!best || distance < best_distance)) {
      best = &candidate;
      best_distance = distance;
    }
  }
  if (best) return fmt::format("unknown {}; did you mean '{}{}'?", kind, prefix, *best);
  return fmt::format("unknown {}; valid {}s: {}", kind, kind, fmt::join(candidates, ", "));
}

// The top-level sections; "trainer.checkpoint" is a map inside "trainer".
std::vector<std::string_view> section_names() {
  std::vector<std::string_view> names;
  for (const SectionKeys& s : schema())
    if (s.name.find('.') == std::string_view::npos) names.push_back(s.name);
  return names;
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

// Where the keys of the merged tree came from, so that messages can point at them.
class Origins {
 public:
  explicit Origins(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }

  void add_override(std::string key, std::string text) {
    overrides_.push_back({std::move(key), std::move(text)});
  }

  // "--set KEY=VALUE" for a node that an override set, else "FILE:LINE:COL".
  std::string locate(std::string_view path, const YAML::Mark& mark) const {
    // The latest override that set this path or one of its parents wins.
    for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it)
      if (is_within(path, it->key)) return "--set " + it->text;
    if (!mark.is_null()) return mark_location(source_, mark);
    // Nodes without a mark were made by an override that set something below them.
    for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it)
      if (is_within(it->key, path)) return "--set " + it->text;
    return source_;
  }

  // Remembers where a key was written, for the cross-field checks after parsing.
  void remember(const std::string& path, std::string location) {
    written_.insert_or_assign(path, std::move(location));
  }

  std::optional<std::string_view> written(std::string_view path) const {
    const auto it = written_.find(path);
    if (it == written_.end()) return std::nullopt;
    return it->second;
  }

  // Where `path` was written, or just the source when that is not known.
  std::string_view of(std::string_view path) const { return written(path).value_or(source_); }

  // True when an override set `path` or a section above it.
  bool overridden(std::string_view path) const {
    return std::any_of(overrides_.begin(), overrides_.end(),
                       [&](const Override& o) { return is_within(path, o.key); });
  }

 private:
  struct Override {
    std::string key;   // "trainer.steps"
    std::string text;  // "trainer.steps=100"
  };
  std::string source_;
  std::vector<Override> overrides_;
  std::map<std::string, std::string, std::less<>> written_;
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

// Parses `yaml` into a map of sections; an empty document is an empty map.
//
// The documents are counted with YAML::Parser rather than YAML::LoadAll: on a token that cannot
// start a node ("," alone, "- 1\n,"), yaml-cpp 0.7 returns an empty document without consuming
// it, and LoadAll loops forever, allocating (yaml-cpp issue #1040). Here a document that starts
// where the previous one did is that stuck token, and an error.
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
        fail(mark_location(source, at), "",
             shown ? fmt::format("unexpected '{}': expected a YAML node", text[pos])
                   : std::string("unexpected token: expected a YAML node"));
      }
    }
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: {}", mark_location(source, e.mark), e.msg));
  }
  if (marks.documents.size() > 1)
    fail(mark_location(source, marks.documents[1].root), "",
         fmt::format("expected one YAML document, found {}", marks.documents.size()));
  if (!root.IsDefined() || root.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap())
    fail(mark_location(source, root.Mark()), "",
         fmt::format("expected a map of sections ({}), got {}", fmt::join(section_names(), ", "),
                     got(root)));
  return root;
}

// Sets "a.b.c=value" in the tree, making maps along the way. A scalar in the way is replaced
// by a map, so that its key then reports "expected ..., got a map".
void apply_override(YAML::Node& root, const std::string& text, Origins& origins) {
  const auto malformed = [&] {
    return ConfigError(fmt::format("--set {}: expected KEY=VALUE", text));
  };
  const std::size_t equals = text.find('=');
  if (equals == std::string::npos) throw malformed();
  const std::string key = text.substr(0, equals);

  std::vector<std::string> parts;
  for (std::size_t begin = 0;;) {
    const std::size_t dot = key.find('.', begin);
    parts.push_back(key.substr(begin, dot - begin));
    if (parts.back().empty()) throw malformed();
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }

  // The value is YAML too, so that "model.hidden=[32, 32]" gives a list.
  const YAML::Node value = [&] {
    try {
      return YAML::Load(text.substr(equals + 1));
    } catch (const YAML::Exception& e) {
      throw ConfigError(fmt::format("--set {}: {}: invalid YAML value: {}", text, key, e.msg));
    }
  }();

  YAML::Node node = root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node[parts[i]].IsMap()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
    node.reset(node[parts[i]]);  // rebinds the handle; `node = ...` would overwrite the map
  }
  node[parts.back()] = value;
  origins.add_override(key, text);
}

// ---- Parser ---------------------------------------------------------------------------------

// Reads a YAML tree into a Config, one visit_schema() key at a time. The constructor checks
// the names of every section and key first, in document order, so that a typo is reported
// before the values.
class Parser {
 public:
  Parser(const YAML::Node& root, Origins& origins) : origins_(origins) {
    for (const Entry& section : entries(root, "", section_names())) {
      if (section.value.IsNull()) continue;  // "model:" alone keeps every default
      if (!section.value.IsMap()) expected(section.name, section.value, "a map");
      const auto schema_section =
          std::find_if(schema().begin(), schema().end(),
                       [&](const SectionKeys& s) { return s.name == section.name; });
      sections_.emplace(section.name, entries(section.value, section.name, schema_section->keys));
    }
    // Nested sections ("trainer.checkpoint"): a key of the parent whose value is a map.
    for (const SectionKeys& nested : schema()) {
      const std::size_t dot = nested.name.find('.');
      if (dot == std::string_view::npos) continue;
      const auto parent = sections_.find(nested.name.substr(0, dot));
      if (parent == sections_.end()) continue;
      const Entry* entry = find(parent->second, nested.name.substr(dot + 1));
      if (!entry || entry->value.IsNull()) continue;
      if (!entry->value.IsMap()) expected(std::string(nested.name), entry->value, "a map");
      sections_.emplace(std::string(nested.name),
                        entries(entry->value, std::string(nested.name), nested.keys));
    }
  }

  void section(std::string_view name) {
    section_ = name;
    const auto it = sections_.find(name);
    current_ = it == sections_.end() ? &no_entries_ : &it->second;
  }

  template <class T>
  void integer(std::string_view key, T& out, IntRule rule) {
    if (const YAML::Node* node = value_of(key)) out = read_integer<T>(path_of(key), *node, rule);
  }

  void number(std::string_view key, double& out, const NumberRule& rule) {
    if (const YAML::Node* node = value_of(key)) out = read_number(path_of(key), *node, rule);
  }

  void flag(std::string_view key, bool& out) {
    const YAML::Node* node = value_of(key);
    if (!node) return;
    const auto word = plain_text(*node);
    const auto value = word ? parse_bool(*word) : std::nullopt;
    if (!value) expected(path_of(key), *node, "true or false");
    out = *value;
  }

  void text(std::string_view key, std::string& out) {
    const YAML::Node* node = value_of(key);
    if (!node) return;
    if (!node->IsScalar()) expected(path_of(key), *node, "a string");
    out = node->Scalar();
  }
  void path(std::string_view key, std::string& out) { text(key, out); }

  void choice(std::string_view key, std::string& out, std::span<const std::string_view> choices) {
    const YAML::Node* node = value_of(key);
    if (!node) return;
    if (!node->IsScalar() ||
        std::find(choices.begin(), choices.end(), node->Scalar()) == choices.end())
      expected(path_of(key), *node, fmt::format("one of {}", fmt::join(choices, ", ")));
    out = node->Scalar();
  }

  template <class E, class Table>
  void enumeration(std::string_view key, E& out, const Table& table) {
    const YAML::Node* node = value_of(key);
    if (!node) return;
    if (node->IsScalar()) {
      for (const auto& s : table) {
        if (s.name == node->Scalar()) {
          out = s.value;
          return;
        }
      }
    }
    expected(path_of(key), *node, "one of " + join_names(table));
  }

  void integer_list(std::string_view key, std::vector<int>& out, IntRule rule) {
    const YAML::Node* node = value_of(key);
    if (!node) return;
    if (!node->IsSequence()) expected(path_of(key), *node, "a list of integers");
    out = read_integer_list(path_of(key), *node, rule);
  }

  // Either a count n, meaning ids 0..n-1, or a non-empty list of ids.
  void devices(std::string_view key, std::vector<int>& out) {
    const YAML::Node* node = value_of(key);
    if (!node) return;
    const std::string path = path_of(key);
    if (node->IsSequence()) {
      if (node->size() == 0)
        expected(path, *node, "a device count or a non-empty list of device ids");
      out = read_integer_list(path, *node, IntRule{.min = 0});
    } else if (node->IsScalar()) {
      const int count = read_integer<int>(path, *node, IntRule{.min = 1});
      if (count > kMaxDevices)
        expected(path, *node, fmt::format("at most {} devices", kMaxDevices));
      out.resize(static_cast<std::size_t>(count));
      std::iota(out.begin(), out.end(), 0);
    } else {
      expected(path, *node, "a device count or a list of device ids");
    }
  }

  // "betas: [b1, b2]", another spelling of two keys of the same section.
  void number_pair(std::string_view key, std::string_view first_key, double& first,
                   std::string_view second_key, double& second, const NumberRule& rule) {
    const YAML::Node* node = value_of(key);
    if (!node) return;
    const std::string path = path_of(key);
    for (const std::string_view other : {first_key, second_key}) {
      if (find(*current_, other))
        fail(origins_.locate(path, find(*current_, key)->key.Mark()), path,
             fmt::format("conflicts with {}; set one or the other", path_of(other)));
    }
    if (!node->IsSequence() || node->size() != 2)
      expected(path, *node, fmt::format("a list [{}, {}]", first_key, second_key));
    first = read_number(path + "[0]", (*node)[0], rule);
    second = read_number(path + "[1]", (*node)[1], rule);
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

  // The pairs of the map at `path` ("" for the top level), whose keys must be among `valid`
  // and appear once. Remembers where each key was written.
  Entries entries(const YAML::Node& map, const std::string& path,
                  const std::vector<std::string_view>& valid) {
    const bool top = path.empty();
    Entries out;
    for (const auto& pair : map) {
      const YAML::Node& key = pair.first;
      if (!key.IsScalar()) expected(path, key, top ? "a section name" : "a key name");
      const std::string& name = key.Scalar();
      const std::string key_path = top ? name : path + "." + name;
      const std::string where = origins_.locate(key_path, key.Mark());
      if (std::find(valid.begin(), valid.end(), name) == valid.end()) {
        for (const ReplacedKey& replaced : kReplacedKeys)
          if (replaced.path == key_path) fail(where, key_path, replaced.message);
        fail(where, key_path,
             unknown_name(top ? "section" : "key", name, valid, top ? "" : path + "."));
      }
      if (const Entry* first = find(out, name))
        fail(where, key_path,
             fmt::format("duplicate key (first at {})",
                         origins_.locate(key_path, first->key.Mark())));
      out.push_back({name, key, pair.second});
      origins_.remember(key_path, where);
    }
    return out;
  }

  std::string path_of(std::string_view key) const { return fmt::format("{}.{}", section_, key); }

  // The value of `key` in the current section; null when absent or null (keep the default).
  const YAML::Node* value_of(std::string_view key) const {
    const Entry* entry = find(*current_, key);
    if (!entry || entry->value.IsNull()) return nullptr;
    return &entry->value;
  }

  [[noreturn]] void expected(const std::string& path, const YAML::Node& node,
                             std::string_view what) const {
    fail(origins_.locate(path, node.Mark()), path,
         fmt::format("expected {}, got {}", what, got(node)));
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
  std::map<std::string, Entries, std::less<>> sections_;
  const Entries no_entries_;
  const Entries* current_ = &no_entries_;
  std::string section_;
};

// ---- Checker --------------------------------------------------------------------------------

// Re-checks the values of a Config against the rules in visit_schema().
class Checker {
 public:
  explicit Checker(const Origins& origins) : origins_(origins) {}

  void section(std::string_view name) { section_ = name; }

  template <class T>
  void integer(std::string_view key, T value, IntRule rule) {
    if (rule.zero_means_unset && value == 0) return;
    if (std::cmp_less(value, rule.min)) reject(key, describe(rule), value);
  }

  void number(std::string_view key, double value, const NumberRule& rule) {
    if (!satisfies(value, rule)) reject(key, rule.description, value);
  }

  void flag(std::string_view, bool) {}
  void text(std::string_view, const std::string&) {}
  void path(std::string_view, const std::string&) {}

  void choice(std::string_view key, const std::string& value,
              std::span<const std::string_view> choices) {
    if (std::find(choices.begin(), choices.end(), value) == choices.end())
      reject(key, fmt::format("one of {}", fmt::join(choices, ", ")), value);
  }

  template <class E, class Table>
  void enumeration(std::string_view key, E value, const Table& table) {
    if (!find_name(table, value))
      reject(key, "one of " + join_names(table), static_cast<long long>(value));
  }

  void integer_list(std::string_view key, const std::vector<int>& values, IntRule rule) {
    for (std::size_t i = 0; i < values.size(); ++i)
      integer(fmt::format("{}[{}]", key, i), values[i], rule);
  }

  void devices(std::string_view key, const std::vector<int>& ids) {
    if (ids.empty()) reject(key, "a non-empty list of device ids", "[]");
    integer_list(key, ids, IntRule{.min = 0});
  }

  // betas is checked as beta1 and beta2.
  void number_pair(std::string_view, std::string_view, double, std::string_view, double,
                   const NumberRule&) {}
  void nested(std::string_view) {}

 private:
  template <class V>
  [[noreturn]] void reject(std::string_view key, std::string_view what, const V& value) const {
    const std::string path = fmt::format("{}.{}", section_, key);
    fail(origins_.of(path), path, fmt::format("expected {}, got '{}'", what, value));
  }

  const Origins& origins_;
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
  void path(std::string_view key, std::string& value) {
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
  void integer(std::string_view key, T value, IntRule) {
    add(key, fmt::format("{}", value));
  }
  // fmt prints the shortest text that reads back as the same double: stable across platforms.
  void number(std::string_view key, double value, const NumberRule&) {
    add(key, fmt::format("{}", value));
  }
  void flag(std::string_view key, bool value) { add(key, value ? "true" : "false"); }
  // Length-prefixed in the hash, so that no text can pass for the end of its line and another key.
  void text(std::string_view key, const std::string& value) {
    add(key, fmt::format("{}:{}", value.size(), value), value.empty() ? "\"\"" : value);
  }
  // The file a path names, wherever the run starts from (see Note [Config paths]).
  void path(std::string_view key, const std::string& value) {
    text(key, value.empty() ? value
                            : std::filesystem::absolute(value).lexically_normal().string());
  }
  void choice(std::string_view key, const std::string& value, std::span<const std::string_view>) {
    text(key, value);
  }
  template <class E, class Table>
  void enumeration(std::string_view key, E value, const Table& table) {
    add(key, spelling(table, value));
  }
  void integer_list(std::string_view key, const std::vector<int>& values, IntRule) {
    add(key, fmt::format("[{}]", fmt::join(values, ",")));
  }
  void devices(std::string_view key, const std::vector<int>& ids) {
    add(key, fmt::format("[{}]", fmt::join(ids, ",")));
  }
  // betas is listed as beta1 and beta2.
  void number_pair(std::string_view, std::string_view, double, std::string_view, double,
                   const NumberRule&) {}
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

// Every value, then the rules that tie keys together.
void check_config(const Config& c, const Origins& origins) {
  Checker checker(origins);
  visit_schema(checker, c);

  const auto fail_at = [&](std::string_view path, std::string_view what) {
    fail(origins.of(path), path, what);
  };
  // "trainer.steps (20, set at --set trainer.steps=20)": the other key of a rule, which may
  // have been written somewhere else than the key the message is about.
  const auto other = [&](std::string_view path, auto value) {
    const auto at = origins.written(path);
    return at ? fmt::format("{} ({}, set at {})", path, value, *at)
              : fmt::format("{} ({})", path, value);
  };

  const TrainerConfig& t = c.trainer;
  if (t.steps == 0 && t.epochs == 0)
    fail(origins.source(), "trainer", "set trainer.steps or trainer.epochs");
  if (t.steps != 0 && t.epochs != 0)
    fail_at("trainer.steps", fmt::format("conflicts with {}; set only one (null unsets a key)",
                                         other("trainer.epochs", t.epochs)));
  if (t.grad_reduce_dtype == ReduceDtype::bf16 && t.zero == 1)
    fail_at("trainer.grad_reduce_dtype",
            fmt::format("bf16 with {} is not implemented yet; use fp32 with ZeRO-1",
                        other("trainer.zero", t.zero)));
  if (c.optimizer.type == OptimizerKind::adamw && c.optimizer.momentum != 0.0)
    fail_at("optimizer.momentum", "not a key of adamw (it is sgd's; adamw's first-moment decay is "
                                  "optimizer.beta1)");
  if (c.optimizer.type == OptimizerKind::adamw && c.optimizer.nesterov)
    fail_at("optimizer.nesterov", "not a key of adamw (it is sgd's)");
  if (c.optimizer.nesterov && !(c.optimizer.momentum > 0))
    fail_at("optimizer.nesterov", "requires optimizer.momentum > 0");
  const ModelConfig& m = c.model;
  if (m.vocab_size > kMaxVocabSize)
    fail_at("model.vocab_size",
            fmt::format("expected an integer <= {} (token ids reach the embedding as floats, "
                        "exact below 2^24), got {}",
                        kMaxVocabSize, m.vocab_size));
  if (m.type == "gpt" && m.d_model % m.n_head != 0)
    fail_at("model.n_head", fmt::format("must divide {}, got {}", other("model.d_model", m.d_model),
                                        m.n_head));
  if (c.schedule.min_lr > c.optimizer.lr)
    fail_at("schedule.min_lr",
            fmt::format("must be <= {}, got {}", other("optimizer.lr", c.optimizer.lr),
                        c.schedule.min_lr));
}

// The files data.dataset needs. Checked when a config is read, not by Config::validate(): an
// embedder who hands the Trainer its own datasets never sets them.
void check_data_source(const Config& c, const Origins& origins) {
  // A missing file key has no place of its own; point at the dataset choice if it was written.
  const auto require_file = [&](std::string_view path, const std::string& value) {
    if (value.empty())
      fail(origins.written(path).value_or(origins.of("data.dataset")), path,
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
    fail(origins.of("data.dataset"), "data.dataset",
         fmt::format("{} data needs model.type gpt, got {}", to_string(kind), c.model.type));
  if (!language && c.model.type == "gpt")
    fail(origins.of("model.type"), "model.type",
         fmt::format("gpt needs data.dataset tokens or text, got {}", to_string(kind)));
  const int vocab = c.model.vocab_size;
  if (kind == DatasetKind::tokens && vocab == 0)
    fail(origins.written("model.vocab_size").value_or(origins.of("data.dataset")),
         "model.vocab_size",
         "required when data.dataset is tokens: token files do not record it (GPT-2: 50257)");
  if (kind == DatasetKind::text && vocab < kByteVocabSize)
    fail(origins.of("model.vocab_size"), "model.vocab_size",
         fmt::format("expected at least {} for text data (one token per byte), got {}",
                     kByteVocabSize, vocab));
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
std::string_view to_string(TokenFormat v) { return spelling(kTokenFormats, v); }
std::string_view to_string(OptimizerKind v) { return spelling(kOptimizerKinds, v); }
std::string_view to_string(ScheduleKind v) { return spelling(kScheduleKinds, v); }
std::string_view to_string(BackendKind v) { return spelling(kBackendKinds, v); }
std::string_view to_string(CommKind v) { return spelling(kCommKinds, v); }
std::string_view to_string(NonfinitePolicy v) { return spelling(kNonfinitePolicies, v); }
std::string_view to_string(WorkerFailurePolicy v) { return spelling(kWorkerFailurePolicies, v); }
std::string_view to_string(Precision v) { return spelling(kPrecisions, v); }
std::string_view to_string(ReduceDtype v) { return spelling(kReduceDtypes, v); }
std::string_view to_string(AttentionKind v) { return spelling(kAttentionKinds, v); }

void Config::validate() const { check_config(*this, Origins(source)); }

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

namespace {

// `dir`: the config file's directory, against which its relative paths are resolved; empty
// for text that came from no file (Note [Config paths]).
Config parse_config_in(std::string_view yaml, std::string_view source,
                       std::span<const std::string> overrides, const std::filesystem::path* dir) {
  Origins origins{std::string(source)};
  YAML::Node root = load_tree(yaml, origins.source());
  for (const std::string& text : overrides) apply_override(root, text, origins);

  Config config;
  config.source = source;
  Parser parser(root, origins);
  visit_schema(parser, config);
  if (dir) {
    PathResolver resolver(origins, *dir);
    visit_schema(resolver, config);
  }
  // Text is read byte by byte: its vocabulary is 256 unless a larger one is asked for.
  if (config.data.dataset == DatasetKind::text && config.model.vocab_size == 0)
    config.model.vocab_size = kByteVocabSize;
  check_config(config, origins);
  check_data_source(config, origins);
  return config;
}

}  // namespace

Config parse_config(std::string_view yaml, std::string_view source,
                    std::span<const std::string> overrides) {
  return parse_config_in(yaml, source, overrides, nullptr);
}

Config load_config(const std::filesystem::path& file, std::span<const std::string> overrides) {
  const std::filesystem::path dir = file.parent_path();
  return parse_config_in(read_config_file(file), file.string(), overrides, &dir);
}

}  // namespace lockstep
