// The Pythons the interop and README tests run: Debian's (/usr/bin/python3, with torch), and the
// environment tests/interop/hf_venv.sh makes in the build tree (transformers from PyPI; it sees
// Debian's torch). Each returns the interpreter, or skips the case (saying why) and returns "".
#pragma once

#include <string>

#include "../cli/cli_runner.hpp"
#include "../skip.hpp"

namespace lockstep::test {

// The transformers environment, made on first use.
inline std::string hf_python() {
  const auto r = run_command("bash \"" LOCKSTEP_SOURCE_DIR "/tests/interop/hf_venv.sh\" \""
                             LOCKSTEP_BINARY_DIR "\"");
  if (r.code != 0) {
    skip(Skip::missing,
         "cannot make the transformers==4.40.2 environment (PyPI, python3-venv): " + r.output);
    return {};
  }
  // The path is the last line of the output.
  const std::size_t start = r.output.rfind('\n', r.output.size() - 2) + 1;
  return r.output.substr(start, r.output.size() - 1 - start);
}

// A Python with torch, numpy and safetensors: Debian's when it has safetensors, else the
// transformers environment, which has it (used as it is when made already: hf_venv.sh's check
// imports transformers, which takes seconds).
inline std::string safetensors_python() {
  for (const std::string python : {"/usr/bin/python3", LOCKSTEP_BINARY_DIR "/python-hf/bin/python"})
    if (run_command(python + " -c 'import torch, numpy, safetensors.torch'").code == 0)
      return python;
  return hf_python();
}

}  // namespace lockstep::test
