// What `lockstep train` prints while it runs: a live line on a terminal, plain log lines
// otherwise, and the summary at the end.
#pragma once

#include <cstdio>
#include <string>

#include "lockstep/trainer.hpp"

namespace lockstep::cli {

class Progress {
 public:
  // Writes to `out`; live mode redraws one line with '\r' and is throttled to ~10 updates/s.
  Progress(std::FILE* out, bool live);
  void step(const StepMetrics& m);      // every step
  void log(const StepMetrics& m);       // every log_every steps
  void eval(const EvalMetrics& m);
  void finish();                         // ends the live line

 private:
  void clear_line();
  std::FILE* out_;
  bool live_;
  bool line_open_ = false;
  double last_draw_s_ = -1.0;
};

void print_summary(std::FILE* out, const Summary& s);
// "cpu (4 workers: 2 processes x devices 0,1)": the backend and every worker of the job.
std::string describe_backend(const Summary& s);
// "3538944 bytes per worker at most (ZeRO-1: sharded across workers)".
std::string describe_optimizer_state(const Summary& s);

}  // namespace lockstep::cli
