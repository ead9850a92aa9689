// The trainer's distributed behaviour against closed-form expectations:
//   - N workers x batch B take the same steps as 1 worker x batch N*B on the same samples;
//   - replicas hold bit-identical parameters after every step;
//   - a failing worker stops the whole run with its own error, and nothing hangs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>

#include "trainer_fixtures.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;

namespace {

std::shared_ptr<const Dataset> synthetic(std::size_t n, std::uint64_t seed) {
  return std::make_shared<InMemoryDataset>(make_synthetic(n, 12, 4, seed));
}

Config small_config(int devices, int batch, OptimizerKind opt) {
  return test::small_mlp_config(devices, batch, opt);
}

using test::relative_difference;

}  // namespace

TEST_CASE("N workers x batch B equal 1 worker x batch N*B (SGD and AdamW)") {
  // 240 samples: with N*B = 10, 15 or 20 each step of the single worker sees exactly the samples
  // the N workers see together, because rank r of the sampler takes positions r, r + N, ...
  auto train = synthetic(240, 1);
  auto eval = synthetic(40, 2);
  for (OptimizerKind opt : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    for (int n : {2, 3, 4}) {
      CAPTURE(to_string(opt));
      CAPTURE(n);
      const int b = 5;
      Trainer many(small_config(n, b, opt), train, eval);
      Trainer one(small_config(1, n * b, opt), train, eval);
      const Summary sm = many.run();
      const Summary so = one.run();
      CHECK(sm.replicas_identical);
      CHECK(relative_difference(many.final_parameters(), one.final_parameters()) <= 1e-5);
      CHECK(sm.eval_loss == doctest::Approx(so.eval_loss).epsilon(1e-5));
      // Training actually moved the weights, so the comparison is not vacuous.
      const std::vector<float> init = one.model().initial_parameters(5);
      CHECK(relative_difference(one.final_parameters(), init) > 1e-3);
    }
  }
}

TEST_CASE("replicas are bit-identical after every step") {
  const int n = 3;
  Config cfg = small_config(n, 8, OptimizerKind::adamw);
  Trainer trainer(cfg, synthetic(200, 3), synthetic(30, 4));
  std::mutex mutex;
  std::vector<std::vector<std::vector<float>>> params(cfg.trainer.steps + 1,
                                                      std::vector<std::vector<float>>(n));
  TrainerHooks hooks;
  hooks.after_update = [&](int rank, std::int64_t step, Replica& replica) {
    std::vector<float> p = replica.parameters();
    std::lock_guard lock(mutex);
    params[step][rank] = std::move(p);
  };
  trainer.set_hooks(hooks);
  const Summary s = trainer.run();
  CHECK(s.replicas_identical);
  CHECK(s.replica_checks == cfg.trainer.steps + 1);
  for (std::int64_t step = 1; step <= cfg.trainer.steps; ++step)
    for (int r = 1; r < n; ++r) REQUIRE(params[step][r] == params[step][0]);
  CHECK(params[cfg.trainer.steps][0] == trainer.final_parameters());
}

TEST_CASE("the replica check catches a replica that drifts") {
  Config cfg = small_config(2, 8, OptimizerKind::sgd);
  cfg.trainer.check_replicas_every = 4;
  Trainer trainer(cfg, synthetic(200, 3), synthetic(30, 4));
  TrainerHooks hooks;
  hooks.after_update = [](int rank, std::int64_t step, Replica& replica) {
    if (rank == 1 && step == 6) {
      std::vector<float> p = replica.parameters();
      p[0] += 1e-3f;
      replica.load_parameters(p);
    }
  };
  trainer.set_hooks(hooks);
  CHECK_THROWS_WITH_AS(trainer.run(), doctest::Contains("replicas diverged at step 8"),
                       WorkerError);
}

TEST_CASE("a worker that throws stops every worker, and run() reports its rank and error") {
  for (int n : {1, 2, 4}) {
    for (int failing : {0, n - 1}) {
      CAPTURE(n);
      CAPTURE(failing);
      Config cfg = small_config(n, 4, OptimizerKind::sgd);
      cfg.trainer.steps = 50;
      Trainer trainer(cfg, synthetic(200, 3), synthetic(30, 4));
      TrainerHooks hooks;
      hooks.before_forward = [failing](int rank, std::int64_t step) {
        if (rank == failing && step == 7) throw std::runtime_error("injected fault");
      };
      trainer.set_hooks(hooks);
      try {
        trainer.run();
        FAIL("run() should have thrown");
      } catch (const WorkerError& e) {
        CHECK(e.rank() == failing);
        CHECK(e.device() == "cpu:" + std::to_string(failing));
        CHECK(std::string(e.what()).find("injected fault") != std::string::npos);
      }
    }
  }
}

TEST_CASE("the summary counts steps and samples") {
  Config cfg = small_config(2, 8, OptimizerKind::sgd);
  cfg.trainer.steps = 0;
  cfg.trainer.epochs = 2;
  cfg.trainer.log_every = 3;
  Trainer trainer(cfg, synthetic(100, 3), synthetic(30, 4));
  std::vector<std::int64_t> logged;
  trainer.on_step([&](const StepMetrics& m) { logged.push_back(m.step); });
  const Summary s = trainer.run();
  // 100 samples over 2 workers = 50 each = 7 batches of 8 (the last one partial) per epoch.
  CHECK(s.steps == 14);
  CHECK(s.samples == 200);
  CHECK(logged == std::vector<std::int64_t>{3, 6, 9, 12, 14});
  CHECK(std::isfinite(s.eval_loss));
  CHECK(s.to_json().find("\"replicas_identical\": true") != std::string::npos);
}
