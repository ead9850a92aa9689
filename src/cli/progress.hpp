// What `lockstep train` prints while it runs: a live line on a terminal, plain log lines
// otherwise, and the summary at the end.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>

#include "lockstep/trainer.hpp"

namespace lockstep::cli {

class Progress {
 public:
  // Writes to `out`; live mode redraws one line with '\r' and is throttled to ~10 updates/s,
  // between the log lines, which both modes print.
  Progress(std::FILE* out, bool live);
  void step(const StepMetrics& m);      // every step
  void log(const StepMetrics& m);       // every log_every steps
  void eval(const EvalMetrics& m);
  void checkpoint(std::int64_t step, const std::string& weights_file);
  void finish();                         // ends the live line

 private:
  void clear_line();
  std::FILE* out_;
  bool live_;
  bool line_open_ = false;
  double last_draw_s_ = -1.0;
};

void print_summary(std::FILE* out, const Summary& s);

// `text` to `path` so that a reader (or a crash) never sees half a file: the library's durable
// write (temp file, fsync, rename, directory fsync).
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

}  // namespace lockstep::cli
