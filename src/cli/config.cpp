// `lockstep config --print`: the resolved config as YAML; and the config keys that
// `lockstep train --help` lists. Both come from the schema the parser reads (visit_schema() in
// src/config/schema.hpp), so neither can drift from it.
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/command_args.hpp"
#include "cli/commands.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::cli {

int config(const std::vector<std::string_view>& argv) {
  const CommandArgs args = parse_command_args("config", argv, {"--set", "--print"});
  if (!args.positional.empty())
    throw InputError(fmt::format("config: unexpected argument '{}'; expected --print CONFIG",
                                 args.positional));
  if (args.get("--print").empty()) throw InputError("config: expected --print CONFIG");
  const Config cfg = load_config(args.get("--print"), args.overrides);
  std::string overrides;
  for (const std::string& o : args.overrides) overrides += " --set " + o;
  fmt::print("# {}{}, resolved: every key, paths absolute\n", cfg.source, overrides);
  fmt::print("{}", to_yaml(cfg));
  return kExitOk;
}

void print_config_keys() {
  fmt::print("\nconfig keys (in CONFIG, or --set KEY=VALUE; null keeps the default):\n");
  for (const ConfigKeyHelp& key : config_key_help()) {
    const bool unset = key.default_value == "null" || key.default_value == "\"\"";
    fmt::print("  {}: {}; default {}\n      {}\n", key.key, key.type,
               unset ? "unset" : key.default_value, key.description);
  }
}

}  // namespace lockstep::cli
