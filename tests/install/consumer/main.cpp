// Trains a small MLP on in-memory data through the installed public API only, and exits 0 when
// the loss fell by half, 1 otherwise.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "lockstep/lockstep.hpp"

int main() try {
  // 400 samples of 8 features in 3 classes, generated in memory.
  const lockstep::InMemoryDataset data =
      lockstep::make_synthetic(400, /*features=*/8, /*classes=*/3, /*seed=*/7);
  const lockstep::DataSplit split =
      lockstep::split_dataset(data, 0.2, /*normalize=*/true, /*seed=*/0);

  lockstep::Config cfg;
  cfg.model.hidden = {16};
  cfg.optimizer.lr = 0.1;
  cfg.optimizer.momentum = 0.9;
  cfg.trainer.backend = lockstep::BackendKind::cpu;
  cfg.trainer.devices = {0, 1};
  cfg.trainer.steps = 100;
  cfg.trainer.log_every = 10;
  cfg.validate();

  lockstep::Trainer trainer(cfg, split.train, split.eval);
  std::vector<double> losses;
  trainer.on_step([&](const lockstep::StepMetrics& m) { losses.push_back(m.loss); });
  const lockstep::Summary s = trainer.run();

  std::printf("lockstep %s: loss %.4f -> %.4f, eval accuracy %.3f\n", lockstep::kVersion,
              losses.empty() ? 0.0 : losses.front(), losses.empty() ? 0.0 : losses.back(),
              s.eval_accuracy);
  const bool fell = losses.size() >= 2 && losses.back() < 0.5 * losses.front();
  if (!fell) std::puts("consumer: the loss did not fall by half");
  return fell ? 0 : 1;
} catch (const std::exception& e) {
  std::printf("consumer: %s\n", e.what());
  return 1;
}
