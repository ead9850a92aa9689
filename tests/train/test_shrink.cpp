// trainer.on_worker_failure: shrink (Note [Shrink] in src/train/trainer.cpp): a run that loses
// a worker's device at step s goes on with the survivors from the start of step s, and ends
// bit-identical to a run that --resumes from a checkpoint of step s - 1 on the survivors'
// devices. Each case is a 12-step run of the small MLP on the CPU, over 480 samples: whole
// batches of 8 on 1 to 4 workers.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<const Dataset> train_split() {
  return std::make_shared<InMemoryDataset>(make_synthetic(480, 12, 4, 1));
}
std::shared_ptr<const Dataset> eval_split() {
  return std::make_shared<InMemoryDataset>(make_synthetic(30, 12, 4, 2));
}

// The small MLP with three buckets (one per layer), so that a worker can be lost between the
// first bucket's all-reduce and the next; clipping, so that no update starts before every
// bucket is reduced (Note [Shrink], step 2).
Config shrink_config(std::vector<int> devices) {
  Config cfg = test::small_mlp_config(static_cast<int>(devices.size()), 8, OptimizerKind::adamw);
  cfg.trainer.devices = std::move(devices);
  cfg.trainer.bucket_cap_mb = 1e-4;
  cfg.trainer.on_worker_failure = WorkerFailurePolicy::shrink;
  cfg.trainer.stop_grace_s = 5.0;
  return cfg;
}

// Per process: CTest may run two cases that use one name at once.
fs::path fresh_dir(const std::string& name) {
  return test::fresh_dir(fmt::format("lockstep_shrink_{}_{}", getpid(), name));
}
using test::ScopedEnv;

// One run without faults on `devices`, from `from` (null: from scratch), writing a checkpoint
// every `every` steps into `dir` when `every` > 0. Returns its final parameters.
std::vector<float> plain_run(std::vector<int> devices, const Checkpoint* from, const fs::path& dir,
                             std::int64_t every, double clip, int accumulate) {
  Config cfg = shrink_config(std::move(devices));
  cfg.optimizer.clip_grad_norm = clip;
  cfg.trainer.accumulate_steps = accumulate;
  cfg.trainer.on_worker_failure = WorkerFailurePolicy::stop;
  if (every > 0) {
    cfg.trainer.checkpoint.dir = dir.string();
    cfg.trainer.checkpoint.every_steps = every;
    cfg.trainer.checkpoint.keep_last = 100;
  }
  Trainer trainer(cfg, train_split(), eval_split());
  if (from) trainer.resume_from(*from);
  trainer.run();
  return trainer.final_parameters();
}

Checkpoint checkpoint_at(const fs::path& dir, std::int64_t step) {
  return CheckpointManager::load(dir / fmt::format("step_{:08}.safetensors", step));
}

// What a run on `devices` that loses its workers as `losses` says ends with: each loss is
// (the step it happened in, the devices left), the runs chained by --resume from the step
// before; `clip` and `accumulate`: optimizer.clip_grad_norm and trainer.accumulate_steps.
std::vector<float> expected(std::vector<int> devices,
                            const std::vector<std::pair<std::int64_t, std::vector<int>>>& losses,
                            double clip = 5.0, int accumulate = 1) {
  std::optional<Checkpoint> from;
  for (const auto& [step, left] : losses) {
    const fs::path dir = fresh_dir(fmt::format("reference_{}", step));
    plain_run(devices, from ? &*from : nullptr, dir, step - 1, clip, accumulate);
    from = checkpoint_at(dir, step - 1);
    fs::remove_all(dir);
    devices = left;
  }
  return plain_run(devices, &*from, {}, 0, clip, accumulate);
}

}  // namespace

TEST_CASE("shrink: a worker lost before the update, the survivors end as a resume on them") {
  struct Case {
    std::vector<int> devices;
    const char* fault;
    std::int64_t step;
    std::vector<int> left;
    double clip = 5.0;  // 0: each bucket updated as it lands
    int accumulate = 1;
  };
  const Case cases[] = {{{0, 1}, "1:4:lost", 4, {0}},
                        {{0, 1, 2}, "1:5:lost:forward", 5, {0, 2}, 0.0},
                        {{0, 1}, "0:3:lost:backward", 3, {1}},
                        {{0, 1, 2}, "2:6:lost:backward", 6, {0, 1}, 0.0},
                        {{0, 1, 2}, "0:4:lost:all-reduce", 4, {1, 2}},
                        {{0, 1, 2, 3}, "2:5:lost:backward", 5, {0, 1, 3}, 5.0, 2},
                        {{0, 1, 2, 3}, "3:7:lost:all-reduce", 7, {0, 1, 2}}};
  for (const Case& c : cases) {
    CAPTURE(c.fault);
    const std::vector<float> want = expected(c.devices, {{c.step, c.left}}, c.clip, c.accumulate);
    ScopedEnv fault("LOCKSTEP_FAULT", c.fault);
    Config cfg = shrink_config(c.devices);
    cfg.optimizer.clip_grad_norm = c.clip;
    cfg.trainer.accumulate_steps = c.accumulate;
    Trainer trainer(cfg, train_split(), eval_split());
    const Summary s = trainer.run();
    CHECK(trainer.final_parameters() == want);
    CHECK(s.steps == 12);
    CHECK(s.replicas_identical);
    CHECK(s.devices == c.left);
    CHECK(s.workers_lost == 1);
    CHECK(s.recoveries == 1);
    CHECK(s.steps_redone == 0);
    CHECK(s.recovery_s > 0.0);
    CHECK(s.recovery_s < 5.0);
    // Every sample trained once: before the loss on every worker, after it on the survivors.
    const std::int64_t batch = 8 * c.accumulate;
    const std::int64_t before = (c.step - 1) * batch * static_cast<std::int64_t>(c.devices.size());
    CHECK(s.samples ==
          before + (12 - c.step + 1) * batch * static_cast<std::int64_t>(c.left.size()));
    const std::string json = s.to_json();
    CHECK(json.find("\"workers_lost\": 1,") != std::string::npos);
    CHECK(json.find("\"recoveries\": 1,") != std::string::npos);
  }
}

TEST_CASE("shrink: keep_global_batch raises the accumulation where the survivors divide it") {
  // 2 workers x 2 micro-batches lose one: 1 x 4, as a resume with accumulate_steps 4 does.
  const fs::path dir = fresh_dir("global_batch");
  plain_run({0, 1}, nullptr, dir, 4, 5.0, 2);
  const Checkpoint at = checkpoint_at(dir, 4);
  fs::remove_all(dir);
  const std::vector<float> want = plain_run({0}, &at, {}, 0, 5.0, 4);
  // Where the survivors do not divide it, each worker keeps its batch.
  const std::vector<float> kept = expected({0, 1, 2}, {{5, {0, 1}}});
  {
    ScopedEnv fault("LOCKSTEP_FAULT", "1:5:lost:backward");
    Config cfg = shrink_config({0, 1});
    cfg.trainer.accumulate_steps = 2;
    cfg.trainer.keep_global_batch = true;
    Trainer trainer(cfg, train_split(), eval_split());
    const Summary s = trainer.run();
    CHECK(trainer.final_parameters() == want);
    CHECK(s.accumulate_steps == 4);
    CHECK(s.samples == 12 * 2 * 2 * 8);  // the global batch kept: 32 samples every step
    CHECK(s.workers_lost == 1);
  }
  ScopedEnv fault("LOCKSTEP_FAULT", "2:5:lost");
  Config odd = shrink_config({0, 1, 2});
  odd.trainer.keep_global_batch = true;
  Trainer again(odd, train_split(), eval_split());
  const Summary t = again.run();
  CHECK(again.final_parameters() == kept);
  CHECK(t.accumulate_steps == 1);
}

TEST_CASE("shrink: where the step's start is gone, the newest snapshot is the state") {
  // Snapshots every 3 steps; the loss at step 8. With ZeRO-1 the lost worker's shard is gone:
  // the state is the snapshot of step 6, and step 7 is taken again. A loss in the update phase
  // usually finds the survivors updating (then the same), but a survivor aborted while its last
  // bucket's all-reduce was finishing still holds the start of step 8: both are right.
  struct Case {
    const char* fault;
    int zero;
    bool may_start_at_step = false;
  };
  const Case cases[] = {{"1:8:lost:backward", 1}, {"2:8:lost:update", 0, true}};
  for (const Case& c : cases) {
    CAPTURE(c.fault);
    const fs::path dir = fresh_dir("snapshot");
    Config reference = shrink_config({0, 1, 2});
    reference.trainer.zero = c.zero;
    reference.trainer.on_worker_failure = WorkerFailurePolicy::stop;
    reference.trainer.checkpoint.dir = dir.string();
    reference.trainer.checkpoint.every_steps = 1;
    reference.trainer.checkpoint.keep_last = 100;
    Trainer(reference, train_split(), eval_split()).run();

    Config cfg = shrink_config({0, 1, 2});
    cfg.trainer.zero = c.zero;
    cfg.trainer.snapshot_every = 3;
    Trainer trainer(cfg, train_split(), eval_split());
    Summary s;
    {
      ScopedEnv fault("LOCKSTEP_FAULT", c.fault);
      s = trainer.run();
    }
    CHECK(s.workers_lost == 1);
    CHECK(s.recoveries == 1);
    CHECK((s.steps_redone == 1 || (c.may_start_at_step && s.steps_redone == 0)));

    Config survivors = reference;
    survivors.trainer.devices = s.devices;
    survivors.trainer.checkpoint.dir.clear();
    Trainer resumed(survivors, train_split(), eval_split());
    resumed.resume_from(checkpoint_at(dir, 7 - s.steps_redone));
    fs::remove_all(dir);
    resumed.run();
    CHECK(trainer.final_parameters() == resumed.final_parameters());
    CHECK(s.devices.size() == 2);
  }
}

TEST_CASE("shrink: two losses in one run chain two recoveries") {
  const std::vector<float> want = expected({0, 1, 2}, {{3, {0, 2}}, {7, {0}}});
  ScopedEnv fault("LOCKSTEP_FAULT", "1:3:lost");
  Config cfg = shrink_config({0, 1, 2});
  const fs::path metrics_dir = fresh_dir("metrics"), metrics = metrics_dir / "metrics.jsonl";
  cfg.trainer.metrics = metrics.string();
  Trainer trainer(cfg, train_split(), eval_split());
  TrainerHooks hooks;
  // The second loss: rank 1 of the survivors (device 2), as its step 7 begins.
  hooks.before_forward = [](int rank, std::int64_t step) {
    if (rank == 1 && step == 7) throw DeviceLost("test: the device was lost at step 7");
  };
  trainer.set_hooks(hooks);
  const Summary s = trainer.run();
  CHECK(trainer.final_parameters() == want);
  CHECK(s.devices == std::vector<int>{0});
  CHECK(s.workers_lost == 2);
  CHECK(s.recoveries == 2);
  CHECK(s.steps_redone == 0);
  CHECK(s.steps == 12);
  // The metrics stream has a line for each.
  std::ifstream in(metrics);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_MESSAGE(text.find("{\"kind\": \"recovery\", \"step\": 3, \"lost\": \"cpu:1\", "
                          "\"workers\": 2, \"steps_redone\": 0, \"recovery_s\": ") !=
                    std::string::npos,
                text);
  CHECK_MESSAGE(text.find("{\"kind\": \"recovery\", \"step\": 7, \"lost\": \"cpu:2\", "
                          "\"workers\": 1, ") != std::string::npos,
                text);
  fs::remove_all(metrics_dir);
}

TEST_CASE("shrink: where the state at the step's start is gone, the run stops and says why") {
  struct Case {
    std::vector<int> devices;
    const char* fault;
    int zero;
    int min_workers;
    const char* why;
  };
  const Case cases[] = {
      {{0, 1}, "1:5:lost", 1, 1,
       "with trainer.zero: 1 the lost worker held its shard of the optimizer state, and there is "
       "no in-memory snapshot to recover from (trainer.snapshot_every)"},
      {{0, 1}, "1:5:lost", 0, 2, "1 of 2 workers are left, fewer than trainer.min_workers = 2"}};
  for (const Case& c : cases) {
    CAPTURE(c.fault);
    ScopedEnv fault("LOCKSTEP_FAULT", c.fault);
    Config cfg = shrink_config(c.devices);
    cfg.trainer.zero = c.zero;
    cfg.trainer.min_workers = c.min_workers;
    cfg.trainer.stop_grace_s = 2.0;
    Trainer trainer(cfg, train_split(), eval_split());
    const auto t0 = std::chrono::steady_clock::now();
    try {
      trainer.run();
      FAIL("run() should have thrown");
    } catch (const WorkerError& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.find("the device was lost") != std::string::npos, what);
      CHECK_MESSAGE(what.find("trainer.on_worker_failure: shrink cannot go on: ") !=
                        std::string::npos,
                    what);
      CHECK_MESSAGE(what.find(c.why) != std::string::npos, what);
    }
    // A stop bounded by trainer.stop_grace_s, with slack for a busy machine.
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
  }
}

TEST_CASE("on_worker_failure: stop, the default, stops at a lost device as at any failure") {
  ScopedEnv fault("LOCKSTEP_FAULT", "1:4:lost:backward");
  Config cfg = shrink_config({0, 1});
  cfg.trainer.on_worker_failure = Config{}.trainer.on_worker_failure;
  Trainer trainer(cfg, train_split(), eval_split());
  try {
    trainer.run();
    FAIL("run() should have thrown");
  } catch (const WorkerError& e) {
    CHECK(e.rank() == 1);
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("injected fault: the device was lost in backward at step 4") !=
                      std::string::npos,
                  what);
    CHECK(what.find("shrink") == std::string::npos);
  }
  // A fault kind or phase that does not exist is refused by name.
  ScopedEnv bad("LOCKSTEP_FAULT", "1:4:lost:sideways");
  CHECK_THROWS_WITH_AS(Trainer(cfg, train_split(), eval_split()).run(),
                       doctest::Contains("lost:PHASE with PHASE one of forward, backward, "
                                         "all-reduce, update), got '1:4:lost:sideways'"),
                       InputError);
}

TEST_CASE("trainer.on_worker_failure and min_workers are config keys") {
  const Config cfg = parse_config("data:\n  dataset: synthetic\ntrainer:\n  steps: 5\n  on_worker_failure: shrink\n  min_workers: 3\n",
                                  "test");
  CHECK(cfg.trainer.on_worker_failure == WorkerFailurePolicy::shrink);
  CHECK(cfg.trainer.min_workers == 3);
  CHECK_THROWS_AS(parse_config("data:\n  dataset: synthetic\ntrainer:\n  steps: 5\n  on_worker_failure: grow\n", "test"), InputError);
  CHECK_THROWS_AS(parse_config("data:\n  dataset: synthetic\ntrainer:\n  steps: 5\n  min_workers: 0\n", "test"), InputError);
}
