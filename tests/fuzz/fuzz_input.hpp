// Shared by the libFuzzer harnesses: a per-process scratch file, and the rule every harness
// checks, that bad input gives an InputError whose message names where the input came from.
//
// A harness that lets anything else escape (another exception, a crash, a sanitizer report)
// has found a bug: libFuzzer stops and saves the input.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>

#include "lockstep/error.hpp"

namespace lockstep::fuzz {

// A file under the temp directory, named after the process (libFuzzer's -jobs and -fork run
// several at once), rewritten for every input and removed at exit.
class ScratchFile {
 public:
  explicit ScratchFile(std::string_view name)
      : path_(std::filesystem::temp_directory_path() /
              ("lockstep-fuzz-" + std::to_string(::getpid()) + "-" + std::string(name))) {}
  ~ScratchFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::filesystem::path& write(std::string_view bytes) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "fuzz: cannot write %s\n", path_.c_str());
      std::abort();
    }
    return path_;
  }

 private:
  std::filesystem::path path_;
};

// Aborts, so that libFuzzer saves the input, unless the message starts with one of `names`
// (a file, or "--set" for an override).
inline void require_named(const InputError& error,
                          std::initializer_list<std::string_view> names) {
  const std::string_view what = error.what();
  for (const std::string_view name : names)
    if (what.starts_with(name)) return;
  std::fprintf(stderr, "fuzz: InputError names none of the inputs: %s\n", error.what());
  std::abort();
}

}  // namespace lockstep::fuzz
