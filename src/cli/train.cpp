// `lockstep train`: one run, --resume or --init-from, --dry-run, --scaling; signals stop it
// after a step with a checkpoint.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/command_args.hpp"
#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "cli/signals.hpp"
#include "cli/train_messages.hpp"
#include "io/output_path.hpp"
#include "io/peft.hpp"
#include "train/run_files.hpp"
#include "lockstep/lockstep.hpp"

namespace fs = std::filesystem;

namespace lockstep::cli {
namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string summary_json;
  std::vector<int> scaling;  // device counts
  std::optional<std::string> resume;  // "" = trainer.checkpoint.dir
  std::string init_from;              // weights only: a checkpoint, an export or an HF directory
  bool dry_run = false;  // print the run's plan (steps, memory) and stop before step 1
  bool compare_zero = false;  // --dry-run: the memory plan at trainer.zero 0, 1 and 2
};

std::vector<int> parse_counts(std::string_view flag, const std::string& text) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    int value = 0;
    std::size_t used = 0;
    try {
      value = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 1 || value > 1024)
      throw InputError(fmt::format("{} {}: expected device counts like 1,2,4, got '{}'", flag, text, item));
    out.push_back(value);
    pos = comma + 1;
  }
  return out;
}

TrainArgs parse_train_args(const std::vector<std::string_view>& args) {
  TrainArgs out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    auto value = [&](std::string_view flag) -> std::string {
      if (a.size() > flag.size() && a[flag.size()] == '=') return std::string(a.substr(flag.size() + 1));
      if (i + 1 >= args.size()) throw InputError(fmt::format("{}: expected a value after it", flag));
      return std::string(args[++i]);
    };
    if (a == "--set" || a.starts_with("--set=")) {
      const std::string text = value("--set");
      out.overrides.push_back(override_arg(text, i + 1 < args.size() ? &args[i + 1] : nullptr));
    } else if (a == "--summary-json" || a.starts_with("--summary-json=")) {
      out.summary_json = value("--summary-json");
    } else if (a == "--resume" || a.starts_with("--resume=")) {
      // The path is optional: take the next argument only once CONFIG is known.
      if (a.starts_with("--resume=")) out.resume = std::string(a.substr(9));
      else if (!out.config.empty() && i + 1 < args.size() && !args[i + 1].starts_with("-"))
        out.resume = std::string(args[++i]);
      else out.resume = std::string();
    } else if (a == "--init-from" || a.starts_with("--init-from=")) {
      out.init_from = value("--init-from");
    } else if (a == "--overwrite") {  // Note [A used checkpoint directory]
      out.overrides.push_back("trainer.checkpoint.overwrite=true");
    } else if (a == "--dry-run") {
      out.dry_run = true;
    } else if (a == "--compare-zero") {
      out.compare_zero = true;
    } else if (a == "--scaling" || a.starts_with("--scaling=")) {
      out.scaling = parse_counts("--scaling", value("--scaling"));
    } else if (a.starts_with("-")) {
      unknown_option("train", a, i + 1 < args.size() ? &args[i + 1] : nullptr, true);
    } else if (out.config.empty()) {
      out.config = std::string(a);
    } else {
      throw InputError(fmt::format("train: unexpected argument '{}' (the config is '{}')", a, out.config));
    }
  }
  if (out.config.empty()) throw InputError("train: expected a CONFIG file; see lockstep --help");
  if (out.compare_zero && !out.dry_run)
    throw InputError("train: --compare-zero shows the memory plans of a --dry-run: add --dry-run");
  if (!out.init_from.empty() && !out.scaling.empty())
    throw InputError("train: --scaling trains from the config's initial weights: drop --init-from");
  return out;
}


// Trains once per device count and compares steady-state throughput with the ideal
// (one device's samples/s times N). The first tenth of each run is warm-up and not timed.
int scaling(const Config& base, const DataSplit& data, const TrainArgs& args) {
  struct Point {
    int devices;
    double samples_per_s;
    Summary summary;
  };
  std::vector<Point> points;
  for (int n : args.scaling) {
    Config cfg = base;
    // Each run saves over the one before it: they are this command's (check_run_files has
    // checked the directory as it was).
    cfg.trainer.checkpoint.overwrite = true;
    cfg.trainer.devices.resize(n);
    std::iota(cfg.trainer.devices.begin(), cfg.trainer.devices.end(), 0);
    Trainer trainer(cfg, data.train, data.eval);
    const std::int64_t total = trainer.total_steps();
    const std::int64_t warmup = std::max<std::int64_t>(1, total / 10);
    double t_warm = 0.0, t_end = 0.0;
    trainer.on_progress([&](const StepMetrics& m) {
      if (m.step == warmup) t_warm = m.elapsed_s;
      if (m.step == total) t_end = m.elapsed_s;
    });
    fmt::print("scaling: {} device(s), {} steps\n", n, total);
    std::fflush(stdout);
    const Summary s = trainer.run();
    const double samples = static_cast<double>(total - warmup) * cfg.data.batch_size *
              cfg.trainer.accumulate_steps * n;
    const double sps = total > warmup && t_end > t_warm ? samples / (t_end - t_warm)
                                                        : s.samples_per_s;
    points.push_back({n, sps, s});
  }
  const double one = points.front().samples_per_s / points.front().devices;  // per device
  fmt::print("\n{:>8} {:>12} {:>8} {:>10}  {}\n", "devices", "samples/s", "speedup",
             "efficiency", "ideal = one device's samples/s x N");
  std::string json = "{\n  \"scaling\": [\n";
  for (std::size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    const double speedup = p.samples_per_s / one, efficiency = speedup / p.devices;
    fmt::print("{:>8} {:>12.0f} {:>8.2f} {:>9.0f}%\n", p.devices, p.samples_per_s, speedup,
               100.0 * efficiency);
    json += fmt::format(
        "    {{\"devices\": {}, \"samples_per_s\": {:.6g}, \"speedup\": {:.6g}, "
        "\"efficiency\": {:.6g}, \"summary\": {}}}{}\n",
        p.devices, p.samples_per_s, speedup, efficiency, p.summary.to_json(),
        i + 1 < points.size() ? "," : "");
  }
  json += "  ]\n}\n";
  if (!args.summary_json.empty()) write_file_atomically(args.summary_json, json);
  const bool identical = std::all_of(points.begin(), points.end(),
                                     [](const Point& p) { return p.summary.replicas_identical; });
  return identical ? kExitOk : kExitFailure;
}

// SIGINT/SIGTERM: the first asks the trainer to stop after the current step (and checkpoint),
// and says so at once, before the step ends: a save of a large model takes long enough that a
// silent wait reads as a hang. A second SIGINT exits at once, saying so in one line (and which
// checkpoint it leaves incomplete, and the complete one --resume falls back to, if any). The
// handler only touches lock-free atomics and write(2). It may run on any thread, so it counts
// itself in g_in_handler while it uses the trainer, and detaching waits for that count to
// drop: no handler still holds the trainer once it is destroyed.
std::atomic<int> g_signal{0};
std::atomic<Trainer*> g_trainer{nullptr};
std::atomic<int> g_in_handler{0};
// Whether this process prints the lines (the leader), and what they say: the last step whose
// stop decision the workers agreed on (on_progress), the newest complete checkpoint, and
// trainer.checkpoint.dir as a C string: all set before g_trainer.
std::atomic<bool> g_leader{true};
std::atomic<bool> g_live_progress{false};  // a progress line is redrawn on a terminal
std::atomic<std::int64_t> g_agreed_step{-1};
std::atomic<std::int64_t> g_complete_step{-1};
char g_checkpoint_dir[4096] = "";

extern "C" void on_signal(int sig) {
  if (sig == SIGINT && g_signal.load() != 0) {
    g_in_handler.fetch_add(1);  // never undone: the trainer outlives this process
    const Trainer* t = g_trainer.load();
    if (g_leader.load())
      write_exit_now_line(t ? t->saving_step() : -1, g_checkpoint_dir, g_complete_step.load());
    std::_Exit(128 + SIGINT);
  }
  const bool first = g_signal.exchange(sig) == 0;
  g_in_handler.fetch_add(1);
  Trainer* t = g_trainer.load();
  if (t) t->request_stop();
  if (first && g_leader.load())
    write_stop_line(sig, t ? g_agreed_step.load() : -1, g_checkpoint_dir[0] != '\0',
                    g_live_progress.load());
  g_in_handler.fetch_sub(1);
}

// Installed before the config and data are read, so that a signal during start-up is kept
// (not fatal) and stops the run after its first step, once attach() names the trainer. The
// trainer is named only while an Attachment lives, which the caller declares after the Trainer:
// the scope itself outlives the Trainer, and a signal after the Trainer is gone must not reach
// it.
class SignalScope {
 public:
  class Attachment {
   public:
    Attachment(Trainer& trainer, const std::string& checkpoint_dir, bool leader) {
      if (checkpoint_dir.size() < sizeof g_checkpoint_dir)
        std::memcpy(g_checkpoint_dir, checkpoint_dir.c_str(), checkpoint_dir.size() + 1);
      g_leader.store(leader);
      g_agreed_step.store(trainer.resumed_step());
      g_complete_step.store(newest_complete_step(checkpoint_dir));
      g_trainer.store(&trainer);
      if (g_signal.load() != 0) trainer.request_stop();  // a signal that came before we were ready
    }
    ~Attachment() {
      g_trainer.store(nullptr);
      while (g_in_handler.load() != 0) std::this_thread::yield();
    }
    Attachment(const Attachment&) = delete;
    Attachment& operator=(const Attachment&) = delete;
  };

  SignalScope() : handlers_(on_signal) {}
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  SignalHandlers handlers_;
};

// trainer.backend cuda without a usable GPU, before the run's header says it trains: where the
// key was set (FILE:LINE:COL or --set) and the fix in that spelling (Note [A fix in the
// spelling used]).
void check_backend_usable(const Config& cfg) {
  if (cfg.trainer.backend != BackendKind::cuda) return;
  const std::string why = no_usable_gpu();
  if (why.empty()) return;
  const auto at = cfg.set_at.find("trainer.backend");
  const std::string where = at == cfg.set_at.end() ? cfg.source : at->second;
  const std::string fix = where.starts_with("--set")
                              ? "--set trainer.backend=cpu (or auto: the GPUs when there are "
                                "some, else the CPU)"
                              : "set it to cpu there, or add --set trainer.backend=cpu (or "
                                "auto: the GPUs when there are some, else the CPU)";
  throw InputError(fmt::format("{}: trainer.backend: cuda, but no usable GPU here ({}); to train "
                               "on the CPU, {}",
                               where, why, fix));
}

// What the run reads and writes, before anything is written: no output is an input or another
// output (Note [An output is never an input]), and a new run leaves another run's checkpoints
// alone (Note [A used checkpoint directory]). The Trainer checks its own again, for embedders.
void check_run_files(const TrainArgs& args, const Config& cfg, bool leader) {
  if (!leader) return;
  detail::FileRoles files = detail::run_files(cfg);
  files.input(args.resume.value_or(""), "--resume")
      .input_dir(args.init_from, "--init-from", detail::kHfModelFiles)
      .output(args.summary_json, "--summary-json")
      .check();
  // --scaling's runs are new ones whatever --resume says.
  if (!args.resume || !args.scaling.empty()) detail::check_checkpoint_dir_for_new_run(cfg);
}

// The run's output files: their directories are made now, as checkpoint directories are, and
// each is checked before anything is printed or trained (Note [Checking an output]). The
// Trainer checks its own again, for embedders.
void prepare_cli_outputs(const TrainArgs& args, const TrainerConfig& tc, bool leader) {
  if (!leader) return;
  const std::pair<std::string_view, const std::string*> outputs[] = {
      {"--summary-json", &args.summary_json}, {"trainer.report", &tc.report},
      {"trainer.metrics", &tc.metrics}, {"trainer.trace", &tc.trace}};
  for (const auto& [name, file] : outputs)
    if (!file->empty()) detail::prepare_output_file(*file, name);
}

// --resume [DIR|FILE]: loads the checkpoint into `trainer`, or warns that there is none.
void resume_exactly(Trainer& trainer, const Config& cfg, const TrainArgs& args, bool leader) {
  const fs::path from =
      args.resume->empty() ? fs::path(cfg.trainer.checkpoint.dir) : fs::path(*args.resume);
  if (from.empty())
    throw InputError("--resume: give a checkpoint DIR or FILE, or set trainer.checkpoint.dir");
  std::optional<Checkpoint> ckpt;
  if (fs::is_directory(from)) {
    try {
      ckpt = CheckpointManager(from, 0).load_latest(warn);
    } catch (const InputError& e) {  // none complete: the weights of one may still be whole
      throw InputError(e.what() + init_from_hint(from, args.config, args.overrides));
    }
  } else if (fs::exists(from)) {
    ckpt = CheckpointManager::load(from, warn);
  } else if (!args.resume->empty()) {
    throw InputError(fmt::format("--resume {}: no such file or directory", from.string()));
  }
  if (ckpt) {
    if (leader)
      fmt::print("resuming from {} (step {})\n", ckpt->weights_file.string(), ckpt->state.step);
    trainer.resume_from(std::move(*ckpt));
    if (leader) print_resume_changes(stdout, trainer);
  } else {
    warn(fmt::format("--resume: no checkpoint in {}; starting from scratch", from.string()));
  }
}

// --resume continues one run exactly; a user who wants the weights alone (another config, an
// export, new data) is told about --init-from.
void resume(Trainer& trainer, const Config& cfg, const TrainArgs& args, bool leader) {
  try {
    resume_exactly(trainer, cfg, args, leader);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}\n  (--resume continues a run exactly, with its optimiser "
                                 "state and config; to start a new run from these weights, use "
                                 "--init-from)", e.what()));
  }
}

// Note [--init-from's model]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Hugging Face directory says its own shape (config.json), so a fine-tuning config need not:
// the model.* keys the config does not set are taken from the weights' record (config.json, or
// a checkpoint's "lockstep.model"), as ConfigDefaults, and printed; so is data.tokenizer, from a
// directory with a tokenizer's files. The keys the config does set must agree: every
// disagreement is reported at once, each with the --set that fixes it. One exception: a model
// with rotary positions (the Llama family) may train at a shorter context than
// max_position_embeddings, which is a limit, not a shape (nor above a Mistral's sliding_window).
struct InitFromModel {
  WeightsModel weights;
  ConfigDefaults defaults;
};

std::optional<InitFromModel> init_from_model(const std::string& path) {
  std::optional<WeightsModel> weights = weights_model(path);
  if (!weights) return std::nullopt;
  InitFromModel out{*weights, {weights->file.string(), {}}};
  for (const auto& [key, value] : weights->keys)
    out.defaults.values.push_back(fmt::format("model.{}={}", key, value));
  const fs::path dir(path);
  if (fs::exists(dir / "tokenizer.json") ||
      (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")))
    out.defaults.values.push_back("data.tokenizer=" + path);
  return out;
}

// Whether two values of a key, as text, are the same: numbers by value (1e-05 and 0.00001).
bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  char *end_a = nullptr, *end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
  return !a.empty() && !b.empty() && *end_a == '\0' && *end_b == '\0' && x == y;
}

// The config with --init-from's model (Note [--init-from's model]).
Config config_with_weights(const std::string& config, const std::vector<std::string>& overrides,
                           const std::string& init_from, bool leader,
                           const ConfigReading& reading) {
  const std::optional<InitFromModel> from =
      init_from.empty() ? std::nullopt : init_from_model(init_from);
  Config cfg = load_config(config, overrides, from ? from->defaults : ConfigDefaults{}, reading);
  if (!from) return cfg;
  if (cfg.model.type != "gpt") return cfg;
  const ConfigValues values = config_values(cfg);
  std::vector<std::string> taken, disagreements;
  for (const auto& [name, theirs] : from->weights.keys) {
    const std::string key = "model." + name;
    const auto mine = std::find_if(values.begin(), values.end(),
                                   [&](const auto& v) { return v.first == key; });
    const auto at = cfg.set_at.find(key);
    if (at == cfg.set_at.end()) {
      taken.push_back(fmt::format("{} {}", key, theirs));
    } else if (mine == values.end() || !same_value(mine->second, theirs)) {
      if (name == "context" && from->weights.max_context > 0 &&
          cfg.model.context <= from->weights.max_context)
        continue;  // rotary positions: the run may train at a shorter context
      disagreements.push_back(fmt::format("  {} is {} ({}), {} in the weights: --set {}={}", key,
                                          mine == values.end() ? "unset" : mine->second,
                                          at->second, theirs, key, theirs));
    }
  }
  if (!disagreements.empty())
    throw InputError(fmt::format("--init-from {}: the config's model is not the one {} "
                                 "describes:\n{}", init_from, from->weights.file.string(),
                                 fmt::join(disagreements, "\n")));
  if (from->weights.max_context > 0 && cfg.model.context > from->weights.max_context)
    throw InputError(fmt::format("--init-from {}: model.context is {}, above the {} tokens of {}'s "
                                 "{}: --set model.context={}", init_from, cfg.model.context,
                                 from->weights.max_context, from->weights.file.string(),
                                 from->weights.max_context_field, from->weights.max_context));
  if (!cfg.set_at.contains("data.tokenizer") && cfg.data.tokenizer == init_from)
    taken.push_back("data.tokenizer " + init_from);
  if (leader && !taken.empty())
    fmt::print("from {}: {} (the keys the config does not set)\n", from->weights.file.string(),
               fmt::join(taken, ", "));
  return cfg;
}

// --init-from a PEFT adapter directory (Note [PEFT adapters] in src/io/peft.cpp): its base is
// the directory its adapter_config.json names (base_model_name_or_path, taken as it is, or
// relative to the adapter directory); anything else is its own weights.
std::string weights_of(const std::string& path) {
  if (!detail::is_peft_dir(path)) return path;
  const detail::PeftAdapter adapter = detail::read_peft_config(path);
  for (const fs::path& base : {fs::path(adapter.base), fs::path(path) / adapter.base})
    if (!adapter.base.empty() && fs::exists(base)) return base.string();
  throw InputError(fmt::format(
      "{}: base_model_name_or_path '{}' is not a directory here: the adapter's base must be a "
      "local Hugging Face directory",
      (fs::path(path) / detail::kPeftConfigName).string(), adapter.base));
}

Config load_config_for(const TrainArgs& args, bool leader) {
  Config cfg = config_with_weights(args.config, args.overrides, weights_of(args.init_from), leader, {});
  // LoRA: a resumed run reads its frozen base again (Note [Frozen parameters]).
  if (!args.init_from.empty() && args.resume && cfg.model.lora.rank == 0)
    throw InputError("train: --resume continues a run exactly, --init-from starts a new one from "
                     "weights: give one or the other (with model.lora, --init-from gives the "
                     "frozen base a resumed run needs)");
  return cfg;
}

// --init-from PATH: the weights alone, in the config's model. A LoRA model's are its frozen
// base; from a PEFT adapter directory, the base it names and the adapters too, which must be
// the config's model.lora.
void init_from(Trainer& trainer, const Config& cfg, const std::string& path, bool leader) {
  const Model& model = trainer.model();
  const bool lora = model.frozen_count() > 0;
  if (detail::is_peft_dir(path)) {
    if (!lora)
      throw InputError(fmt::format("--init-from {}: a PEFT adapter, but model.lora.rank is 0: "
                                   "set model.lora as its adapter_config.json says", path));
    detail::PeftAdapter adapter = detail::read_peft_adapter(path, model.param_tensors());
    const LoraSpec mine = lora_spec(cfg.model);
    if (adapter.lora.rank != mine.rank || adapter.lora.alpha != mine.alpha ||
        adapter.lora.targets != mine.targets || adapter.dropout != mine.dropout)
      throw InputError(fmt::format(
          "{}: r {}, lora_alpha {}, target_modules {}, lora_dropout {}; the config's model.lora "
          "has rank {}, alpha {}, targets {}, dropout {}",
          (fs::path(path) / detail::kPeftConfigName).string(), adapter.lora.rank,
          adapter.lora.alpha, fmt::join(adapter.lora.targets, ","), adapter.dropout, mine.rank,
          mine.alpha, fmt::join(mine.targets, ","), mine.dropout));
    init_from(trainer, cfg, weights_of(path), leader);
    if (!trainer.resumed_step()) trainer.init_adapters(std::move(adapter.adapters));
    if (leader) fmt::print("adapters from {}\n", adapter.file.string());
    return;
  }
  Weights weights = load_weights(path, lora ? model.frozen_tensors() : model.param_tensors());
  if (leader)
    fmt::print("initialised from {} (weights only: step 0, a fresh optimiser and schedule)\n",
               weights.file.string());
  trainer.init_from(std::move(weights));
}

// A batch larger than a worker's shard repeats samples within every batch (the sampler pads
// the shard by wrap-around): legal, but rarely meant.
void warn_if_batch_exceeds_shard(const Config& cfg, const Dataset& train,
                                 const std::shared_ptr<ProcessGroup>& processes) {
  const std::size_t workers = cfg.trainer.devices.size() * (processes ? processes->size() : 1);
  const std::size_t shard = (train.size() + workers - 1) / workers;
  if (static_cast<std::size_t>(cfg.data.batch_size) > shard)
    warn(fmt::format("data.batch_size {} is larger than each worker's shard of {} samples ({} "
                     "training samples over {} workers): every batch repeats samples",
                     cfg.data.batch_size, shard, train.size(), workers));
}

// More CPU workers than hardware threads share the cores (configs/gpt2_124m.yaml's 8 devices on
// a 2-core machine under backend auto): legal, but rarely meant.
void warn_if_workers_exceed_cores(const Config& cfg) {
  const auto cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t workers = cfg.trainer.devices.size();
  if (backend_name(cfg.trainer.backend, cfg.trainer.devices) == "cpu" && workers > cores)
    warn(fmt::format("trainer.devices: {} CPU workers on {} hardware threads share the cores "
                     "(this is not an error, but each step waits for the slowest share; "
                     "--set trainer.devices={} gives each worker its own)",
                     workers, cores, cores));
}

// The line that opens a run, printed by the leader.
void print_run_header(const Trainer& trainer, const Config& cfg,
                      const std::shared_ptr<ProcessGroup>& processes) {
  if (processes && processes->size() > 1)
    fmt::print("training {} parameters on {} worker(s) ({} processes x {}), {} steps, batch {} "
               "per worker\n",
               trainer.model().param_count(), cfg.trainer.devices.size() * processes->size(),
               processes->size(), cfg.trainer.devices.size(), trainer.total_steps(),
               cfg.data.batch_size);
  else
    fmt::print("training {} parameters on {} worker(s), {} steps, batch {} per worker\n",
               trainer.model().param_count(), cfg.trainer.devices.size(), trainer.total_steps(),
               cfg.data.batch_size);
}

// Runs `trainer` with its metrics shown as progress; signals reach it while it runs.
Summary run_with_progress(Trainer& trainer, const std::string& checkpoint_dir, bool leader) {
  const bool live = isatty(STDERR_FILENO) != 0;
  Progress progress(live ? stderr : stdout, live);
  g_live_progress.store(live);
  trainer.on_progress([&](const StepMetrics& m) {
    g_agreed_step.store(m.step);
    progress.step(m);
  });
  trainer.on_step([&](const StepMetrics& m) { progress.log(m); });
  trainer.on_eval([&](const EvalMetrics& m) {
    progress.eval(m);
  });
  trainer.on_checkpoint([&](std::int64_t step, const std::string& weights_file) {
    g_complete_step.store(step);
    progress.checkpoint(step, weights_file);
  });
  Summary summary;
  try {
    const SignalScope::Attachment attached(trainer, checkpoint_dir, leader);
    summary = trainer.run();
  } catch (...) {
    progress.finish();
    throw;
  }
  progress.finish();
  return summary;
}

}  // namespace

int train(const std::vector<std::string_view>& argv,
          const std::shared_ptr<ProcessGroup>& processes) {
  const TrainArgs args = parse_train_args(argv);
  const bool several = processes && processes->size() > 1;
  const bool leader = !processes || processes->rank() == 0;  // prints and writes

  std::optional<SignalScope> signals;  // --scaling keeps the default handlers: Ctrl-C ends it
  if (args.scaling.empty()) signals.emplace();
  set_phase("reading the config");
  const Config cfg = load_config_for(args, leader);
  check_run_files(args, cfg, leader);
  check_backend_usable(cfg);
  prepare_cli_outputs(args, cfg.trainer, leader);
  set_phase("loading the data");
  const DataSplit data = load_dataset(cfg);  // paths already resolved: Note [Config paths]
  set_phase("setting up the trainer");

  if (!args.scaling.empty()) {
    if (several) throw InputError("--scaling: trains within one process; run it without mpirun");
    return scaling(cfg, data, args);
  }

  Trainer trainer(cfg, data.train, data.eval, processes);
  if (args.resume) resume(trainer, cfg, args, leader);
  if (!args.init_from.empty()) init_from(trainer, cfg, args.init_from, leader);
  if (trainer.resumed_step() >= trainer.total_steps()) {
    if (leader)
      fmt::print("nothing to do: the checkpoint is at step {} and the run has {} steps (raise "
                 "trainer.steps to train on)\n", trainer.resumed_step(), trainer.total_steps());
    return kExitOk;
  }
  if (leader) {
    print_run_header(trainer, cfg, processes);
    print_outputs(stdout, cfg, args.summary_json);
    warn_if_batch_exceeds_shard(cfg, *data.train, processes);
    warn_if_workers_exceed_cores(cfg);
  }
  if (args.dry_run) {
    if (cfg.model.type == "gpt") {
      const AttentionChoice attention = attention_choice(cfg);
      fmt::print("attention: {}: {}\n", to_string(attention.path), attention.detail);
    }
    if (args.compare_zero) {
      fmt::print("memory plans by trainer.zero:\n{}", trainer.memory_plans_by_zero());
      return kExitOk;
    }
    fmt::print("memory plan: {}\n", trainer.memory_plan());
    return kExitOk;
  }
  std::fflush(stdout);
  set_phase("training");
  const Summary summary = run_with_progress(trainer, cfg.trainer.checkpoint.dir, leader);
  set_phase("writing the outputs");
  if (leader) {
    print_summary(stdout, summary);
    if (!args.summary_json.empty()) write_file_atomically(args.summary_json, summary.to_json());
  }
  if (const int sig = g_signal.load(); sig != 0 && leader) {
    fmt::print(stderr, "lockstep: stopped by signal {} after step {}{}\n", sig, summary.steps,
               summary.last_checkpoint.empty() ? " (no trainer.checkpoint.dir: nothing saved)"
                                               : "; checkpoint " + summary.last_checkpoint);
    return 128 + sig;
  }
  return summary.replicas_identical ? kExitOk : kExitFailure;
}

int train_stop_signal() { return g_signal.load(); }

Config load_config_with_weights(const std::string& config, const std::vector<std::string>& overrides,
                                const std::string& init_from, const ConfigReading& reading) {
  return config_with_weights(config, overrides, init_from, /*leader=*/false, reading);
}

}  // namespace lockstep::cli
