// trainer.metrics: the run's metrics as JSON lines, one object per logged step and per eval,
// appended and flushed as they happen, so that `tail -f` follows a live run and a resumed run
// continues the same file. Global rank 0 alone writes it. Each run opens its part with a "run"
// line, so that runs appending to one file stay apart:
//
//   {"kind": "run", "start_time": "2025-01-31T12:00:00Z", "config_hash": "7c1cc211a4af95af",
//    "resumed_from_step": 100, "resumed_from": "ckpt/step_00000100.safetensors", "steps": 300,
//    "workers": 2}        (a fresh run: "resumed_from_step": 0, "resumed_from": null)
//   {"kind": "step", "step": 50, "epoch": 2, "loss": 0.09, "accuracy": 0.97, "lr": 0.039,
//    "grad_norm": 0.27, "samples_per_s": 5.9e5, "tokens_per_s": 5.9e5, "mfu": null,
//    "comm_hidden_fraction": 0.7, "data_wait_s": 0.001, "elapsed_s": 0.02}
//   {"kind": "eval", "step": 100, "loss": 0.11, "accuracy": 0.97, "samples": 359}
//   {"kind": "recovery", "step": 120, "lost": "cpu:2", "workers": 3, "steps_redone": 0,
//    "recovery_s": 0.02}      (trainer.on_worker_failure: shrink; Note [Shrink] in recovery.hpp)
//
// Numbers that are unknown or not finite (mfu on a device without a known peak) are null.
#pragma once

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <string>

#include "lockstep/trainer.hpp"

namespace lockstep::detail {

// What the "run" line records.
struct RunStart {
  std::time_t start_time = 0;       // wall clock, written in UTC
  std::uint64_t config_hash = 0;
  std::int64_t resumed_from_step = 0;  // 0: a fresh run
  std::string resumed_from;            // the checkpoint's weights file; empty: a fresh run
  std::int64_t steps = 0;              // the run's last step
  int workers = 0;
};

// A run that went on without a lost worker: from the start of `step`, on `workers` survivors.
struct Recovery {
  std::int64_t step = 0;
  std::string lost;  // the lost workers' devices, "cpu:2"
  int workers = 0;
  std::int64_t steps_redone = 0;
  double recovery_s = 0.0;
};

// One line of the stream, without its newline.
std::string metrics_line(const RunStart& r);
std::string metrics_line(const StepMetrics& m);
std::string metrics_line(const EvalMetrics& m);
std::string metrics_line(const Recovery& r);

class MetricsLog {
 public:
  // Opens `file` for appending, creating its directory as checkpoints do; InputError naming it (and trainer.metrics) when it cannot.
  explicit MetricsLog(const std::filesystem::path& file);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(const RunStart& r) { append(metrics_line(r)); }
  void write(const StepMetrics& m) { append(metrics_line(m)); }
  void write(const EvalMetrics& m) { append(metrics_line(m)); }
  void write(const Recovery& r) { append(metrics_line(r)); }

 private:
  void append(const std::string& line);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace lockstep::detail
