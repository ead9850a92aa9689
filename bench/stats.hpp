// Helpers shared by the benchmarks: medians, not means, because the machines are shared; the
// CPU training config the training benchmarks start from.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <vector>

#include "lockstep/config.hpp"

namespace lockstep::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// An MLP with `hidden` layers on the CPU backend: `workers` workers, `batch` samples each, SGD
// with momentum 0.9 at lr 0.01, `steps` steps, one log line, no replica checks until the end.
inline Config cpu_sgd_config(std::vector<int> hidden, int batch, int workers, std::int64_t steps) {
  Config cfg;
  cfg.source = "bench";
  cfg.model.hidden = std::move(hidden);
  cfg.data.batch_size = batch;
  cfg.optimizer.type = OptimizerKind::sgd;
  cfg.optimizer.lr = 0.01;
  cfg.optimizer.momentum = 0.9;
  cfg.trainer.backend = BackendKind::cpu;
  cfg.trainer.devices.resize(static_cast<std::size_t>(workers));
  std::iota(cfg.trainer.devices.begin(), cfg.trainer.devices.end(), 0);
  cfg.trainer.steps = steps;
  cfg.trainer.log_every = steps;
  cfg.trainer.check_replicas_every = 0;
  return cfg;
}

}  // namespace lockstep::bench
