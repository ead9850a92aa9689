// trainer.metrics: the run's metrics as JSON lines, one object per logged step and per eval,
// appended and flushed as they happen, so that `tail -f` follows a live run and a resumed run
// continues the same file. Global rank 0 alone writes it.
//
//   {"kind": "step", "step": 50, "epoch": 2, "loss": 0.09, "accuracy": 0.97, "lr": 0.039,
//    "grad_norm": 0.27, "samples_per_s": 5.9e5, "tokens_per_s": 5.9e5, "mfu": null,
//    "comm_hidden_fraction": 0.7, "data_wait_s": 0.001, "elapsed_s": 0.02}
//   {"kind": "eval", "step": 100, "loss": 0.11, "accuracy": 0.97, "samples": 359}
//
// Numbers that are unknown or not finite (mfu on a device without a known peak) are null.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>

#include "lockstep/trainer.hpp"

namespace lockstep::detail {

// One line of the stream, without its newline.
std::string metrics_line(const StepMetrics& m);
std::string metrics_line(const EvalMetrics& m);

class MetricsLog {
 public:
  // Opens `file` for appending, creating its directory as checkpoints do; InputError naming it (and trainer.metrics) when it cannot.
  explicit MetricsLog(const std::filesystem::path& file);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(const StepMetrics& m) { append(metrics_line(m)); }
  void write(const EvalMetrics& m) { append(metrics_line(m)); }

 private:
  void append(const std::string& line);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace lockstep::detail
