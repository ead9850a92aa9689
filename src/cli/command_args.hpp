// What the commands share: their options, warnings, and the phase named by an out-of-memory report.
#pragma once

#include <charconv>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"

namespace lockstep::cli {

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
                               std::initializer_list<std::string_view> flags);

// Throws InputError "COMMAND: unknown option '--steps'", with, for a command that takes --set
// (`sets`), the override meant when the option names a config key by its last part or in full:
// "; to set trainer.steps, write --set trainer.steps=10". `next` is the argument after it.
[[noreturn]] void unknown_option(std::string_view command, std::string_view option,
                                 const std::string_view* next, bool sets);

// The KEY=VALUE after --set, checked: `--set optimizer.lr 0.1` (a space for the '=') is told
// `--set optimizer.lr=0.1`. `next` is the argument after the value, if any.
std::string override_arg(std::string_view text, const std::string_view* next);

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

// Note [A fix in the spelling used]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A message names its fix as the user would type it where they typed the mistake: `sample
// --backend cuda` on a machine without a GPU is told `--backend cpu`, `train` is told the
// file and line of trainer.backend (or its --set), the Python module `backend='cpu'`. The
// library's own message names the config key (trainer.backend), which fits a YAML file, a
// Python dict and a C++ Config alike; each front end checks first and says it its own way.
// The driver's state reads as `lockstep devices` says it.

// Why CUDA is unusable here, as `lockstep devices` says it ("no NVIDIA driver found"), or ""
// when a GPU is usable.
std::string no_usable_gpu();

// --backend auto|cpu|cuda; cuda without a usable GPU is refused, naming --backend cpu.
BackendKind backend_flag(const CommandArgs& args);

// "lockstep: warning: MESSAGE" on standard error.
void warn(const std::string& message);

// What the command is doing, for a std::bad_alloc that gets past the memory plan to main()
// (Note [Memory plan]): the report names the phase, since bad_alloc names nothing.
void set_phase(const char* phase);
const char* phase();

}  // namespace lockstep::cli
