// Runs the `lockstep` binary (or another command) for tests and captures what it printed.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>

namespace lockstep::test {

struct CliResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, capturing stdout and stderr together.
inline CliResult run_command(const std::string& command) {
  CliResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  std::size_t got;
  while ((got = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, got);
  const int status = pclose(pipe);
  // Dying on a signal is a failure of its own: no input may do that.
  REQUIRE_MESSAGE(WIFEXITED(status), "killed by a signal: " << r.output);
  r.code = WEXITSTATUS(status);
  return r;
}

// What to put before a shell command so that it runs without root's exemptions (from
// RLIMIT_NPROC, from file permissions): "" when not root, setpriv to nobody as root, nullopt
// as root without setpriv. Whatever such a command reads must be readable by nobody.
inline std::optional<std::string> unprivileged_prefix() {
  if (::geteuid() != 0) return std::string();
  if (run_command("command -v setpriv").code != 0) return std::nullopt;
  return std::string("setpriv --reuid=65534 --regid=65534 --clear-groups ");
}

// The lockstep binary, quoted for a shell.
inline std::string cli_path() { return fmt::format("\"{}\"", LOCKSTEP_CLI_PATH); }

// `env` (e.g. "LOCKSTEP_FAULT=2:10:forward") is prefixed to the command when given.
inline CliResult run_cli(const std::string& args, const std::string& env = {}) {
  return run_command((env.empty() ? "" : env + " ") + cli_path() + " " + args);
}

// A number in a summary JSON file.
inline double json_number(const std::string& json, const std::string& key) {
  const std::regex re("\"" + key + "\": ([-0-9.eE+]+)");
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(json, m, re), key << " missing in " << json);
  return std::stod(m[1]);
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), {}};
}

}  // namespace lockstep::test
