// The `lockstep` command line.
//
// Exit codes: 0 success, 1 run-time failure, 2 bad input (config, flags, data files).
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/progress.hpp"
#include "lockstep/lockstep.hpp"

namespace fs = std::filesystem;

namespace lockstep::cli {
namespace {

constexpr int kExitOk = 0, kExitFailure = 1, kExitBadInput = 2;

constexpr std::string_view kUsage = R"(usage: lockstep <command> [options]

commands:
  train CONFIG [--set KEY=VALUE]... [--summary-json FILE]
                      train the model described by the YAML file CONFIG on every
                      configured device; --set overrides a config key (repeatable),
                      e.g. --set trainer.devices=4 --set optimizer.lr=0.05
  devices             list the backends and devices this binary can use

options:
  -h, --help          show this help
  --version           print the version

exit codes: 0 ok, 1 run-time failure, 2 bad input (config, flags, data)
)";

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string summary_json;
};

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
    } else if (a.starts_with("-")) {
      throw InputError(fmt::format("train: unknown option '{}'; see lockstep --help", a));
    } else if (out.config.empty()) {
      out.config = std::string(a);
    } else {
      throw InputError(fmt::format("train: unexpected argument '{}' (the config is '{}')", a, out.config));
    }
  }
  if (out.config.empty()) throw InputError("train: expected a CONFIG file; see lockstep --help");
  return out;
}

// Writes through a temporary file and a rename, so a reader never sees half a file.
void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw std::runtime_error(fmt::format("{}: cannot write", tmp.string()));
  }
  fs::rename(tmp, path);
}

int train(const std::vector<std::string_view>& argv) {
  const TrainArgs args = parse_train_args(argv);
  if (!args.summary_json.empty()) {
    const fs::path dir = fs::absolute(args.summary_json).parent_path();
    if (!fs::is_directory(dir))
      throw InputError(fmt::format("--summary-json {}: directory '{}' does not exist",
                                   args.summary_json, dir.string()));
  }
  const Config cfg = load_config(args.config, args.overrides);
  const DataSplit data =
      load_dataset(cfg.data, cfg.trainer.seed, fs::path(args.config).parent_path());

  Trainer trainer(cfg, data.train, data.eval);
  const bool live = isatty(STDERR_FILENO) != 0;
  Progress progress(live ? stderr : stdout, live);
  trainer.on_progress([&](const StepMetrics& m) { progress.step(m); });
  trainer.on_step([&](const StepMetrics& m) { progress.log(m); });
  trainer.on_eval([&](const EvalMetrics& m) { progress.eval(m); });

  fmt::print("training {} parameters on {} worker(s), {} steps, batch {} per worker\n",
             trainer.model().param_count(), cfg.trainer.devices.size(), trainer.total_steps(),
             cfg.data.batch_size);
  std::fflush(stdout);
  Summary summary;
  try {
    summary = trainer.run();
  } catch (...) {
    progress.finish();
    throw;
  }
  progress.finish();
  print_summary(stdout, summary);
  if (!args.summary_json.empty()) write_file_atomically(args.summary_json, summary.to_json());
  return summary.replicas_identical ? kExitOk : kExitFailure;
}

int devices() {
  fmt::print("lockstep {}\n", kVersion);
  for (const BackendKind kind : {BackendKind::cpu, BackendKind::cuda}) {
    std::unique_ptr<Backend> backend;
    try {
      backend = make_backend(kind);
    } catch (const std::exception& e) {
      fmt::print("{}: unavailable: {}\n", to_string(kind), e.what());
      continue;
    }
    const std::vector<DeviceInfo> list = backend->devices();
    if (list.empty()) fmt::print("{}: no usable device\n", backend->name());
    for (const DeviceInfo& d : list)
      fmt::print("{}:{}  {}  {:.1f} GiB  {}\n", d.backend, d.id, d.name,
                 static_cast<double>(d.memory_bytes) / (1024.0 * 1024.0 * 1024.0), d.detail);
  }
  return kExitOk;
}

int run(int argc, char** argv) {
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
  if (command == "train") return train(rest);
  if (command == "devices") return devices();
  throw InputError(fmt::format("unknown command '{}'; expected train or devices (see lockstep --help)", command));
}

}  // namespace
}  // namespace lockstep::cli

int main(int argc, char** argv) {
  try {
    return lockstep::cli::run(argc, argv);
  } catch (const lockstep::InputError& e) {
    std::fflush(stdout);
    fmt::print(stderr, "lockstep: error: {}\n", e.what());
    return lockstep::cli::kExitBadInput;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "lockstep: failed: {}\n", e.what());
    return lockstep::cli::kExitFailure;
  } catch (...) {
    fmt::print(stderr, "lockstep: failed: unknown error\n");
    return lockstep::cli::kExitFailure;
  }
}
