// Checkpoints and exact resume, injected faults, the step timeout and the non-finite policy.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "lockstep/lockstep.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<const Dataset> synthetic(std::size_t n, std::uint64_t seed) {
  return std::make_shared<InMemoryDataset>(make_synthetic(n, 10, 3, seed));
}

Config config(int devices, OptimizerKind opt, const fs::path& dir) {
  // 40 steps: 200 samples / 2 workers / batch 8 is 13 batches an epoch, so 3+ epochs.
  Config cfg = test::cpu_config(devices, /*batch=*/8, /*steps=*/40, /*seed=*/11);
  cfg.model.hidden = {24, 16};
  cfg.optimizer.type = opt;
  cfg.optimizer.lr = opt == OptimizerKind::sgd ? 0.05 : 0.01;
  cfg.optimizer.momentum = opt == OptimizerKind::sgd ? 0.9 : 0.0;
  cfg.schedule.type = ScheduleKind::warmup_cosine;
  cfg.schedule.warmup_steps = 5;
  cfg.trainer.check_replicas_every = Config{}.trainer.check_replicas_every;
  cfg.trainer.checkpoint.dir = dir.string();
  cfg.trainer.checkpoint.keep_last = 2;
  return cfg;
}

fs::path fresh_dir(const std::string& name) { return test::fresh_dir("lockstep_reliability_" + name); }
using test::ScopedEnv;

}  // namespace

TEST_CASE("an interrupted and resumed run ends bit-identical to an uninterrupted one") {
  for (OptimizerKind opt : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    CAPTURE(to_string(opt));
    const fs::path full_dir = fresh_dir("full"), part_dir = fresh_dir("part");
    auto train = synthetic(200, 1), eval = synthetic(30, 2);

    Trainer full(config(2, opt, full_dir), train, eval);
    full.run();

    Trainer first(config(2, opt, part_dir), train, eval);
    TrainerHooks hooks;
    hooks.after_update = [&first](int rank, std::int64_t step, Replica&) {
      if (rank == 0 && step == 16) first.request_stop();  // as SIGINT would
    };
    first.set_hooks(hooks);
    const Summary stopped = first.run();
    CHECK(stopped.stopped_early);
    CHECK(stopped.steps == 17);  // the workers agree on the next step's boundary
    CHECK(fs::exists(part_dir / "step_00000017.safetensors"));

    Trainer second(config(2, opt, part_dir), train, eval);
    second.resume_from(*CheckpointManager(part_dir, 0).load_latest());
    const Summary resumed = second.run();
    CHECK(resumed.resumed_from_step == 17);
    CHECK(resumed.steps == 40);
    CHECK(second.final_parameters() == full.final_parameters());
    // The saved weights are those final parameters too.
    CHECK(CheckpointManager::load(part_dir).params == full.final_parameters());
  }
}

TEST_CASE("a checkpoint resumes on another device count, and refuses another config") {
  const fs::path dir = fresh_dir("count");
  auto train = synthetic(200, 1), eval = synthetic(30, 2);
  Config cfg = config(2, OptimizerKind::sgd, dir);
  cfg.trainer.steps = 10;
  Trainer(cfg, train, eval).run();

  Config more = config(4, OptimizerKind::sgd, dir);
  more.trainer.steps = 20;
  Trainer four(more, train, eval);
  four.resume_from(*CheckpointManager(dir, 0).load_latest());
  const Summary s = four.run();
  CHECK(s.steps == 20);
  CHECK(s.replicas_identical);

  // Every changed key is named with both values; the ones a resume may change are told apart.
  Config other = config(2, OptimizerKind::sgd, dir);
  other.model.hidden = {32};
  other.optimizer.momentum = 0.5;
  other.optimizer.lr = 0.5;
  Trainer different(other, train, eval);
  try {
    different.resume_from(*CheckpointManager(dir, 0).load_latest());
    FAIL("no InputError");
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("written by a different configuration; a resume cannot change "
                    "model.hidden: [24,16] in the checkpoint, [32] now; optimizer.momentum: 0.9 "
                    "in the checkpoint, 0.5 now (it could change optimizer.lr: 0.05 in the "
                    "checkpoint, 0.5 now; trainer.devices: [0,1,2,3] in the checkpoint, [0,1] "
                    "now; ") != std::string::npos, what);
    CHECK(what.find("A resume may change only optimizer.lr") != std::string::npos);
  }
}

TEST_CASE("a resume may lower the lr: the new lr applies from the first resumed step") {
  const fs::path dir = fresh_dir("lower_lr");
  auto train = synthetic(200, 1), eval = synthetic(30, 2);
  Config cfg = config(2, OptimizerKind::sgd, dir);
  cfg.optimizer.momentum = 0.0;  // so that a step's update is lr x gradient
  cfg.schedule.type = ScheduleKind::constant;
  cfg.schedule.warmup_steps = 0;
  cfg.trainer.steps = 10;
  Trainer(cfg, train, eval).run();
  const Checkpoint at10 = *CheckpointManager(dir, 0).load_latest();

  // One more step from step 10 at the old lr and at half of it, each from the same checkpoint.
  const auto step_11 = [&](double lr, std::vector<ConfigChange>* changes, double* logged_lr) {
    Config c = cfg;
    c.optimizer.lr = lr;
    c.trainer.steps = 11;
    c.trainer.log_every = 1;
    c.trainer.checkpoint.dir.clear();
    Trainer t(c, train, eval);
    t.on_step([&](const StepMetrics& m) { *logged_lr = m.lr; });
    t.resume_from(at10);
    *changes = t.resume_changes();
    t.run();
    return t.final_parameters();
  };
  std::vector<ConfigChange> same, lowered;
  double same_lr = 0, lowered_lr = 0;
  const std::vector<float> old_lr = step_11(0.05, &same, &same_lr);
  const std::vector<float> new_lr = step_11(0.025, &lowered, &lowered_lr);
  // The unchanged resume reports only the trainer keys it changed; the lowered one the lr too.
  CHECK(std::none_of(same.begin(), same.end(),
                     [](const ConfigChange& c) { return c.key == "optimizer.lr"; }));
  REQUIRE(std::any_of(lowered.begin(), lowered.end(), [](const ConfigChange& c) {
    return c.key == "optimizer.lr" && c.checkpoint == "0.05" && c.now == "0.025";
  }));
  CHECK(same_lr == doctest::Approx(0.05));
  CHECK(lowered_lr == doctest::Approx(0.025));
  // The same gradient, half the step: p11 - p10 at 0.025 is half of it at 0.05.
  REQUIRE(old_lr.size() == at10.params.size());
  // Each difference is exact but for the rounding of p11 to float: a few ulp of the weight.
  double moved = 0.0, off = 0.0;
  for (std::size_t i = 0; i < at10.params.size(); ++i) {
    const double full = old_lr[i] - at10.params[i], half = new_lr[i] - at10.params[i];
    CHECK(std::abs(half - full / 2) <= 4e-7 * (std::abs(at10.params[i]) + std::abs(full)) + 1e-12);
    moved += std::abs(full);
    off += std::abs(half - full / 2);
  }
  CHECK(moved > 1e-3);       // the step did move the weights
  CHECK(off < 1e-3 * moved);  // and by half as much: not the checkpoint's lr (off = moved / 2)
}

TEST_CASE("every injected fault ends the run within 10 s, naming the worker") {
  struct Case {
    const char* spec;
    const char* message;
    int rank;
  };
  const Case cases[] = {{"1:5:forward", "throw in forward at step 5", 1},
                        {"0:3:loader", "the loader failed", 0},
                        // Every rank sees the same non-finite norm; whichever reports first.
                        {"2:4:nan", "non-finite gradient at step 4", -1},
                        {"1:6:stall", "no progress for", 1}};
  for (const Case& c : cases) {
    CAPTURE(c.spec);
    ScopedEnv fault("LOCKSTEP_FAULT", c.spec);
    Config cfg = config(3, OptimizerKind::sgd, fresh_dir("fault"));
    cfg.trainer.steps = 1000;
    cfg.trainer.step_timeout_s = 1.0;
    Trainer trainer(cfg, synthetic(200, 1), synthetic(30, 2));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      trainer.run();
      FAIL("run() should have thrown");
    } catch (const WorkerError& e) {
      if (c.rank >= 0) CHECK(e.rank() == c.rank);
      CHECK_MESSAGE(std::string(e.what()).find(c.message) != std::string::npos, e.what());
    }
    // A bounded stop, a time by contract: the fault's own step, or the 1 s step timeout for the
    // stall; 10 s is slack for a busy machine.
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  }
}

TEST_CASE("the step timeout names the stalled worker and the phase every worker was in") {
  ScopedEnv fault("LOCKSTEP_FAULT", "1:6:stall");
  Config cfg = config(3, OptimizerKind::sgd, fresh_dir("phases"));
  cfg.trainer.checkpoint.dir.clear();
  cfg.trainer.steps = 1000;
  cfg.trainer.step_timeout_s = 0.5;
  Trainer trainer(cfg, synthetic(200, 1), synthetic(30, 2));
  try {
    trainer.run();
    FAIL("run() should have thrown");
  } catch (const WorkerError& e) {
    const std::string what = e.what();
    CHECK(e.rank() == 1);
    CHECK_MESSAGE(what.find("at step 6, in forward;") != std::string::npos, what);
    // The others wait for it in the all-reduce of step 5's totals, which they agree once step
    // 6's first forward is queued (Note [Deferred step read]).
    CHECK_MESSAGE(what.find("worker 0 in the step's all-reduce of totals at step 5") !=
                      std::string::npos,
                  what);
    CHECK_MESSAGE(what.find("worker 1 in forward at step 6, worker 2 in the step's all-reduce of "
                            "totals at step 5") != std::string::npos,
                  what);
  }
}

TEST_CASE("the non-finite policy: stop names the tensor, skip drops the update and counts it") {
  ScopedEnv fault("LOCKSTEP_FAULT", "1:7:nan");
  Config cfg = config(2, OptimizerKind::adamw, fresh_dir("nonfinite"));
  cfg.trainer.checkpoint.dir.clear();
  cfg.trainer.steps = 12;
  auto train = synthetic(200, 1), eval = synthetic(30, 2);

  // The NaN lands in the last layer's gradient, which backward finishes first.
  CHECK_THROWS_WITH_AS(Trainer(cfg, train, eval).run(),
                       doctest::Contains("non-finite gradient at step 7: global norm nan, first in layers.4.weight"),
                       WorkerError);

  cfg.trainer.on_nonfinite = NonfinitePolicy::skip;
  Trainer skipping(cfg, train, eval);
  std::vector<float> before, after;
  TrainerHooks hooks;
  hooks.after_update = [&](int rank, std::int64_t step, Replica& replica) {
    if (rank == 0 && step == 6) before = replica.parameters();
    if (rank == 0 && step == 7) after = replica.parameters();
  };
  skipping.set_hooks(hooks);
  const Summary s = skipping.run();
  CHECK(s.nonfinite_skips == 1);
  CHECK(s.steps == 12);
  CHECK(before == after);  // step 7's update was dropped
  for (float p : skipping.final_parameters()) REQUIRE(std::isfinite(p));

  cfg.trainer.max_nonfinite_skips = 1;
  CHECK_THROWS_WITH_AS(Trainer(cfg, train, eval).run(), doctest::Contains("in a row"), WorkerError);
}

TEST_CASE("checkpoints keep the newest keep_last, and a corrupt newest one falls back") {
  const fs::path dir = fresh_dir("keep");
  Config cfg = config(2, OptimizerKind::sgd, dir);
  cfg.trainer.steps = 25;
  cfg.trainer.checkpoint.every_steps = 5;
  cfg.trainer.checkpoint.keep_last = 2;
  Trainer(cfg, synthetic(200, 1), synthetic(30, 2)).run();
  const auto kept = CheckpointManager(dir, 0).list();
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].step == 20);
  CHECK(kept[1].step == 25);

  fs::resize_file(kept[1].weights, fs::file_size(kept[1].weights) - 3);  // truncated
  std::vector<std::string> warnings;
  const auto ckpt = CheckpointManager(dir, 0).load_latest(
      [&](const std::string& w) { warnings.push_back(w); });
  REQUIRE(ckpt.has_value());
  CHECK(ckpt->state.step == 20);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("step_00000025.safetensors") != std::string::npos);
}
