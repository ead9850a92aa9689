// The README's embedding example, kept honest: train on in-memory arrays, receive metrics
// through callbacks, with nothing read from disk.
#include <doctest/doctest.h>

#include <cmath>

#include "lockstep/lockstep.hpp"

TEST_CASE("embedding: train on in-memory arrays with metrics through a callback") {
  // Two classes on either side of the plane x0 + x1 - x2 = 0.
  const std::size_t n = 600;
  std::vector<float> x(n * 3);
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::sin(0.37f * i), b = std::cos(1.13f * i), c = std::sin(2.71f * i + 1);
    x[3 * i] = a;
    x[3 * i + 1] = b;
    x[3 * i + 2] = c;
    y[i] = a + b - c > 0 ? 1 : 0;
  }
  lockstep::InMemoryDataset data(std::move(x), std::move(y), /*features=*/3, /*classes=*/2);
  lockstep::DataSplit split = lockstep::split_dataset(data, 0.2, /*normalize=*/true, /*seed=*/0);

  lockstep::Config cfg;
  cfg.model.hidden = {32};
  cfg.optimizer.lr = 0.1;
  cfg.optimizer.momentum = 0.9;
  cfg.trainer.devices = {0, 1};
  cfg.trainer.steps = 200;
  cfg.trainer.log_every = 50;
  cfg.validate();

  lockstep::Trainer trainer(cfg, split.train, split.eval);
  std::vector<double> losses;
  trainer.on_step([&](const lockstep::StepMetrics& m) { losses.push_back(m.loss); });
  int evals = 0;
  trainer.on_eval([&](const lockstep::EvalMetrics&) { ++evals; });
  const lockstep::Summary s = trainer.run();

  CHECK(losses.size() == 4);
  CHECK(losses.back() < 0.5 * losses.front());
  CHECK(evals == 1);
  CHECK(s.eval_accuracy > 0.9);
  CHECK(s.replicas_identical);
  CHECK(s.devices == std::vector<int>{0, 1});
}
