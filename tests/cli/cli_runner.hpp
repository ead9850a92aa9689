// Runs the `lockstep` binary (or another command) for tests and captures what it printed.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
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

// `env` (e.g. "LOCKSTEP_FAULT=2:10:forward") is prefixed to the command when given.
inline CliResult run_cli(const std::string& args, const std::string& env = {}) {
  return run_command((env.empty() ? "" : env + " ") + "\"" + LOCKSTEP_CLI_PATH + "\" " + args);
}

}  // namespace lockstep::test
