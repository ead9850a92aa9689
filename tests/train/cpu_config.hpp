// The Config the trainer tests start from.
#pragma once

#include <cstdint>
#include <numeric>
#include <string>

#include "lockstep/config.hpp"

namespace lockstep::test {

// The CPU backend with `devices` workers (ids 0, 1, ...) of one thread each, `batch` samples per
// worker, AdamW at lr 0.01, `steps` steps from `seed`, no log lines, replicas checked every step.
// Tests change what they are about.
inline Config cpu_config(int devices, int batch, std::int64_t steps, std::uint64_t seed) {
  Config cfg;
  cfg.source = "test";
  cfg.data.batch_size = batch;
  cfg.optimizer.type = OptimizerKind::adamw;
  cfg.optimizer.lr = 0.01;
  cfg.trainer.backend = BackendKind::cpu;
  cfg.trainer.devices.resize(static_cast<std::size_t>(devices));
  std::iota(cfg.trainer.devices.begin(), cfg.trainer.devices.end(), 0);
  cfg.trainer.steps = steps;
  cfg.trainer.seed = seed;
  cfg.trainer.log_every = 1000;
  cfg.trainer.check_replicas_every = 1;
  cfg.trainer.threads_per_device = 1;
  return cfg;
}

}  // namespace lockstep::test
