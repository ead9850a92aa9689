#include <cstdint>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include <lockstep/lockstep.hpp>

int main() try {
  // 400 samples of 3 features in 2 classes, generated here: class 1 when x0 + x1 > 2 x2.
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> x;
  std::vector<std::int32_t> y;
  for (int i = 0; i < 400; ++i) {
    const float a = uniform(rng), b = uniform(rng), c = uniform(rng);
    x.insert(x.end(), {a, b, c});
    y.push_back(a + b > 2 * c ? 1 : 0);
  }
  lockstep::InMemoryDataset data(std::move(x), std::move(y), /*features=*/3, /*classes=*/2);
  lockstep::DataSplit split = lockstep::split_dataset(data, /*eval_fraction=*/0.2,
                                                      /*normalize=*/true, /*seed=*/0);

  lockstep::Config cfg;                 // defaults, as docs/config.md lists them
  cfg.model.hidden = {32};
  cfg.optimizer.lr = 0.1;
  cfg.optimizer.momentum = 0.9;
  cfg.trainer.backend = lockstep::BackendKind::cpu;
  cfg.trainer.devices = {0, 1};         // two workers
  cfg.trainer.steps = 200;
  cfg.validate();                       // throws lockstep::ConfigError naming the key

  lockstep::Trainer trainer(cfg, split.train, split.eval);
  trainer.on_step([](const lockstep::StepMetrics& m) {
    std::printf("step %lld loss %.4f acc %.3f\n", (long long)m.step, m.loss, m.accuracy);
  });
  lockstep::Summary s = trainer.run();  // throws lockstep::WorkerError if a worker failed
  std::printf("eval accuracy %.3f, replicas identical: %d\n", s.eval_accuracy,
              s.replicas_identical);
} catch (const lockstep::Error& e) {    // bad input or a failed worker
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
