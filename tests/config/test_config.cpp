// The YAML config loader: every key reads into its field, and every kind of bad input throws
// ConfigError naming where (FILE:LINE:COL or --set KEY=VALUE), the key path and what was expected.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "lockstep/config.hpp"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

// The smallest config that passes validation: everything else keeps its default.
constexpr std::string_view kMinimal = "data: {dataset: synthetic}\ntrainer: {steps: 10}\n";

// The message of the ConfigError that parsing `yaml` (as "q.yaml") throws: every problem, one
// per line.
std::string errors_of(std::string_view yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "q.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL_CHECK("no ConfigError for:\n" << std::string(yaml));
  return "";
}

// Its first line: the first problem in the file's order. Most cases below leave out keys a
// run needs (data.path, trainer.steps), whose problems follow (Note [Every config error at
// once] in src/config/problems.hpp).
std::string error_of(std::string_view yaml, const std::vector<std::string>& overrides = {}) {
  const std::string all = errors_of(yaml, overrides);
  return all.substr(0, all.find('\n'));
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// A file under the system's temporary directory, removed at the end of the test.
class TempFile {
 public:
  TempFile(std::string_view name, std::string_view text) : path_(fs::temp_directory_path() / name) {
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempFile() {
    std::error_code ignored;
    fs::remove(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

}  // namespace

TEST_CASE("config: unset keys keep the defaults of config.hpp") {
  const Config cfg = parse_config(kMinimal, "min.yaml");
  const Config defaults;
  CHECK(cfg.source == "min.yaml");
  CHECK(cfg.model.type == defaults.model.type);
  CHECK(cfg.model.hidden == defaults.model.hidden);
  CHECK(cfg.model.activation == defaults.model.activation);
  CHECK(cfg.data.dataset == DatasetKind::synthetic);
  CHECK(cfg.data.samples == defaults.data.samples);
  CHECK(cfg.data.eval_fraction == defaults.data.eval_fraction);
  CHECK(cfg.data.batch_size == defaults.data.batch_size);
  CHECK(cfg.data.shuffle == defaults.data.shuffle);
  CHECK(cfg.optimizer.type == defaults.optimizer.type);
  CHECK(cfg.optimizer.lr == defaults.optimizer.lr);
  CHECK(cfg.optimizer.beta2 == defaults.optimizer.beta2);
  CHECK(cfg.schedule.type == defaults.schedule.type);
  CHECK(cfg.trainer.backend == BackendKind::automatic);
  CHECK(cfg.trainer.devices == defaults.trainer.devices);
  CHECK(cfg.trainer.steps == 10);
  CHECK(cfg.trainer.epochs == 0);
  CHECK(cfg.trainer.log_every == defaults.trainer.log_every);

  // Null values and empty sections also keep the defaults.
  const Config nulls = parse_config(
      "model:\ndata:\n  dataset: synthetic\n  batch_size: ~\ntrainer: {steps: 10, seed: null}\n",
      "nulls.yaml");
  CHECK(nulls.model.hidden == defaults.model.hidden);
  CHECK(nulls.data.batch_size == defaults.data.batch_size);
  CHECK(nulls.trainer.seed == defaults.trainer.seed);

  // An empty document is all defaults, which need only steps and a data source.
  const std::vector<std::string> set = {"trainer.steps=3", "data.dataset=synthetic"};
  CHECK(parse_config("", "empty.yaml", set).trainer.steps == 3);
  CHECK(parse_config("# just a comment\n", "empty.yaml", set).trainer.steps == 3);
  CHECK(error_of("") == "q.yaml: trainer: set trainer.steps or trainer.epochs");
}

TEST_CASE("config: every key reads into its field") {
  const Config cfg = parse_config(R"(model:
  type: mlp
  hidden: [128, 64, 32]
  activation: gelu
data:
  dataset: csv
  path: data/train.csv
  label_column: 0
  header: yes
  images: train-images
  labels: train-labels
  samples: 5000
  features: 16
  classes: 3
  eval_fraction: 0.25
  batch_size: 64
  shuffle: off
  drop_last: true
  normalize: False
  prefetch: 4
optimizer:
  type: sgd             # momentum and nesterov are sgd's keys; beta1, beta2, eps adamw's
  lr: 3e-4
  momentum: 0.5
  nesterov: ON
  weight_decay: 0.01
  decay_all: true
  beta1: 0.8
  beta2: 0.95
  eps: 1.0e-6
  clip_grad_norm: 1.5
schedule:
  type: warmup_cosine
  warmup_steps: 100
  min_lr: 1e-5
trainer:
  backend: cuda
  devices: [2, 3]
  steps: +1000
  seed: 18446744073709551615
  log_every: 10
  eval_every: 200
  check_replicas_every: 0
  threads_per_device: 2
  zero: 1
)",
                                  "full.yaml");
  CHECK(cfg.model.type == "mlp");
  CHECK(cfg.model.hidden == std::vector<int>{128, 64, 32});
  CHECK(cfg.model.activation == Activation::gelu);
  CHECK(cfg.data.dataset == DatasetKind::csv);
  CHECK(cfg.data.path == "data/train.csv");
  CHECK(cfg.data.label_column == 0);
  CHECK(cfg.data.header);
  CHECK(cfg.data.images == "train-images");
  CHECK(cfg.data.labels == "train-labels");
  CHECK(cfg.data.samples == 5000);
  CHECK(cfg.data.features == 16);
  CHECK(cfg.data.classes == 3);
  CHECK(cfg.data.eval_fraction == 0.25);
  CHECK(cfg.data.batch_size == 64);
  CHECK_FALSE(cfg.data.shuffle);
  CHECK(cfg.data.drop_last);
  CHECK_FALSE(cfg.data.normalize);
  CHECK(cfg.data.prefetch == 4);
  CHECK(cfg.optimizer.type == OptimizerKind::sgd);
  CHECK(cfg.optimizer.lr == 3e-4);
  CHECK(cfg.optimizer.momentum == 0.5);
  CHECK(cfg.optimizer.nesterov);
  CHECK(cfg.optimizer.weight_decay == 0.01);
  CHECK(cfg.optimizer.decay_all);
  CHECK(cfg.optimizer.beta1 == 0.8);
  CHECK(cfg.optimizer.beta2 == 0.95);
  CHECK(cfg.optimizer.eps == 1e-6);
  CHECK(cfg.optimizer.clip_grad_norm == 1.5);
  CHECK(cfg.schedule.type == ScheduleKind::warmup_cosine);
  CHECK(cfg.schedule.warmup_steps == 100);
  CHECK(cfg.schedule.min_lr == 1e-5);
  CHECK(cfg.trainer.backend == BackendKind::cuda);
  CHECK(cfg.trainer.devices == std::vector<int>{2, 3});
  CHECK(cfg.trainer.steps == 1000);
  CHECK(cfg.trainer.epochs == 0);
  CHECK(cfg.trainer.seed == 18446744073709551615ull);
  CHECK(cfg.trainer.log_every == 10);
  CHECK(cfg.trainer.eval_every == 200);
  CHECK(cfg.trainer.check_replicas_every == 0);
  CHECK(cfg.trainer.threads_per_device == 2);
  CHECK(cfg.trainer.zero == 1);
  CHECK_NOTHROW(cfg.validate());
}

TEST_CASE("config: the other spellings: device count, betas, epochs, empty hidden") {
  const Config cfg = parse_config(
      "model: {hidden: [], activation: tanh}\n"
      "data: {dataset: idx, images: i.idx, labels: l.idx, label_column: -1}\n"
      "optimizer: {type: sgd, betas: [0.7, 0.9]}\n"
      "trainer: {backend: auto, devices: 4, epochs: 3}\n",
      "other.yaml");
  CHECK(cfg.model.hidden.empty());
  CHECK(cfg.model.activation == Activation::tanh);
  CHECK(cfg.data.dataset == DatasetKind::idx);
  CHECK(cfg.data.label_column == -1);
  CHECK(cfg.optimizer.type == OptimizerKind::sgd);
  CHECK(cfg.optimizer.beta1 == 0.7);
  CHECK(cfg.optimizer.beta2 == 0.9);
  CHECK(cfg.trainer.backend == BackendKind::automatic);
  CHECK(cfg.trainer.devices == std::vector<int>{0, 1, 2, 3});
  CHECK(cfg.trainer.steps == 0);
  CHECK(cfg.trainer.epochs == 3);
}

TEST_CASE("config: enums print as their YAML spelling") {
  CHECK(to_string(Activation::relu) == "relu");
  CHECK(to_string(Activation::gelu) == "gelu");
  CHECK(to_string(Activation::tanh) == "tanh");
  CHECK(to_string(DatasetKind::csv) == "csv");
  CHECK(to_string(DatasetKind::idx) == "idx");
  CHECK(to_string(DatasetKind::synthetic) == "synthetic");
  CHECK(to_string(OptimizerKind::sgd) == "sgd");
  CHECK(to_string(OptimizerKind::adamw) == "adamw");
  CHECK(to_string(ScheduleKind::constant) == "constant");
  CHECK(to_string(ScheduleKind::warmup_cosine) == "warmup_cosine");
  CHECK(to_string(BackendKind::automatic) == "auto");
  CHECK(to_string(BackendKind::cpu) == "cpu");
  CHECK(to_string(BackendKind::cuda) == "cuda");
}

TEST_CASE("config: unknown keys and sections are rejected with a suggestion") {
  CHECK(error_of("trainer:\n  steps: 10\n  devcies: 2\n") ==
        "q.yaml:3:3: trainer.devcies: unknown key; did you mean 'trainer.devices'?");
  CHECK(error_of("model:\n  hiden: [32]\n") ==
        "q.yaml:2:3: model.hiden: unknown key; did you mean 'model.hidden'?");
  CHECK(error_of("optimizer: {LR: 0.1}\n") ==
        "q.yaml:1:13: optimizer.LR: unknown key; did you mean 'optimizer.lr'?");
  // Nothing close: list the section's keys instead.
  CHECK(error_of("model:\n  depth: 3\n") ==
        "q.yaml:2:3: model.depth: unknown key; valid keys: type, hidden, activation, vocab_size, "
        "context, n_layer, n_head, d_model, attention, family, norm, norm_eps, positions, "
        "rope_theta, mlp, intermediate_size, n_kv_head, head_dim, qkv_bias, proj_bias, "
        "tie_embeddings, rope_scaling.type, rope_scaling.factor, rope_scaling.low_freq_factor, "
        "rope_scaling.high_freq_factor, rope_scaling.original_max_position_embeddings, "
                 "lora.rank, lora.alpha, lora.targets, lora.dropout");
  CHECK(error_of("trainer: {steps: 1}\ntraner:\n  steps: 5\n") ==
        "q.yaml:2:1: traner: unknown section; did you mean 'trainer'?");
  CHECK(error_of("logging: {level: 3}\n") ==
        "q.yaml:1:1: logging: unknown section; valid sections: model, data, optimizer, schedule, "
        "trainer");
}

TEST_CASE("config: values of the wrong type") {
  CHECK(error_of("trainer:\n  steps: ten\n") ==
        "q.yaml:2:10: trainer.steps: expected an integer >= 1, got 'ten'");
  CHECK(error_of("trainer:\n  steps: 1.5\n") ==
        "q.yaml:2:10: trainer.steps: expected an integer >= 1, got '1.5'");
  CHECK(error_of("trainer:\n  steps: 10x\n") ==
        "q.yaml:2:10: trainer.steps: expected an integer >= 1, got '10x'");
  CHECK(error_of("trainer:\n  steps: 1e3\n") ==
        "q.yaml:2:10: trainer.steps: expected an integer >= 1, got '1e3'");
  // A quoted number is a string.
  CHECK(error_of("trainer:\n  steps: \"10\"\n") ==
        "q.yaml:2:10: trainer.steps: expected an integer >= 1, got the string \"10\"");
  CHECK(error_of("optimizer:\n  lr: [1, 2]\n") ==
        "q.yaml:2:7: optimizer.lr: expected a number > 0, got a list");
  CHECK(error_of("optimizer:\n  type: {name: sgd}\n") ==
        "q.yaml:2:9: optimizer.type: expected one of sgd, adamw, got a map");
  CHECK(error_of("data:\n  path: [a.csv]\n") ==
        "q.yaml:2:9: data.path: expected a string, got a list");
  CHECK(error_of("model:\n  hidden: 64\n") ==
        "q.yaml:2:11: model.hidden: expected a list of integers, got '64'; a list is written [64]");
  CHECK(error_of("model:\n  hidden: [64, wide]\n") ==
        "q.yaml:2:16: model.hidden[1]: expected an integer >= 1, got 'wide'");
  CHECK(error_of("trainer: {devices: {a: 1}}\n") ==
        "q.yaml:1:20: trainer.devices: expected an integer or a list of device ids, got a map");
  CHECK(error_of("model: [mlp]\n") == "q.yaml:1:8: model: expected a map, got a list");

  // Booleans: true/false/yes/no/on/off in any case, nothing else.
  for (const std::string yes : {"true", "True", "YES", "on"})
    CHECK(parse_config(kMinimal, "b.yaml", std::vector{"data.drop_last=" + yes}).data.drop_last);
  for (const std::string no : {"false", "FALSE", "no", "Off"})
    CHECK_FALSE(parse_config(kMinimal, "b.yaml", std::vector{"data.shuffle=" + no}).data.shuffle);
  CHECK(error_of("data:\n  shuffle: maybe\n") ==
        "q.yaml:2:12: data.shuffle: expected true or false, got 'maybe'");
  CHECK(error_of("data:\n  shuffle: 1\n") ==
        "q.yaml:2:12: data.shuffle: expected true or false, got '1'");
}

TEST_CASE("config: values out of range") {
  CHECK(error_of("model: {}\ntrainer:\n  steps: -5\n") ==
        "q.yaml:3:10: trainer.steps: expected an integer >= 1, got '-5'");
  CHECK(error_of("trainer:\n  steps: 0\n") ==
        "q.yaml:2:10: trainer.steps: expected an integer >= 1, got '0'");
  CHECK(error_of("trainer:\n  steps: 99999999999999999999\n") ==
        "q.yaml:2:10: trainer.steps: expected an integer <= 9223372036854775807, got "
        "'99999999999999999999'");
  CHECK(error_of("data:\n  batch_size: 4294967296\n") ==
        "q.yaml:2:15: data.batch_size: expected an integer <= 2147483647, got '4294967296'");
  CHECK(error_of("trainer:\n  seed: -1\n") ==
        "q.yaml:2:9: trainer.seed: expected an integer >= 0, got '-1'");
  CHECK(error_of("trainer:\n  zero: 3\n") ==
        "q.yaml:2:9: trainer.zero: expected an integer in [0, 2], got '3'");
  CHECK(error_of("trainer:\n  zero: -1\n") ==
        "q.yaml:2:9: trainer.zero: expected an integer in [0, 2], got '-1'");
  CHECK(parse_config(kMinimal, "z.yaml", std::vector<std::string>{"trainer.zero=2"}).trainer.zero ==
        2);
  CHECK(parse_config(kMinimal, "z.yaml", std::vector<std::string>{"trainer.zero=1"}).trainer.zero ==
        1);
  CHECK(error_of("data:\n  classes: 1\n") ==
        "q.yaml:2:12: data.classes: expected an integer >= 2, got '1'");
  CHECK(error_of("optimizer:\n  lr: 0\n") ==
        "q.yaml:2:7: optimizer.lr: expected a number > 0, got '0'");
  CHECK(error_of("optimizer:\n  momentum: 1.0\n") ==
        "q.yaml:2:13: optimizer.momentum: expected a number in [0, 1), got '1.0'");
  CHECK(error_of("optimizer:\n  weight_decay: -0.1\n") ==
        "q.yaml:2:17: optimizer.weight_decay: expected a number >= 0, got '-0.1'");
  CHECK(error_of("optimizer:\n  eps: .nan\n") ==
        "q.yaml:2:8: optimizer.eps: expected a number > 0, got '.nan'");
  CHECK(error_of("optimizer:\n  betas: [0.9, 1.5]\n") ==
        "q.yaml:2:16: optimizer.betas[1]: expected a number in [0, 1), got '1.5'");
  CHECK(error_of("optimizer:\n  betas: [0.9]\n") ==
        "q.yaml:2:10: optimizer.betas: expected a list [beta1, beta2], got a list");
  CHECK(error_of("data:\n  eval_fraction: 1\n") ==
        "q.yaml:2:18: data.eval_fraction: expected a number in [0, 1), got '1'");
  CHECK(error_of("model:\n  hidden: [32, 0]\n") ==
        "q.yaml:2:16: model.hidden[1]: expected an integer >= 1, got '0'");
  CHECK(error_of("trainer:\n  devices: [0, -1]\n") ==
        "q.yaml:2:16: trainer.devices[1]: expected an integer >= 0, got '-1'");
  CHECK(contains(error_of("trainer:\n  devices: []\n"), "q.yaml:2:12: trainer.devices: expected"));
  CHECK(contains(error_of("trainer:\n  devices: 0\n"), "q.yaml:2:12: trainer.devices: expected"));
  CHECK(contains(error_of("trainer:\n  devices: 100000\n"),
                 "q.yaml:2:12: trainer.devices: expected at most"));
}

TEST_CASE("config: enum values outside their choices") {
  CHECK(error_of("trainer: {steps: 1}\noptimizer:\n  type: adam\n") ==
        "q.yaml:3:9: optimizer.type: expected one of sgd, adamw, got 'adam'");
  CHECK(error_of("model: {activation: sigmoid}\n") ==
        "q.yaml:1:21: model.activation: expected one of relu, gelu, tanh, got 'sigmoid'");
  CHECK(error_of("model: {type: cnn}\n") ==
        "q.yaml:1:15: model.type: expected one of mlp, gpt, got 'cnn'");
  CHECK(contains(error_of("data: {dataset: parquet}\n"),
                 "expected one of csv, idx, synthetic, tokens, text"));
  CHECK(contains(error_of("data: {format: npy}\n"), "expected one of auto, llmc, raw"));
  CHECK(
      contains(error_of("schedule: {type: cosine}\n"), "expected one of constant, warmup_cosine"));
  CHECK(contains(error_of("trainer: {backend: tpu}\n"), "expected one of auto, cpu, cuda"));
}

TEST_CASE("config: a YAML syntax error is said in words, with its line and a caret") {
  // A value with ': ' in it, unquoted.
  CHECK(errors_of("model:\n  type: mlp: x\n") ==
        "q.yaml:2:12: YAML syntax: a ':' where no value can start: a value holding ': ' must be "
        "quoted (key: \"a: b\"), or this key is indented deeper than the keys of its section "
        "(yaml-cpp: illegal map value)\n  2 |   type: mlp: x\n    |            ^");
  // A tab in the indentation, which yaml-cpp also calls an illegal map value.
  CHECK(contains(error_of("trainer:\n\tsteps: 3\n"),
                 "q.yaml:2:7: YAML syntax: a tab in the indentation: YAML indents with spaces only"));
  CHECK(contains(error_of("model: {type: mlp\n"), "a map opened with '{' is not closed with '}'"));
  CHECK(contains(error_of("data: {path: \"a\\qb\"}\n"),
                 "a backslash in a double-quoted string that starts no escape"));
}

TEST_CASE("config: malformed documents") {
  CHECK(errors_of("trainer: [\n") ==
        "q.yaml:2:1: YAML syntax: a list opened with '[' is not closed with ']' (or an item lacks "
        "its ',') (yaml-cpp: end of sequence flow not found)\n  2 | \n    | ^");
  CHECK(contains(error_of("trainer:\n  steps: 1\n bad: x: y\n"), "q.yaml:3:"));
  CHECK(error_of("- model\n- data\n") ==
        "q.yaml:1:1: expected a map of sections (model, data, optimizer, schedule, trainer), got a "
        "list");
  CHECK(error_of("just text\n") ==
        "q.yaml:1:1: expected a map of sections (model, data, optimizer, schedule, trainer), got "
        "'just text'");
  CHECK(error_of("trainer: {steps: 1}\n---\ntrainer: {steps: 2}\n") ==
        "q.yaml:3:1: expected one YAML document, found 2");
  CHECK(error_of("trainer:\n  steps: 5\n  steps: 6\n") ==
        "q.yaml:3:3: trainer.steps: duplicate key (first at q.yaml:2:3)");
  CHECK(error_of("model: {[a, b]: 1}\n") == "q.yaml:1:9: model: expected a key name, got a list");
}

TEST_CASE("config: files") {
  const TempFile good("lockstep_test_config_good.yaml", kMinimal);
  const Config cfg = load_config(good.path(), std::vector<std::string>{"trainer.seed=9"});
  CHECK(cfg.source == good.path().string());
  CHECK(cfg.trainer.seed == 9);

  const TempFile bad("lockstep_test_config_bad.yaml",
                     "trainer:\n  steps: -5\ndata: {dataset: synthetic}\n");
  try {
    load_config(bad.path());
    FAIL("no ConfigError");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) ==
          bad.path().string() + ":2:10: trainer.steps: expected an integer >= 1, got '-5'");
  }

  const fs::path missing = fs::temp_directory_path() / "lockstep_test_config_missing.yaml";
  const std::string cannot_open = missing.string() + ": cannot open config file: ";
  CHECK_THROWS_WITH_AS(load_config(missing), doctest::Contains(cannot_open.c_str()), ConfigError);
  CHECK_THROWS_WITH_AS(load_config(fs::temp_directory_path()),
                       doctest::Contains(": cannot open config file: "), ConfigError);
}

TEST_CASE("config: cross-field rules") {
  CHECK(error_of("data: {dataset: synthetic}\ntrainer: {log_every: 5}\n") ==
        "q.yaml: trainer: set trainer.steps or trainer.epochs");
  CHECK(error_of("data: {dataset: synthetic}\ntrainer:\n  steps: 5\n  epochs: 2\n") ==
        "q.yaml:3:3: trainer.steps: conflicts with trainer.epochs (2, set at q.yaml:4:3); set "
        "only one (null unsets a key)");
  CHECK(error_of(std::string(kMinimal) + "optimizer:\n  nesterov: true\n") ==
        "q.yaml:4:3: optimizer.nesterov: requires optimizer.momentum > 0");
  CHECK(error_of("trainer: {steps: 5}\n") ==
        "q.yaml: data.path: required when data.dataset is csv");
  CHECK(error_of("trainer: {steps: 5}\ndata:\n  dataset: csv\n") ==
        "q.yaml:3:3: data.path: required when data.dataset is csv");
  CHECK(error_of("trainer: {steps: 5}\ndata:\n  dataset: idx\n  images: i.idx\n") ==
        "q.yaml:3:3: data.labels: required when data.dataset is idx");
  CHECK(error_of("trainer: {steps: 5}\ndata:\n  dataset: idx\n  labels: l.idx\n") ==
        "q.yaml:3:3: data.images: required when data.dataset is idx");
  CHECK(error_of(std::string(kMinimal) + "schedule:\n  min_lr: 0.5\n") ==
        "q.yaml:4:3: schedule.min_lr: must be <= optimizer.lr (0.01), got 0.5");
  CHECK(error_of(std::string(kMinimal) + "optimizer: {beta1: 0.5, betas: [0.5, 0.6]}\n") ==
        "q.yaml:3:25: optimizer.betas: conflicts with optimizer.beta1; set one or the other");
  // A warmup longer than the run is allowed: the learning rate simply never peaks.
  CHECK(parse_config(
            "data: {dataset: synthetic}\ntrainer: {epochs: 1}\nschedule: {warmup_steps: 50}\n",
            "e.yaml")
            .schedule.warmup_steps == 50);
}

TEST_CASE("config: validate() checks a Config filled by hand") {
  Config cfg;
  cfg.source = "hand";
  cfg.data.dataset = DatasetKind::synthetic;
  cfg.trainer.steps = 10;
  CHECK_NOTHROW(cfg.validate());
  // An embedder hands the Trainer its own datasets: the data files are not validate()'s business.
  Config embedded = cfg;
  embedded.data.dataset = DatasetKind::csv;
  CHECK_NOTHROW(embedded.validate());

  Config bad_lr = cfg;
  bad_lr.optimizer.lr = -1;
  CHECK_THROWS_WITH_AS(bad_lr.validate(), "hand: optimizer.lr: expected a number > 0, got '-1'",
                       ConfigError);
  Config bad_devices = cfg;
  bad_devices.trainer.devices = {0, -2};
  CHECK_THROWS_WITH_AS(bad_devices.validate(),
                       "hand: trainer.devices[1]: expected an integer >= 0, got '-2'", ConfigError);
  Config no_devices = cfg;
  no_devices.trainer.devices.clear();
  CHECK_THROWS_AS(no_devices.validate(), ConfigError);
  Config both = cfg;
  both.trainer.epochs = 2;
  CHECK_THROWS_WITH_AS(both.validate(),
                       doctest::Contains("hand: trainer.steps: conflicts with trainer.epochs"),
                       ConfigError);
  Config nesterov = cfg;
  nesterov.optimizer.nesterov = true;
  CHECK_THROWS_WITH_AS(nesterov.validate(),
                       "hand: optimizer.nesterov: requires optimizer.momentum > 0", ConfigError);
  nesterov.optimizer.momentum = 0.9;
  CHECK_NOTHROW(nesterov.validate());
}

TEST_CASE("config: overrides") {
  const std::vector<std::string> set = {"trainer.devices=[0, 1]", "model.hidden=[32,32]",
                                        "optimizer.type=adamw", "data.shuffle=no",
                                        "schedule.min_lr=1e-4"};
  const Config cfg = parse_config(kMinimal, "q.yaml", set);
  CHECK(cfg.trainer.devices == std::vector<int>{0, 1});
  CHECK(cfg.model.hidden == std::vector<int>{32, 32});
  CHECK(cfg.optimizer.type == OptimizerKind::adamw);
  CHECK_FALSE(cfg.data.shuffle);
  CHECK(cfg.schedule.min_lr == 1e-4);

  // The last override wins; null unsets, so a file's epochs can become steps.
  const std::string epochs_file = "data: {dataset: synthetic}\ntrainer:\n  epochs: 3\n";
  const Config switched = parse_config(
      epochs_file, "q.yaml",
      std::vector<std::string>{"trainer.steps=7", "trainer.steps=70", "trainer.epochs=null"});
  CHECK(switched.trainer.steps == 70);
  CHECK(switched.trainer.epochs == 0);
  CHECK(error_of(epochs_file, {"trainer.steps=70"}) ==
        "--set trainer.steps=70: trainer.steps: conflicts with trainer.epochs (3, set at "
        "q.yaml:3:3); set only one (null unsets a key)");
  CHECK(error_of(std::string(kMinimal) + "schedule: {min_lr: 0.05}\n", {"optimizer.lr=0.01"}) ==
        "q.yaml:3:12: schedule.min_lr: must be <= optimizer.lr (0.01, set at --set "
        "optimizer.lr=0.01), got 0.05");

  // A whole section, as a flow map.
  CHECK(parse_config(kMinimal, "q.yaml", std::vector<std::string>{"model={activation: gelu}"})
            .model.activation == Activation::gelu);
}

TEST_CASE("config: bad overrides name the --set and the key") {
  CHECK(error_of(kMinimal, {"trainer.steps=abc"}) ==
        "--set trainer.steps=abc: trainer.steps: expected an integer >= 1, got 'abc'");
  CHECK(error_of(kMinimal, {"trainer.devices=[0,-1]"}) ==
        "--set trainer.devices=[0,-1]: trainer.devices[1]: expected an integer >= 0, got '-1'");
  CHECK(error_of(kMinimal, {"trainer.steps.every=3"}) ==
        "--set trainer.steps.every=3: trainer.steps: expected an integer >= 1, got a map");
  CHECK(error_of(kMinimal, {"trainer.stpes=100"}) ==
        "--set trainer.stpes=100: trainer.stpes: unknown key; did you mean 'trainer.steps'?");
  CHECK(error_of(kMinimal, {"trainr.steps=100"}) ==
        "--set trainr.steps=100: trainr: unknown section; did you mean 'trainer'?");
  CHECK(error_of(kMinimal, {"optimizer.nesterov=true"}) ==
        "--set optimizer.nesterov=true: optimizer.nesterov: requires optimizer.momentum > 0");
  CHECK(error_of(kMinimal, {"trainer.steps"}) == "--set trainer.steps: expected KEY=VALUE");
  CHECK(error_of(kMinimal, {"=5"}) == "--set =5: expected KEY=VALUE");
  CHECK(error_of(kMinimal, {"trainer..steps=5"}) == "--set trainer..steps=5: expected KEY=VALUE");
  CHECK(contains(error_of(kMinimal, {"model.hidden=[1,"}),
                 "--set model.hidden=[1,: model.hidden: invalid YAML value: "));
  // A key the override did not touch still points into the file.
  CHECK(error_of("data: {dataset: synthetic}\ntrainer:\n  steps: -1\n", {"trainer.seed=1"}) ==
        "q.yaml:3:10: trainer.steps: expected an integer >= 1, got '-1'");
}

TEST_CASE("config: gpt model and token data") {
  const Config text = parse_config(
      "model: {type: gpt, context: 32, n_layer: 2, n_head: 2, d_model: 64}\n"
      "data: {dataset: text, path: book.txt, eval_path: val.txt}\ntrainer: {steps: 5}\n",
      "gpt.yaml");
  CHECK(text.model.type == "gpt");
  CHECK(text.model.context == 32);
  CHECK(text.model.n_layer == 2);
  CHECK(text.model.n_head == 2);
  CHECK(text.model.d_model == 64);
  CHECK(text.model.vocab_size == 256);  // text implies bytes
  CHECK(text.data.eval_path == "val.txt");
  CHECK(text.data.format == TokenFormat::automatic);
  CHECK(to_string(TokenFormat::llmc) == "llmc");
  CHECK(to_string(DatasetKind::tokens) == "tokens");

  const Config tokens = parse_config(
      "model: {type: gpt, vocab_size: 50257}\n"
      "data: {dataset: tokens, path: train.bin, format: raw}\ntrainer: {steps: 5}\n",
      "gpt.yaml");
  CHECK(tokens.model.vocab_size == 50257);
  CHECK(tokens.data.format == TokenFormat::raw);

  const std::string gpt_tokens = "model: {type: gpt, vocab_size: 50257}\ntrainer: {steps: 5}\n";
  CHECK(error_of(gpt_tokens + "data:\n  dataset: tokens\n") ==
        "q.yaml:4:3: data.path: required when data.dataset is tokens");
  CHECK(error_of("model: {type: gpt}\ntrainer: {steps: 5}\ndata:\n  dataset: tokens\n"
                 "  path: t\n") ==
        "q.yaml:4:3: model.vocab_size: required when data.dataset is tokens: token files do not "
        "record it (GPT-2: 50257; train --init-from a GPT-2 directory gives it, or "
        "data.tokenizer)");
  CHECK(error_of("model: {type: gpt, vocab_size: 100}\ntrainer: {steps: 5}\n"
                 "data: {dataset: text, path: t}\n") ==
        "q.yaml:1:20: model.vocab_size: expected at least 256 for text data (one token per "
        "byte), got 100");
  CHECK(contains(errors_of("model: {type: gpt, vocab_size: 16777217}\n" + std::string(kMinimal)),
                 "\nq.yaml:1:20: model.vocab_size: expected an integer <= 16777216 (token ids "
                 "reach the embedding as floats, exact below 2^24), got 16777217"));
  CHECK(error_of("model: {type: gpt, d_model: 100, n_head: 3}\ntrainer: {steps: 5}\n"
                 "data: {dataset: text, path: t}\n") ==
        "q.yaml:1:34: model.n_head: must divide model.d_model (100, set at q.yaml:1:20), got 3");
  CHECK(contains(errors_of("model: {type: gpt, context: 0}\n"),
                 "q.yaml:1:29: model.context: expected an integer >= 1, got '0'"));
  // The model and the data must fit together.
  CHECK(error_of("trainer: {steps: 5}\ndata:\n  dataset: text\n  path: t\n") ==
        "q.yaml:3:3: data.dataset: text data needs model.type gpt, got mlp");
  CHECK(error_of("model:\n  type: gpt\n" + std::string(kMinimal)) ==
        "q.yaml:2:3: model.type: gpt needs data.dataset tokens, text or chat, got synthetic");
  CHECK(error_of("data: {eval_pth: v.bin}\n") ==
        "q.yaml:1:8: data.eval_pth: unknown key; did you mean 'data.eval_path'?");
  // Existing mlp configs are unchanged by the gpt keys.
  CHECK(parse_config(kMinimal, "min.yaml").model.vocab_size == 0);

  // With data.tokenizer, the vocabulary is the tokenizer's (known once it is read) unless set.
  const Config bpe = parse_config("model: {type: gpt}\ntrainer: {steps: 5}\n"
                                  "data: {dataset: text, path: t, tokenizer: gpt2/}\n", "q.yaml");
  CHECK(bpe.data.tokenizer == "gpt2/");
  CHECK(bpe.model.vocab_size == 0);
  CHECK_NOTHROW(parse_config("model: {type: gpt}\ntrainer: {steps: 5}\n"
                             "data: {dataset: tokens, path: t, tokenizer: gpt2/}\n", "q.yaml"));
  CHECK(error_of("data: {dataset: csv, path: t.csv, tokenizer: gpt2/}\ntrainer: {steps: 5}\n") ==
        "q.yaml:1:35: data.tokenizer: a key of tokens and text data, got data.dataset csv");
}

TEST_CASE("config: a file's relative paths are relative to its directory, --set's to the working "
          "directory") {
  const fs::path dir = fs::temp_directory_path() / ("lockstep_test_paths_" + std::to_string(::getpid()));
  fs::create_directories(dir / "configs");
  const fs::path file = dir / "configs" / "c.yaml";
  std::ofstream(file) << "data: {dataset: synthetic}\n"
                         "trainer:\n  steps: 10\n  trace: t.json\n  report: /abs/r.html\n"
                         "  checkpoint: {dir: ../runs/c}\n";
  const Config cfg = load_config(file);
  CHECK(cfg.trainer.trace == (dir / "configs" / "t.json").string());
  CHECK(cfg.trainer.report == "/abs/r.html");
  CHECK(cfg.trainer.checkpoint.dir == (dir / "runs" / "c").string());

  const Config set = load_config(file, std::vector<std::string>{"trainer.trace=mine.json",
                                                                "trainer.checkpoint={dir: ck}"});
  CHECK(set.trainer.trace == "mine.json");
  CHECK(set.trainer.checkpoint.dir == "ck");  // set through its section
  CHECK(set.trainer.report == "/abs/r.html");

  // Text from no file keeps its paths as written.
  CHECK(parse_config("data: {dataset: synthetic}\ntrainer: {steps: 1, trace: t.json}\n", "q.yaml")
            .trainer.trace == "t.json");
  fs::remove_all(dir);
}

TEST_CASE("config: model.attention reads auto, fused and materialized") {
  CHECK(parse_config(kMinimal, "q.yaml").model.attention == AttentionKind::automatic);
  const std::vector<std::string> fused{"model.attention=fused"};
  CHECK(parse_config(kMinimal, "q.yaml", fused).model.attention == AttentionKind::fused);
  const std::vector<std::string> materialized{"model.attention=materialized"};
  CHECK(parse_config(kMinimal, "q.yaml", materialized).model.attention ==
        AttentionKind::materialized);
  CHECK(to_string(AttentionKind::automatic) == "auto");
  CHECK(error_of("model: {attention: flash}\n") ==
        "q.yaml:1:20: model.attention: expected one of auto, fused, materialized, got 'flash'");
}

TEST_CASE("config: trainer.precision reads fp32, tf32 and bf16") {
  CHECK(parse_config(kMinimal, "q.yaml").trainer.precision == Precision::fp32);
  const std::vector<std::string> tf32{"trainer.precision=tf32"};
  CHECK(parse_config(kMinimal, "q.yaml", tf32).trainer.precision == Precision::tf32);
  const std::vector<std::string> bf16{"trainer.precision=bf16"};
  CHECK(parse_config(kMinimal, "q.yaml", bf16).trainer.precision == Precision::bf16);
  CHECK(to_string(Precision::bf16) == "bf16");
  // bf16 compute with a bf16 gradient all-reduce.
  const std::vector<std::string> both{"trainer.precision=bf16", "trainer.grad_reduce_dtype=bf16"};
  const Config mixed = parse_config(kMinimal, "q.yaml", both);
  CHECK(mixed.trainer.precision == Precision::bf16);
  CHECK(mixed.trainer.grad_reduce_dtype == ReduceDtype::bf16);
  CHECK(error_of("trainer: {steps: 10, precision: fp16}\n") ==
        "q.yaml:1:33: trainer.precision: expected one of fp32, tf32, bf16, got 'fp16'");
}

TEST_CASE("config: the replaced key trainer.tf32 names trainer.precision") {
  const std::string expected =
      "trainer.tf32: replaced by trainer.precision (fp32, tf32 or bf16): 'tf32: true' is now "
      "'precision: tf32', 'tf32: false' is 'precision: fp32'";
  CHECK(error_of("trainer:\n  steps: 10\n  tf32: true\n") == "q.yaml:3:3: " + expected);
  CHECK(error_of(kMinimal, {"trainer.tf32=false"}) == "--set trainer.tf32=false: " + expected);
}

TEST_CASE("config: trainer.grad_reduce_dtype reads fp32 and bf16, not bf16 with ZeRO-1 yet") {
  CHECK(parse_config(kMinimal, "q.yaml").trainer.grad_reduce_dtype == ReduceDtype::fp32);
  const std::vector<std::string> bf16{"trainer.grad_reduce_dtype=bf16"};
  CHECK(parse_config(kMinimal, "q.yaml", bf16).trainer.grad_reduce_dtype == ReduceDtype::bf16);
  CHECK(to_string(ReduceDtype::bf16) == "bf16");
  CHECK(error_of("data: {dataset: synthetic}\n"
                 "trainer: {steps: 10, zero: 1, grad_reduce_dtype: bf16}\n") ==
        "q.yaml:2:31: trainer.grad_reduce_dtype: bf16 with trainer.zero (1, set at q.yaml:2:22) "
        "is not implemented yet; use fp32 with ZeRO");
  CHECK(error_of("trainer: {steps: 10, grad_reduce_dtype: fp16}\n") ==
        "q.yaml:1:41: trainer.grad_reduce_dtype: expected one of fp32, bf16, got 'fp16'");
}

TEST_CASE("config: every problem at once, in the file's order, then the overrides'") {
  // A misspelt trainer.steps adds no "set trainer.steps or trainer.epochs": the rule is not
  // checked when the key it needs is unknown.
  CHECK(errors_of("model:\n  hiden: [32]\n"
                  "optimizer:\n  learning_rate: 0.1\n  momentum: 2\n"
                  "trainer:\n  stpes: 100\n  devices: two\n"
                  "data: {dataset: synthetic, batch_size: 0}\n",
                  {"model.hidden=128,64", "optimizer.lr 0.1"}) ==
        "q.yaml:2:3: model.hiden: unknown key; did you mean 'model.hidden'?\n"
        "q.yaml:4:3: optimizer.learning_rate: unknown key; valid keys: type, lr, momentum, "
        "nesterov, weight_decay, decay_all, beta1, beta2, betas, eps, clip_grad_norm\n"
        "q.yaml:5:13: optimizer.momentum: expected a number in [0, 1), got '2'\n"
        "q.yaml:7:3: trainer.stpes: unknown key; did you mean 'trainer.steps'?\n"
        "q.yaml:8:12: trainer.devices: expected an integer or a list of device ids, got 'two'\n"
        "q.yaml:9:40: data.batch_size: expected an integer >= 1, got '0'\n"
        "--set model.hidden=128,64: model.hidden: expected a list of integers, got '128,64'; a "
        "list is written [128,64]\n"
        "--set optimizer.lr 0.1: expected KEY=VALUE");
  // The rules whose keys read well are still checked beside the bad values.
  CHECK(errors_of("data: {dataset: synthetic, classes: 1}\n"
                  "trainer: {steps: 5, epochs: 2}\n") ==
        "q.yaml:1:37: data.classes: expected an integer >= 2, got '1'\n"
        "q.yaml:2:11: trainer.steps: conflicts with trainer.epochs (2, set at q.yaml:2:21); set "
        "only one (null unsets a key)");
  // One rule's problem does not hide another's; a missing key has no line, and comes last.
  CHECK(errors_of("data: {dataset: synthetic}\ntrainer: {zero: 1, grad_reduce_dtype: bf16}\n") ==
        "q.yaml:2:20: trainer.grad_reduce_dtype: bf16 with trainer.zero (1, set at q.yaml:2:11) is "
        "not implemented yet; use fp32 with ZeRO\n"
        "q.yaml: trainer: set trainer.steps or trainer.epochs");
}

TEST_CASE("config: hints for lists and device counts written another way") {
  CHECK(error_of(kMinimal, {"trainer.devices=0,1"}) ==
        "--set trainer.devices=0,1: trainer.devices: expected an integer or a list of device ids, "
        "got '0,1'; a list is written [0,1]");
  CHECK(error_of(kMinimal, {"trainer.devices=0"}) ==
        "--set trainer.devices=0: trainer.devices: expected an integer >= 1 or a list of device "
        "ids, got '0'");
  CHECK(error_of(kMinimal, {"optimizer.betas=0.9,0.95"}) ==
        "--set optimizer.betas=0.9,0.95: optimizer.betas: expected a list [beta1, beta2], got "
        "'0.9,0.95'; a list is written [0.9,0.95]");
}

TEST_CASE("config: a nested section's keys are named by their leaves") {
  CHECK(error_of("trainer: {steps: 1, checkpoint_dir: runs}\n") ==
        "q.yaml:1:21: trainer.checkpoint_dir: unknown key; did you mean 'trainer.checkpoint.dir'?");
  CHECK(contains(error_of("trainer: {steps: 1, ckpt: runs}\n"),
                 "valid keys: backend, devices, steps, epochs, seed, log_every, eval_every, "
                 "check_replicas_every, threads_per_device, comm, precision, bucket_cap_mb, "
                 "overlap, grad_reduce_dtype, accumulate_steps, zero, recompute, cuda_graphs, trace, "
                 "report, "
                 "metrics, "
                 "on_nonfinite, max_nonfinite_skips, step_timeout_s, stop_grace_s, "
                 "on_worker_failure, min_workers, keep_global_batch, snapshot_every, checkpoint.dir, "
                 "checkpoint.every_steps, checkpoint.keep_last, checkpoint.overwrite"));
  CHECK(error_of(kMinimal, {"trainer.checkpoint=runs/x"}) ==
        "--set trainer.checkpoint=runs/x: trainer.checkpoint: expected a map of "
        "trainer.checkpoint.dir, trainer.checkpoint.every_steps, trainer.checkpoint.keep_last, "
        "trainer.checkpoint.overwrite, got 'runs/x'");
}

TEST_CASE("config: a missing data file names its key and how its path was resolved") {
  const fs::path dir =
      fs::temp_directory_path() / ("lockstep_test_missing_" + std::to_string(::getpid()));
  fs::create_directories(dir / "configs");
  const fs::path file = dir / "configs" / "c.yaml";
  std::ofstream(file) << "trainer: {steps: 1}\ndata:\n  dataset: csv\n  path: ../data/x.csv\n";
  try {
    load_config(file);
    FAIL("no ConfigError");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) == file.string() + ":4:3: data.path: no such file: " +
                                       (dir / "data" / "x.csv").string() +
                                       " (the config says '../data/x.csv': relative to the "
                                       "config's directory, " + (dir / "configs").string() + ")");
  }
  try {
    load_config(file, std::vector<std::string>{"data.path=absent.csv"});
    FAIL("no ConfigError");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) == "--set data.path=absent.csv: data.path: no such file: " +
                                       (fs::current_path() / "absent.csv").string() +
                                       " (given with --set: relative to the working directory, " +
                                       fs::current_path().string() + ")");
  }
  fs::remove_all(dir);
}

TEST_CASE("config: to_yaml reads back to the same config, from any directory") {
  const fs::path dir =
      fs::temp_directory_path() / ("lockstep_test_to_yaml_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path source = fs::path(LOCKSTEP_SOURCE_DIR) / "configs";
  for (const char* name : {"quickstart.yaml", "gpt_tiny.yaml"}) {
    CAPTURE(name);
    // Every kind of value away from its default: a list, an enum, a path, a null, a nested key.
    const std::vector<std::string> set = {"model.hidden=[7, 5]", "trainer.precision=bf16",
                                          "trainer.trace=t.json", "trainer.epochs=null",
                                          "trainer.steps=9", "trainer.checkpoint.keep_last=4",
                                          "optimizer.eps=1.5e-7",
                                          "trainer.seed=18446744073709551615"};
    const Config original = load_config(source / name, set);
    const fs::path printed = dir / name;
    std::ofstream(printed) << to_yaml(original);
    const Config back = load_config(printed);
    CHECK(config_values(back) == config_values(original));
    CHECK(config_hash(back) == config_hash(original));
    CHECK(back.trainer.trace == fs::absolute("t.json").string());
    CHECK(back.trainer.seed == 18446744073709551615ull);
    CHECK(back.optimizer.eps == 1.5e-7);
    CHECK(to_yaml(back) == to_yaml(original));
  }
  fs::remove_all(dir);
}

TEST_CASE("config: the help lists every key of the schema with its type and default") {
  const std::vector<ConfigKeyHelp> help = config_key_help();
  // Every key but optimizer.betas (another spelling) has a value; data.tokenizer only when set
  // (unset, it is left out of the recorded keys: checkpoints from before it resume).
  Config with_tokenizer;
  with_tokenizer.data.tokenizer = "gpt2";
  const ConfigValues values = config_values(with_tokenizer);
  REQUIRE(help.size() == values.size() + 1);
  for (const auto& [key, value] : values) {
    CAPTURE(key);
    const auto it = std::find_if(help.begin(), help.end(),
                                 [&](const ConfigKeyHelp& h) { return h.key == key; });
    REQUIRE(it != help.end());
    CHECK(!it->type.empty());
    CHECK(!it->description.empty());
  }
  const auto lr = std::find_if(help.begin(), help.end(),
                               [](const ConfigKeyHelp& h) { return h.key == "optimizer.lr"; });
  REQUIRE(lr != help.end());
  CHECK(lr->type == "a number > 0");
  CHECK(lr->default_value == "0.01");
}

TEST_CASE("config: model.lora takes PEFT's target names, and refuses what is not built") {
  const std::string llama =
      "model: {type: gpt, family: llama, vocab_size: 13, lora: {rank: 4, targets: 'q_proj,v_proj'}}\n"
      "data: {dataset: tokens, path: t.bin}\ntrainer: {steps: 1}\n";
  CHECK(parse_config(llama, "q.yaml").model.lora.rank == 4);
  CHECK(contains(errors_of(llama, {"model.lora.targets=q_proj,c_attn"}),
                 "model.lora.targets: 'c_attn' is not a projection: expected q_proj, k_proj"));
  const std::vector<std::string> dropout{"model.lora.dropout=0.1"};  // Note [LoRA dropout]
  CHECK(parse_config(llama, "q.yaml", dropout).model.lora.dropout == 0.1);
  CHECK(contains(errors_of(llama, {"model.lora.dropout=1"}), "model.lora.dropout"));
  // Under bf16 the base is held in bf16 only (Note [Frozen parameters]).
  const std::vector<std::string> bf16{"trainer.precision=bf16"};
  CHECK(parse_config(llama, "q.yaml", bf16).trainer.precision == lockstep::Precision::bf16);
  // GPT-2's blocks by PEFT's module names on Hugging Face's GPT-2, in any precision.
  const std::vector<std::string> gpt2{"model.family=gpt2", "model.lora.targets=c_attn,c_proj"};
  CHECK(parse_config(llama, "q.yaml", gpt2).model.lora.targets == "c_attn,c_proj");
  CHECK(contains(errors_of(llama, {"model.family=gpt2"}),
                 "model.lora.targets: 'q_proj' is not a projection of GPT-2's: expected c_attn, "
                 "attn.c_proj, c_fc, mlp.c_proj, c_proj or all"));
  const std::vector<std::string> gpt2_bf16{"model.family=gpt2", "model.lora.targets=all",
                                           "trainer.precision=bf16"};
  CHECK(parse_config(llama, "q.yaml", gpt2_bf16).trainer.precision == lockstep::Precision::bf16);
}
