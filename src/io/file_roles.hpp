// Which paths a command reads and which it writes, checked so that no output is an input.
//
// Note [An output is never an input]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A command that writes over a file it reads loses that file: `tokenize --out` naming its own
// text, `train --summary-json` naming the data, `--out` and `--eval-out` naming one file. So
// every command lists its inputs and outputs in a FileRoles, each with the flag or key that
// named it, and check() refuses, before anything is written, an output that is the same file as
// an input or as another output, naming both. "The same file" is decided as the writes would
// see it: a path that exists is its device and inode (symlinks and hard links followed); one
// that does not yet exist is its absolute path once the links in it are resolved
// (write_file_atomically writes through a link to the link's target). An input directory is
// listed with the files in it that the command reads (a tokenizer's vocab.json and
// merges.txt), since an output names a file, never the directory.
// Where: tokenize_files and export_checkpoint (the library calls, so Python's too), the Trainer
// when it starts (run_files in src/train/run_files.hpp: the config, data files and trainer.*
// outputs), and `lockstep train`, which adds --summary-json, --resume and --init-from. eval,
// sample, config --print and devices write no file.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/export.hpp"

namespace lockstep::detail {

class LOCKSTEP_API FileRoles {
 public:
  // `name`: the flag or key the path came from ("tokenize --out", "data.path"). An empty path
  // is not listed.
  FileRoles& input(const std::filesystem::path& path, std::string_view name);
  // An input that may be a directory: `path`, and when it is one, each of `files` in it (those
  // of them that exist are what is read).
  FileRoles& input_dir(const std::filesystem::path& path, std::string_view name,
                       std::span<const std::string_view> files);
  FileRoles& output(const std::filesystem::path& path, std::string_view name);

  // Throws InputError "OUT_NAME OUT: is the same file as IN_NAME IN; ..." for the first output
  // that is an input or an earlier output (Note [An output is never an input]).
  void check() const;

 private:
  struct Named {
    std::filesystem::path path;
    std::string name;
  };
  std::vector<Named> inputs_, outputs_;
};

// The files of a Hugging Face tokenizer directory, the ones a GPT-2 directory adds beside the
// weights, and the config.json a GPT-2 directory describes its model with.
inline constexpr std::string_view kTokenizerFiles[] = {"tokenizer.json", "vocab.json",
                                                       "merges.txt", "tokenizer_config.json"};
inline constexpr std::string_view kHfModelFiles[] = {
    "model.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
    "tokenizer.json",    "vocab.json",                   "merges.txt",  "tokenizer_config.json"};

// A file's directory: "." for a bare file name, so that it can be made absolute, listed or
// written in. Every path computed from a file's directory (a config's, an output's) starts here.
LOCKSTEP_API std::filesystem::path directory_of(const std::filesystem::path& file);

}  // namespace lockstep::detail
