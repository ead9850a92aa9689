#include "cli/command_args.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include <fmt/ranges.h>

namespace lockstep::cli {
namespace {

std::atomic<const char*> g_phase{"starting"};

}  // namespace

void unknown_option(std::string_view command, std::string_view option, const std::string_view* next,
                    bool sets) {
  std::string hint;
  const std::size_t eq = option.find('=');
  std::string_view name = option.substr(0, eq);  // "--steps" of "--steps=10"; "--" stays empty
  name.remove_prefix(std::min(name.size(), name.find_first_not_of('-')));
  std::vector<std::string> keys;
  if (sets && !name.empty())
    for (const ConfigKeyHelp& key : config_key_help())
      if (key.key == name || key.key.ends_with("." + std::string(name))) keys.push_back(key.key);
  if (keys.size() == 1) {
    const std::string value = eq != std::string_view::npos ? std::string(option.substr(eq + 1))
                              : next && !next->starts_with("-") ? std::string(*next)
                                                                : std::string("VALUE");
    hint = fmt::format("; to set the config key {0}, write --set {0}={1}", keys[0], value);
  } else if (keys.size() > 1) {
    hint = fmt::format("; to set a config key, write --set KEY=VALUE with KEY one of {}",
                       fmt::join(keys, ", "));
  }
  throw InputError(fmt::format("{}: unknown option '{}'{}; see lockstep {} --help", command,
                               option, hint, command));
}

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
      const std::string_view* next = i + 1 < args.size() ? &args[i + 1] : nullptr;
      if (*it == "--set") out.overrides.push_back(override_arg(value, next));
      else out.named[std::string(*it)] = value;
    } else if (a.starts_with("-")) {
      unknown_option(command, a, i + 1 < args.size() ? &args[i + 1] : nullptr,
                     std::find(flags.begin(), flags.end(), "--set") != flags.end());
    } else if (out.positional.empty()) {
      out.positional = std::string(a);
    } else {
      throw InputError(fmt::format("{}: unexpected argument '{}'", command, a));
    }
  }
  return out;
}

std::string override_arg(std::string_view text, const std::string_view* next) {
  if (text.find('=') != std::string_view::npos) return std::string(text);
  if (next && !next->starts_with("-"))
    throw InputError(fmt::format("--set {}: expected KEY=VALUE, one argument: --set {}={}", text,
                                 text, *next));
  throw InputError(fmt::format("--set {}: expected KEY=VALUE, e.g. --set optimizer.lr=0.05", text));
}

std::string no_usable_gpu() {
  const CudaSupport cuda = cuda_support();
  if (!cuda.built) return "this build of lockstep has no CUDA backend";
  if (cuda.gpus > 0) return {};
  // The summary is "STATE; the linked versions" (CudaSupport).
  return cuda.summary.substr(0, cuda.summary.find("; "));
}

BackendKind backend_flag(const CommandArgs& args) {
  const std::string name = args.get("--backend");
  if (name.empty()) return BackendKind::automatic;
  const std::optional<BackendKind> kind = backend_kind(name);
  if (!kind) throw InputError(fmt::format("--backend: expected auto, cpu or cuda, got '{}'", name));
  // Note [A fix in the spelling used]
  if (*kind == BackendKind::cuda)
    if (const std::string why = no_usable_gpu(); !why.empty())
      throw InputError(fmt::format("--backend cuda: no usable GPU ({}): give --backend cpu, or "
                                   "--backend auto (a GPU when there is one, else the CPU)",
                                   why));
  return *kind;
}

void warn(const std::string& message) { fmt::print(stderr, "lockstep: warning: {}\n", message); }

void set_phase(const char* phase) { g_phase.store(phase); }

const char* phase() { return g_phase.load(); }

}  // namespace lockstep::cli
