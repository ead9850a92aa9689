// The `lockstep` command line.
//
// Exit codes: 0 success, 1 run-time failure, 2 bad input (config, flags, data files).
//
// Under mpirun or srun, every process runs this command with the same arguments: process 0
// prints and writes, the others are quiet but for errors. A process that fails ends the whole
// job (MPI_Abort) after its own workers have stopped, so no process is left waiting.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <sstream>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <csignal>
#include <atomic>
#include <new>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "cli/train_messages.hpp"
#include "io/output_path.hpp"
#include "lockstep/lockstep.hpp"
#include "lockstep/tokenizer.hpp"

namespace fs = std::filesystem;

namespace lockstep::cli {
namespace {

constexpr std::string_view kUsage = R"(usage: lockstep <command> [options]

commands:
  train CONFIG [--set KEY=VALUE]... [--summary-json FILE] [--scaling N,N,...]
        [--resume [DIR|FILE] | --init-from CKPT] [--dry-run]
                      train the model described by the YAML file CONFIG on every
                      configured device; --set overrides a config key (repeatable),
                      e.g. --set trainer.devices=4 --set optimizer.lr=0.05;
                      --scaling 1,2,4 trains once per device count and reports
                      samples/s, speedup and efficiency against one device;
                      --resume continues from the latest valid checkpoint in DIR
                      (default: trainer.checkpoint.dir) or from one checkpoint FILE;
                      --init-from starts from the weights alone of a checkpoint, an
                      export or a Hugging Face GPT-2 directory (step 0, fresh
                      optimiser): fine-tuning.
                      --dry-run checks everything, prints the memory plan (bytes
                      per worker and on the host, against what this process may
                      use) and stops before step 1.
                      SIGINT/SIGTERM finish the step, write a checkpoint and exit
                      130/143; a second SIGINT exits at once
  eval CONFIG --checkpoint CKPT [--set KEY=VALUE]...
                      loss and accuracy of a checkpoint on the config's eval split
  export CKPT --out FILE [--format torch] [--dtype fp32|bf16]
  export CKPT --format hf --out DIR [--dtype fp32|bf16]
                      write a checkpoint's weights as one safetensors file (with an
                      MLP's standardisation as normalize.mean and normalize.std), or
                      a GPT's as a Hugging Face GPT-2 directory (model.safetensors
                      and config.json for transformers.GPT2LMHeadModel); --dtype
                      bf16 stores every tensor as BF16 (rounded to nearest even)
  sample --checkpoint CKPT [--prompt TEXT] [--tokens N] [--temperature T]
         [--top-k K] [--seed S] [--backend auto|cpu|cuda] [--tokenizer DIR|FILE]
                      continue TEXT with a GPT checkpoint (model.type gpt): N
                      tokens (200), temperature T (0.8; 0 is greedy), from the K
                      most likely (0: all), seeded by S (0). A text model reads
                      and writes bytes; a token model reads and writes ids, or
                      text with --tokenizer (lockstep tokenize's)
  tokenize --tokenizer DIR|FILE --out FILE [--eval-out FILE --eval-fraction F]
           [--format llmc|raw] INPUT...
                      GPT-2's BPE over text into an llm.c token file, ready for
                      data.dataset: tokens. DIR|FILE: a Hugging Face GPT-2
                      directory (tokenizer.json, or vocab.json and merges.txt) or
                      a tiktoken rank file. Each INPUT is a document (a text
                      file; - is standard input) or one per line (.jsonl, its
                      "text" field), each preceded by <|endoftext|>. --eval-out
                      takes about F of the tokens (whole documents, or 16 KiB
                      parts of long ones). uint16 tokens (uint32 above 65,536
                      ids); --format raw writes no header
  devices             list the backends and devices this binary can use, and
                      whether MPI support is built in

under mpirun -np P (or srun), each process trains on its own trainer.devices
and the job trains as one: P x devices workers

options:
  -h, --help          show this help
  --version           print the version

exit codes: 0 ok, 1 run-time failure, 2 bad input (config, flags, data)
)";

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string summary_json;
  std::vector<int> scaling;  // device counts
  std::optional<std::string> resume;  // "" = trainer.checkpoint.dir
  std::string init_from;              // weights only: a checkpoint, an export or an HF directory
  bool dry_run = false;  // print the run's plan (steps, memory) and stop before step 1
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
      out.overrides.push_back(value("--set"));
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
    } else if (a == "--dry-run") {
      out.dry_run = true;
    } else if (a == "--scaling" || a.starts_with("--scaling=")) {
      out.scaling = parse_counts("--scaling", value("--scaling"));
    } else if (a.starts_with("-")) {
      throw InputError(fmt::format("train: unknown option '{}'; see lockstep --help", a));
    } else if (out.config.empty()) {
      out.config = std::string(a);
    } else {
      throw InputError(fmt::format("train: unexpected argument '{}' (the config is '{}')", a, out.config));
    }
  }
  if (out.config.empty()) throw InputError("train: expected a CONFIG file; see lockstep --help");
  if (!out.init_from.empty() && out.resume)
    throw InputError("train: --resume continues a run exactly, --init-from starts a new one from "
                     "weights: give one or the other");
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

// SIGINT/SIGTERM: the first asks the trainer to stop after the current step (and checkpoint);
// a second SIGINT exits at once, saying so in one line (and which checkpoint it leaves
// incomplete: the next --resume falls back to the previous one). The handler only touches
// lock-free atomics. It may run on any thread, so it counts itself in g_in_handler while it uses
// the trainer, and detaching waits for that count to drop: no handler still holds the trainer
// once it is destroyed.
std::atomic<int> g_signal{0};
std::atomic<Trainer*> g_trainer{nullptr};
std::atomic<int> g_in_handler{0};

extern "C" void on_signal(int sig) {
  if (sig == SIGINT && g_signal.load() != 0) {
    g_in_handler.fetch_add(1);  // never undone: the trainer outlives this process
    const Trainer* t = g_trainer.load();
    write_exit_now_line(t ? t->saving_step() : -1);
    std::_Exit(128 + SIGINT);
  }
  g_signal.store(sig);
  g_in_handler.fetch_add(1);
  if (Trainer* t = g_trainer.load()) t->request_stop();
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
    explicit Attachment(Trainer& trainer) {
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

  SignalScope() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// What the command is doing, for a std::bad_alloc that gets past the memory plan to main()
// (Note [Memory plan]): the report names the phase, since bad_alloc names nothing.
std::atomic<const char*> g_phase{"starting"};

void warn(const std::string& message) { fmt::print(stderr, "lockstep: warning: {}\n", message); }

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

// --init-from PATH: the weights alone, in the config's model.
void init_from(Trainer& trainer, const std::string& path, bool leader) {
  Weights weights = load_weights(path, trainer.model().param_tensors());
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
Summary run_with_progress(Trainer& trainer) {
  const bool live = isatty(STDERR_FILENO) != 0;
  Progress progress(live ? stderr : stdout, live);
  trainer.on_progress([&](const StepMetrics& m) {
    progress.step(m);
  });
  trainer.on_step([&](const StepMetrics& m) { progress.log(m); });
  trainer.on_eval([&](const EvalMetrics& m) {
    progress.eval(m);
  });
  trainer.on_checkpoint([&](std::int64_t step, const std::string& weights_file) {
    progress.checkpoint(step, weights_file);
  });
  Summary summary;
  try {
    const SignalScope::Attachment attached(trainer);
    summary = trainer.run();
  } catch (...) {
    progress.finish();
    throw;
  }
  progress.finish();
  return summary;
}

int train(const std::vector<std::string_view>& argv,
          const std::shared_ptr<ProcessGroup>& processes) {
  const TrainArgs args = parse_train_args(argv);
  const bool several = processes && processes->size() > 1;
  const bool leader = !processes || processes->rank() == 0;  // prints and writes

  std::optional<SignalScope> signals;  // --scaling keeps the default handlers: Ctrl-C ends it
  if (args.scaling.empty()) signals.emplace();
  g_phase = "reading the config";
  const Config cfg = load_config(args.config, args.overrides);
  prepare_cli_outputs(args, cfg.trainer, leader);
  g_phase = "loading the data";
  const DataSplit data = load_dataset(cfg);  // paths already resolved: Note [Config paths]
  g_phase = "setting up the trainer";

  if (!args.scaling.empty()) {
    if (several) throw InputError("--scaling: trains within one process; run it without mpirun");
    return scaling(cfg, data, args);
  }

  Trainer trainer(cfg, data.train, data.eval, processes);
  if (args.resume) resume(trainer, cfg, args, leader);
  if (!args.init_from.empty()) init_from(trainer, args.init_from, leader);
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
  }
  if (args.dry_run) {
    if (cfg.model.type == "gpt") {
      const AttentionChoice attention = attention_choice(cfg);
      fmt::print("attention: {}: {}\n", to_string(attention.path), attention.detail);
    }
    fmt::print("memory plan: {}\n", trainer.memory_plan());
    return kExitOk;
  }
  std::fflush(stdout);
  g_phase = "training";
  const Summary summary = run_with_progress(trainer);
  g_phase = "writing the outputs";
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

// Options shared by eval, export and sample: at most one positional argument, named values
// (--flag VALUE or --flag=VALUE, the last one wins) and repeatable --set overrides.
struct CommandArgs {
  std::string positional;
  std::vector<std::string> overrides;
  std::map<std::string, std::string, std::less<>> named;
  std::string get(std::string_view flag) const {
    const auto it = named.find(flag);
    return it == named.end() ? std::string() : it->second;
  }
};

CommandArgs parse_command_args(std::string_view command, const std::vector<std::string_view>& args,
                               std::initializer_list<std::string_view> flags) {
  CommandArgs out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    const auto it = std::find_if(flags.begin(), flags.end(), [&](std::string_view f) {
      return a == f || (a.starts_with(f) && a.size() > f.size() && a[f.size()] == '=');
    });
    if (it != flags.end()) {
      std::string value;
      if (a.size() > it->size()) value = std::string(a.substr(it->size() + 1));
      else if (i + 1 < args.size()) value = std::string(args[++i]);
      else throw InputError(fmt::format("{}: expected a value after it", *it));
      if (*it == "--set") out.overrides.push_back(value);
      else out.named[std::string(*it)] = value;
    } else if (a.starts_with("-")) {
      throw InputError(fmt::format("{}: unknown option '{}'; see lockstep --help", command, a));
    } else if (out.positional.empty()) {
      out.positional = std::string(a);
    } else {
      throw InputError(fmt::format("{}: unexpected argument '{}'", command, a));
    }
  }
  return out;
}

// The model a checkpoint records must be the config's: the same tensors with another activation
// or other heads would evaluate another model.
void check_recorded_model(const Checkpoint& ckpt, const Config& cfg, const Dataset& train) {
  const auto recorded = ckpt.metadata.find("lockstep.model");
  if (recorded == ckpt.metadata.end()) return;  // written before checkpoints recorded it
  if (const std::string mine = describe_model(cfg, train); recorded->second != mine)
    throw InputError(fmt::format("{}: the checkpoint records the model '{}', {} describes '{}': "
                                 "a checkpoint of another model", ckpt.weights_file.string(),
                                 recorded->second, cfg.source, mine));
}

// The config's eval split prepared as the checkpoint's model expects: raw features
// standardised with the statistics it was trained with, whatever data.normalize says.
InMemoryDataset prepared_eval_split(Config cfg, const Standardization& s) {
  cfg.data.normalize = false;
  const DataSplit raw = load_dataset(cfg);
  const Dataset& eval = *raw.eval;
  const auto f = static_cast<std::size_t>(eval.features());
  if (s.mean.size() != f)
    throw InputError(fmt::format("{}: the checkpoint standardises {} features, the data has {}",
                                 cfg.source, s.mean.size(), f));
  std::vector<float> x(eval.size() * f);
  std::vector<std::int32_t> y(eval.size());
  for (std::size_t i = 0; i < eval.size(); ++i) eval.get(i, x.data() + i * f, &y[i]);
  InMemoryDataset out(std::move(x), std::move(y), eval.features(), raw.train->classes());
  out.standardize(s.mean, s.std);
  return out;
}

int eval(const std::vector<std::string_view>& argv) {
  const CommandArgs args = parse_command_args("eval", argv, {"--set", "--checkpoint"});
  if (args.positional.empty()) throw InputError("eval: expected a CONFIG file; see lockstep --help");
  if (args.get("--checkpoint").empty()) throw InputError("eval: expected --checkpoint CKPT");
  const Config cfg = load_config(args.positional, args.overrides);
  const DataSplit data = load_dataset(cfg);
  if (!data.eval || data.eval->size() == 0)
    throw InputError(fmt::format("{}: data.eval_fraction: the eval split is empty", cfg.source));
  const Checkpoint ckpt = CheckpointManager::load(args.get("--checkpoint"), warn);
  check_recorded_model(ckpt, cfg, *data.train);
  const Model model = make_model(cfg, *data.train);
  check_layout(ckpt, model.param_tensors());
  const std::optional<Standardization> standardization = read_standardization(ckpt.metadata);
  const EvalMetrics m =
      standardization
          ? evaluate(cfg, model, ckpt.params, prepared_eval_split(cfg, *standardization))
          : evaluate(cfg, model, ckpt.params, *data.eval);
  fmt::print("checkpoint {} (step {})\n", ckpt.weights_file.string(), ckpt.state.step);
  fmt::print("eval loss {:.6f} accuracy {:.4f} ({} samples)\n", m.loss, m.accuracy, m.samples);
  return kExitOk;
}

// Writing over the weights (or the state) just read would destroy the checkpoint.
void refuse_own_input(const fs::path& out, const Checkpoint& ckpt) {
  const fs::path state = fs::path(ckpt.weights_file).replace_extension(".state");
  for (const fs::path& input : {ckpt.weights_file, state}) {
    std::error_code ec;
    if (fs::equivalent(out, input, ec))
      throw InputError(fmt::format("export --out {}: is the checkpoint's own {}; write the export "
                                   "elsewhere", out.string(), input.string()));
  }
}

int export_weights(const std::vector<std::string_view>& argv) {
  const CommandArgs args = parse_command_args("export", argv, {"--out", "--format", "--dtype"});
  if (args.positional.empty()) throw InputError("export: expected a checkpoint CKPT; see lockstep --help");
  const std::string out = args.get("--out");
  const std::string format = args.get("--format").empty() ? "torch" : args.get("--format");
  if (format != "torch" && format != "hf")
    throw InputError(fmt::format("--format: expected torch or hf, got '{}'", format));
  const std::string dtype_name = args.get("--dtype").empty() ? "fp32" : args.get("--dtype");
  if (dtype_name != "fp32" && dtype_name != "bf16")
    throw InputError(fmt::format("--dtype: expected fp32 or bf16, got '{}'", dtype_name));
  const TensorDtype dtype = dtype_name == "bf16" ? TensorDtype::bf16 : TensorDtype::f32;
  if (out.empty()) throw InputError(format == "hf" ? "export: expected --out DIR" : "export: expected --out FILE");
  if (format == "hf") detail::check_output_dir(out, "export --out");
  else detail::check_output_file(out, "export --out");
  const Checkpoint ckpt = CheckpointManager::load(args.positional, warn);
  refuse_own_input(format == "hf" ? fs::path(out) / "model.safetensors" : fs::path(out), ckpt);
  if (format == "hf") export_hf_gpt2(ckpt, out, dtype);
  else export_torch(ckpt, out, dtype);
  fmt::print("wrote {} ({} tensors, {} parameters, step {})\n", out, ckpt.tensors.size(),
             ckpt.params.size(), ckpt.state.step);
  return kExitOk;
}

// Reads a number for `flag`, or `fallback` when the flag was not given.
template <class T>
T number_flag(const CommandArgs& args, std::string_view flag, T fallback) {
  const std::string text = args.get(flag);
  if (text.empty()) return fallback;
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size())
    throw InputError(fmt::format("{}: expected a number, got '{}'", flag, text));
  return value;
}

// --tokens, --temperature, --top-k and --seed, checked.
SamplingOptions sampling_options(const CommandArgs& args) {
  SamplingOptions opt{.tokens = number_flag(args, "--tokens", 200),
                      .temperature = number_flag(args, "--temperature", 0.8),
                      .top_k = number_flag(args, "--top-k", 0),
                      .seed = number_flag<std::uint64_t>(args, "--seed", 0)};
  if (opt.tokens < 0) throw InputError(fmt::format("--tokens: expected >= 0, got {}", opt.tokens));
  if (!(opt.temperature >= 0.0))
    throw InputError(fmt::format("--temperature: expected >= 0, got {}", opt.temperature));
  if (opt.top_k < 0) throw InputError(fmt::format("--top-k: expected >= 0, got {}", opt.top_k));
  return opt;
}

// The GPT architecture a checkpoint records in its metadata.
GptSpec checkpoint_gpt_spec(const Checkpoint& ckpt) {
  const auto model_it = ckpt.metadata.find("lockstep.model");
  if (model_it == ckpt.metadata.end() || !model_it->second.starts_with("gpt "))
    throw InputError(fmt::format("{}: {}: not a GPT checkpoint (sample needs model.type gpt)",
                                 ckpt.weights_file.string(),
                                 model_it == ckpt.metadata.end()
                                     ? "no lockstep.model in the metadata"
                                     : "the metadata says '" + model_it->second + "'"));
  try {
    return parse_gpt_spec(model_it->second);
  } catch (const std::invalid_argument& e) {
    throw InputError(fmt::format("{}: {}", ckpt.weights_file.string(), e.what()));
  }
}

// The prompt: UTF-8 bytes for a text model; token ids separated by spaces or commas otherwise.
// An empty prompt starts from a newline (text) or token 0.
std::vector<int> parse_prompt(const std::string& text, bool bytes, const GptSpec& spec) {
  std::vector<int> prompt;
  if (bytes) {
    for (unsigned char c : text) prompt.push_back(c);
    if (prompt.empty()) prompt.push_back('\n');
    return prompt;
  }
  std::string ids = text;
  std::replace(ids.begin(), ids.end(), ',', ' ');
  std::istringstream in(ids);
  std::string word;
  while (in >> word) {
    int id = -1;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc{} || end != word.data() + word.size() || id < 0 || id >= spec.vocab_size)
      throw InputError(fmt::format("--prompt: this model reads token ids in [0, {}), got '{}'",
                                   spec.vocab_size, word));
    prompt.push_back(id);
  }
  if (prompt.empty()) prompt.push_back(0);
  return prompt;
}

// --backend auto|cpu|cuda.
BackendKind backend_flag(const CommandArgs& args) {
  const std::string name = args.get("--backend");
  if (name == "cpu") return BackendKind::cpu;
  if (name == "cuda") return BackendKind::cuda;
  if (!name.empty() && name != "auto")
    throw InputError(fmt::format("--backend: expected auto, cpu or cuda, got '{}'", name));
  return BackendKind::automatic;
}

// --tokenizer for a token model: the prompt as text, encoded (an empty one is <|endoftext|>).
std::optional<Tokenizer> sample_tokenizer(const CommandArgs& args, const GptSpec& spec) {
  const std::string path = args.get("--tokenizer");
  if (path.empty()) return std::nullopt;
  Tokenizer tokenizer = Tokenizer::load(path);
  if (tokenizer.vocab_size() > static_cast<std::size_t>(spec.vocab_size))
    throw InputError(fmt::format("--tokenizer {}: {} ids, but the model has {}: not the tokenizer "
                                 "it was trained with", path, tokenizer.vocab_size(),
                                 spec.vocab_size));
  return tokenizer;
}

int sample(const std::vector<std::string_view>& argv) {
  const CommandArgs args = parse_command_args(
      "sample", argv,
      {"--checkpoint", "--prompt", "--tokens", "--temperature", "--top-k", "--seed", "--backend",
       "--tokenizer"});
  if (!args.positional.empty())
    throw InputError(fmt::format("sample: unexpected argument '{}'; see lockstep --help", args.positional));
  const std::string path = args.get("--checkpoint");
  if (path.empty()) throw InputError("sample: expected --checkpoint CKPT");
  const SamplingOptions opt = sampling_options(args);

  const Checkpoint ckpt = CheckpointManager::load(path, warn);
  const GptSpec spec = checkpoint_gpt_spec(ckpt);
  const Model model = Model::gpt(spec);
  check_layout(ckpt, model.param_tensors());
  const bool bytes = ckpt.metadata.count("lockstep.tokenizer") &&
                     ckpt.metadata.at("lockstep.tokenizer") == "bytes";
  const std::optional<Tokenizer> tokenizer = bytes ? std::nullopt : sample_tokenizer(args, spec);
  const std::string prompt_text = args.get("--prompt");
  std::vector<int> prompt;
  if (tokenizer) {
    for (const TokenId id : tokenizer->encode(prompt_text)) prompt.push_back(static_cast<int>(id));
    if (prompt.empty() && tokenizer->end_of_text()) prompt.push_back(static_cast<int>(*tokenizer->end_of_text()));
  } else {
    prompt = parse_prompt(prompt_text, bytes, spec);
  }

  const BackendKind kind = backend_flag(args);
  const int device_id = 0;
  std::unique_ptr<Backend> backend = make_backend(kind, std::span(&device_id, 1));
  std::unique_ptr<Device> device = backend->create_device(device_id, 1, 0);
  Replica replica(*device, model, 1);
  replica.load_parameters(ckpt.params);

  if (bytes || tokenizer) fmt::print("{}", prompt_text);
  else fmt::print("{}", fmt::join(prompt, " "));
  std::fflush(stdout);
  generate(replica, prompt, opt, [&](int token) {
    if (bytes) std::putchar(token);
    // A token the tokenizer lacks (the model's padded ids) prints as its id.
    else if (tokenizer && static_cast<std::size_t>(token) < tokenizer->vocab_size())
      fmt::print("{}", tokenizer->token_bytes(static_cast<TokenId>(token)));
    else fmt::print(" {}", token);
    std::fflush(stdout);
  });
  fmt::print("\n");
  return kExitOk;
}

// One line per device: "cpu:0  NAME  MEM GiB  DETAIL".
void print_devices(const Backend& backend) {
  const std::vector<DeviceInfo> list = backend.devices();
  if (list.empty()) fmt::print("{}: no usable device\n", backend.name());
  for (const DeviceInfo& d : list)
    fmt::print("{}:{}  {}  {:.1f} GiB  {}{}\n", d.backend, d.id, d.name,
               static_cast<double>(d.memory_bytes) / (1024.0 * 1024.0 * 1024.0), d.detail,
               d.matmul.empty() ? "" : "; matrix products: " + d.matmul);
}

int devices(const std::shared_ptr<ProcessGroup>& processes) {
  fmt::print("lockstep {}\n", kVersion);
  if (const std::string mpi = mpi_library(); mpi.empty())
    fmt::print("mpi: not built in (single-process runs only)\n");
  else if (processes)
    fmt::print("mpi: built in ({}); this is process {} of {}\n", mpi, processes->rank(),
               processes->size());
  else
    fmt::print("mpi: built in ({}); not started by mpirun or srun\n", mpi);
  const CudaSupport cuda = cuda_support();
  if (cuda.built) fmt::print("cuda: built in ({})\n", cuda.summary);
  else fmt::print("cuda: not built in (CPU-only build)\n");
  print_devices(*make_backend(BackendKind::cpu));
  if (cuda.gpus > 0) print_devices(*make_backend(BackendKind::cuda));
  // model.attention auto at GPT-2's context in fp32; below kFusedAttentionContext the CPU
  // runs fp32 materialised (choose_attention).
  for (const std::string_view backend : {"cpu", "cuda"}) {
    if (backend == "cuda" && !cuda.built) continue;
    const AttentionChoice auto_choice =
        choose_attention(AttentionKind::automatic, backend, Precision::fp32, 1024);
    fmt::print("{}: attention (model.attention auto, context 1024): {}: {}\n", backend,
               to_string(auto_choice.path), auto_choice.detail);
  }
  return kExitOk;
}

// `processes` is set for the commands that may run as one process of an MPI job.
int run(int argc, char** argv, std::shared_ptr<ProcessGroup>& processes) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  if (args.empty()) {
    fmt::print(stderr, "{}", kUsage);
    return kExitBadInput;
  }
  const std::string_view command = args.front();
  const std::vector<std::string_view> rest(args.begin() + 1, args.end());
  if (command == "-h" || command == "--help" || command == "help") {
    fmt::print("{}", kUsage);
    return kExitOk;
  }
  if (command == "--version") {
    fmt::print("lockstep {}\n", kVersion);
    return kExitOk;
  }
  // "lockstep train --help" and the like: the usage, not an error.
  if (std::any_of(rest.begin(), rest.end(), [](std::string_view a) { return a == "-h" || a == "--help"; })) {
    fmt::print("{}", kUsage);
    return kExitOk;
  }
  if (command == "train" || command == "devices") processes = make_mpi_processes();
  if (command == "train") return train(rest, processes);
  if (command == "devices") return devices(processes);
  if (command == "eval") return eval(rest);
  if (command == "export") return export_weights(rest);
  if (command == "sample") return sample(rest);
  if (command == "tokenize") return tokenize(rest);
  throw InputError(fmt::format("unknown command '{}'; expected train, eval, export, sample, tokenize or devices (see lockstep --help)", command));
}

}  // namespace
}  // namespace lockstep::cli

int main(int argc, char** argv) {
  using namespace lockstep::cli;
  std::shared_ptr<lockstep::ProcessGroup> processes;  // under mpirun or srun
  const auto who = [&] {
    return processes && processes->size() > 1
               ? fmt::format("lockstep: process {} of {}", processes->rank(), processes->size())
               : std::string("lockstep");
  };
  int code = kExitOk;
  try {
    code = run(argc, argv, processes);
  } catch (const lockstep::InputError& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: error: {}\n", who(), e.what());
    code = kExitBadInput;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: failed: out of memory while {}\n", who(), g_phase.load());
    code = kExitFailure;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: failed: {}\n", who(), e.what());
    code = kExitFailure;
  } catch (...) {
    fmt::print(stderr, "{}: failed: unknown error\n", who());
    code = kExitFailure;
  }
  // A stop by signal that could not finish cleanly (Note [Bounded stop]) still says which signal.
  if (code == kExitFailure && g_signal.load() != 0) code = 128 + g_signal.load();
  // This process has stopped cleanly; the others may wait for it in a collective: end the job.
  // (A signal stop is agreed by every process and needs no abort.)
  if ((code == kExitFailure || code == kExitBadInput) && processes && processes->size() > 1) {
    std::fflush(stdout);
    std::fflush(stderr);
    processes->abort_job(code);
  }
  return code;
}
