// Checkpoints and exact resume, injected faults, the step timeout and the non-finite policy.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <numbers>
#include <numeric>

#include <fmt/format.h>

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

// Note [What a resume may change]: each change a resume accepts applies from the first resumed
// step. Ten steps of plain SGD (no momentum, weight decay, clipping or schedule) write a
// checkpoint; step 11 is then taken from it under the same config and under a changed key, and
// the change shows in closed form: both take the same gradient g at the same p10, so
// p11 = p10 - lr (s g + wd p10) with s the clip factor, wd on the weight matrices alone.
class FromStep10 {
 public:
  // `name`: the test's own, as CTest runs the cases at once.
  explicit FromStep10(const std::string& name)
      : dir_(fresh_dir(fmt::format("{}_{}", name, getpid()))),
        train_(synthetic(200, 1)),
        eval_(synthetic(30, 2)) {
    cfg_ = config(2, OptimizerKind::sgd, dir_);
    cfg_.optimizer.momentum = 0.0;
    cfg_.schedule.type = ScheduleKind::constant;
    cfg_.schedule.warmup_steps = 0;
    cfg_.trainer.steps = 10;
    Trainer(cfg_, train_, eval_).run();
    at10_ = *CheckpointManager(dir_, 0).load_latest();
  }
  ~FromStep10() { fs::remove_all(dir_); }

  struct Resumed {
    std::vector<float> params;          // after the last step
    std::vector<ConfigChange> changes;  // what the resume reported changed
    std::vector<StepMetrics> logged;    // every resumed step's metrics
    Summary summary;
  };
  // `steps` more steps from step 10 under the config `change` makes.
  Resumed resume(const std::function<void(Config&)>& change, std::int64_t steps = 1) const {
    Config c = cfg_;
    c.trainer.steps = 10 + steps;
    c.trainer.log_every = 1;
    c.trainer.checkpoint.dir.clear();
    change(c);
    Trainer t(c, train_, eval_);
    Resumed out;
    t.on_step([&](const StepMetrics& m) { out.logged.push_back(m); });
    t.resume_from(at10_);
    out.changes = t.resume_changes();
    out.summary = t.run();
    out.params = t.final_parameters();
    return out;
  }
  const Checkpoint& at10() const { return at10_; }
  // Whether parameter i is in a weight matrix: weight decay's tensors (decay_spans in
  // src/train/optimizer.hpp).
  bool decayed(std::size_t i) const {
    const std::vector<ParamTensor> tensors = Trainer(cfg_, train_, eval_).model().param_tensors();
    return std::any_of(tensors.begin(), tensors.end(), [i](const ParamTensor& t) {
      return i >= t.offset && i < t.offset + t.numel() && t.shape.size() >= 2;
    });
  }
  double lr() const { return cfg_.optimizer.lr; }

 private:
  fs::path dir_;
  std::shared_ptr<const Dataset> train_, eval_;
  Config cfg_;
  Checkpoint at10_;
};

bool reports_change(const std::vector<ConfigChange>& changes, const std::string& key) {
  return std::any_of(changes.begin(), changes.end(),
                     [&](const ConfigChange& c) { return c.key == key; });
}

// Checks p11 - p10 == want(i, p11 - p10 of the unchanged step) for every parameter, exact but
// for the rounding of p11 to float (a few ulp of the weight) and of the clip factor; returns
// the summed |p11 - p10| of the unchanged step, to show it moved.
template <class Want>
double check_step(const Checkpoint& at10, const std::vector<float>& unchanged,
                  const std::vector<float>& changed, Want want) {
  REQUIRE(unchanged.size() == at10.params.size());
  REQUIRE(changed.size() == at10.params.size());
  double moved = 0.0;
  for (std::size_t i = 0; i < at10.params.size(); ++i) {
    const double p10 = at10.params[i], base = unchanged[i] - p10, step = changed[i] - p10;
    const double expected = want(i, base);
    CAPTURE(i);
    CHECK(std::abs(step - expected) <=
          4e-7 * (std::abs(p10) + std::abs(base)) + 1e-5 * std::abs(expected) + 1e-12);
    moved += std::abs(base);
  }
  return moved;
}

TEST_CASE("a resume may lower the lr: the new lr applies from the first resumed step") {
  const FromStep10 from("lower_lr");
  const FromStep10::Resumed same = from.resume([](Config&) {});
  const FromStep10::Resumed lowered = from.resume([](Config& c) { c.optimizer.lr /= 2; });
  // The unchanged resume reports only the trainer keys it changed; the lowered one the lr too.
  CHECK_FALSE(reports_change(same.changes, "optimizer.lr"));
  REQUIRE(std::any_of(lowered.changes.begin(), lowered.changes.end(), [](const ConfigChange& c) {
    return c.key == "optimizer.lr" && c.checkpoint == "0.05" && c.now == "0.025";
  }));
  CHECK(same.logged.at(0).lr == doctest::Approx(0.05));
  CHECK(lowered.logged.at(0).lr == doctest::Approx(0.025));
  // The same gradient, half the step: not the checkpoint's lr.
  const double moved = check_step(from.at10(), same.params, lowered.params,
                                  [](std::size_t, double base) { return base / 2; });
  CHECK(moved > 1e-3);  // the step did move the weights
}

TEST_CASE("a resume may change the weight decay: it applies from the first resumed step") {
  const FromStep10 from("weight_decay");
  const FromStep10::Resumed none = from.resume([](Config&) {});
  constexpr double kDecay = 0.5;
  const FromStep10::Resumed decayed =
      from.resume([](Config& c) { c.optimizer.weight_decay = kDecay; });
  CHECK(reports_change(decayed.changes, "optimizer.weight_decay"));
  // SGD adds wd p10 to the gradient of each weight matrix, and nothing to a bias.
  const Checkpoint& at10 = from.at10();
  std::size_t matrices = 0;
  const double moved = check_step(at10, none.params, decayed.params, [&](std::size_t i, double base) {
    if (!from.decayed(i)) return base;
    ++matrices;
    return base - from.lr() * kDecay * at10.params[i];
  });
  CHECK(moved > 1e-3);
  CHECK(matrices > 0);
  CHECK(matrices < at10.params.size());
}

TEST_CASE("a resume may change the clipping: it applies from the first resumed step") {
  const FromStep10 from("clipping");
  const FromStep10::Resumed free = from.resume([](Config&) {});
  const double norm = free.logged.at(0).grad_norm;
  REQUIRE(norm > 0.0);
  const double limit = norm / 4;  // the step's gradient scaled by 1/4
  const FromStep10::Resumed clipped =
      from.resume([&](Config& c) { c.optimizer.clip_grad_norm = limit; });
  CHECK(reports_change(clipped.changes, "optimizer.clip_grad_norm"));
  CHECK(clipped.logged.at(0).grad_norm == doctest::Approx(norm));  // reported before clipping
  const double moved = check_step(from.at10(), free.params, clipped.params,
                                  [&](std::size_t, double base) { return base * limit / norm; });
  CHECK(moved > 1e-3);
}

TEST_CASE("a resume may change the schedule: its learning rate applies from the first resumed step") {
  const FromStep10 from("schedule");
  const FromStep10::Resumed constant = from.resume([](Config&) {});
  constexpr double kMin = 0.01;
  const fs::path dir = fresh_dir(fmt::format("schedule_at11_{}", getpid()));
  const FromStep10::Resumed cosine = from.resume(
      [&](Config& c) {
        c.schedule.type = ScheduleKind::warmup_cosine;
        c.schedule.min_lr = kMin;
        c.trainer.checkpoint.dir = dir.string();  // step 11's parameters
        c.trainer.checkpoint.every_steps = 1;
      },
      2);
  CHECK(reports_change(cosine.changes, "schedule.type"));
  CHECK(reports_change(cosine.changes, "schedule.min_lr"));
  // 12 steps, no warmup: step s (1-based) decays over 11 steps, to min_lr at the last.
  const double lr_11 = kMin + 0.5 * (from.lr() - kMin) * (1.0 + std::cos(std::numbers::pi * 10.0 / 11.0));
  REQUIRE(cosine.logged.size() == 2);
  CHECK(cosine.logged[0].step == 11);
  CHECK(cosine.logged[0].lr == doctest::Approx(lr_11));
  CHECK(cosine.logged[1].lr == doctest::Approx(kMin));
  CHECK(constant.logged.at(0).lr == doctest::Approx(from.lr()));
  // Step 11's update is the constant one's, scaled by the two rates.
  const Checkpoint at11 = CheckpointManager::load(dir / "step_00000011.safetensors");
  fs::remove_all(dir);
  const double moved = check_step(from.at10(), constant.params, at11.params,
                                  [&](std::size_t, double base) { return base * lr_11 / from.lr(); });
  CHECK(moved > 1e-3);
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
