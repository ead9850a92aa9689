// `trainer.report: FILE`: one self-contained HTML page about a finished run, readable offline.
// Trainer::run makes it (global rank 0) for the CLI and embedders alike: global rank 0's worker
// feeds it every step's metrics and every eval, and the trainer writes it once the run is over.
//
// The page holds the summary table, the run's settings, and inline SVG charts drawn here (no
// scripts, no fonts or styles from elsewhere): the train loss and accuracy of every step with
// the eval points, the throughput of every step, the learning rate when it changes, and where
// each worker's time went (Summary::worker_times: compute, exposed communication, data waits,
// barrier waits).
//
// Memory stays bounded on long runs: steps are kept in at most kMaxBuckets buckets of equal
// width. When they fill, neighbours merge and the width doubles, so every step still counts
// toward the curve (as the mean of its bucket) and the cost per step is O(1) amortised.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "lockstep/config.hpp"
#include "lockstep/trainer.hpp"

namespace lockstep::detail {

class RunReport {
 public:
  static constexpr std::size_t kMaxBuckets = 2048;

  explicit RunReport(std::filesystem::path file);

  void step(const StepMetrics& m);  // every step (Trainer::on_progress); cheap
  void eval(const EvalMetrics& m);

  // The page, and writing it (through a temporary file and a rename).
  std::string html(const Config& config, const Summary& summary) const;
  void write(const Config& config, const Summary& summary) const;

  // Steps per bucket: 1 until the run outgrows kMaxBuckets.
  std::int64_t steps_per_bucket() const noexcept { return width_; }

 private:
  // Consecutive steps [first_step, last_step], summed, and where the run stood at the last one.
  struct Bucket {
    std::int64_t first_step = 0, last_step = 0, count = 0;
    double loss_sum = 0.0, accuracy_sum = 0.0;
    double lr = 0.0;           // at the last step
    double elapsed_s = 0.0;    // at the end of the last step
    double samples = 0.0;      // consumed since the start, at the end of the last step
  };

  std::filesystem::path file_;
  std::vector<Bucket> buckets_;
  std::vector<EvalMetrics> evals_;
  std::int64_t width_ = 1;
};

}  // namespace lockstep::detail
