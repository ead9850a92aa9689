// trainer.on_worker_failure: shrink (Note [Shrink] in src/train/recovery.hpp): a run that loses
// a worker's device at step s goes on with the survivors from the start of step s, and ends
// bit-identical to a run that --resumes from a checkpoint of step s - 1 on the survivors'
// devices. Each case is a 12-step run of the small MLP on the CPU, over 480 samples in batches
// of 8 on 1 to 4 workers.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"
#include "train/failures.hpp"
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

// Samples that `world` workers train in `batches` batches of 8 each, from position `start` of
// an epoch of 480 on: the epoch's rest, ceil((480 - start) / world) samples per worker (its last
// batch short), then whole epochs.
std::int64_t samples_after(std::size_t start, int world, std::int64_t batches) {
  const auto n = static_cast<std::size_t>(world);
  std::size_t per_worker = (480 - start + n - 1) / n, at = 0;
  std::int64_t samples = 0;
  for (std::int64_t b = 0; b < batches; ++b) {
    if (at == per_worker) {  // the next epoch, whole
      per_worker = (480 + n - 1) / n;
      at = 0;
    }
    const std::size_t take = std::min<std::size_t>(8, per_worker - at);
    at += take;
    samples += static_cast<std::int64_t>(take * n);
  }
  return samples;
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
    // Every sample trained once: before the loss on every worker, after it on the survivors,
    // who share the epoch's rest from the first position not trained (Note [Re-sharding]).
    const std::int64_t before =
        (c.step - 1) * 8 * c.accumulate * static_cast<std::int64_t>(c.devices.size());
    CHECK(s.samples == before + samples_after(static_cast<std::size_t>(before),
                                              static_cast<int>(c.left.size()),
                                              (12 - c.step + 1) * c.accumulate));
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

// Note [Deferred step read]: without replica checks each step is read during the next one's
// forward. A worker lost in step 5's forward never agrees step 4's totals, but every survivor
// had applied step 4's update (its all-reduce had completed everywhere: Note [A completed phase
// stands]), so the state is the one after step 4, the same every time: the run ends as a resume
// from a checkpoint of step 4, nothing redone, snapshots or none. Before, a survivor aborted
// while waking from step 4's last all-reduce held step 4's start and the others did not, so the
// same run recovered in some runs and stopped in others ("had begun the update of step 4").
TEST_CASE("shrink: lost before the step before was agreed, the same recovery every time") {
  const std::vector<int> devices = {0, 1, 2};
  const std::vector<float> want = expected(devices, {{5, {0, 2}}}, 0.0);
  ScopedEnv fault("LOCKSTEP_FAULT", "1:5:lost:forward");
  for (const int snapshot_every : {0, 3, 0, 3, 0}) {
    CAPTURE(snapshot_every);
    Config cfg = shrink_config(devices);
    cfg.optimizer.clip_grad_norm = 0.0;
    cfg.trainer.check_replicas_every = 0;
    cfg.trainer.snapshot_every = snapshot_every;
    Trainer trainer(cfg, train_split(), eval_split());
    Summary s;
    REQUIRE_NOTHROW(s = trainer.run());
    CHECK(s.recoveries == 1);
    CHECK(s.steps_redone == 0);
    CHECK(s.steps == 12);
    CHECK(s.devices == std::vector<int>{0, 2});
    CHECK(s.samples == 4 * 3 * 8 + 8 * 2 * 8);  // step 4 on three workers, counted once
    CHECK(trainer.final_parameters() == want);
  }
}

// Note [Window across a shrink]: the loss in forward at step 5 leaves step 4's update applied
// and its totals unagreed. Every step has one line (log_every 1): steps 1-3 and step 4's update
// (its norm and rate) are those of a run without the loss; step 4's loss and accuracy are over
// the survivors' 16 samples (losing each worker in turn, the three such lines average to the
// run's). A longer window (log_every 3 and 4) holds each of its steps once:
// its line is the mean of the single-step lines weighted by their samples (24 before the loss,
// 16 from step 4 on).
TEST_CASE("shrink: the log window goes on across a shrink, and the step never agreed has its line") {
  struct Line {
    double loss, accuracy, grad_norm, lr;
  };
  const auto run = [](int log_every, const char* fault) {
    Config cfg = shrink_config({0, 1, 2});
    cfg.optimizer.clip_grad_norm = 0.0;
    cfg.trainer.check_replicas_every = 0;
    cfg.trainer.log_every = log_every;
    Trainer trainer(cfg, train_split(), eval_split());
    std::vector<std::pair<std::int64_t, Line>> lines, progress;
    trainer.on_step([&](const StepMetrics& m) {
      lines.push_back({m.step, {m.loss, m.accuracy, m.grad_norm, m.lr}});
    });
    trainer.on_progress([&](const StepMetrics& m) {
      progress.push_back({m.step, {m.loss, m.accuracy, m.grad_norm, m.lr}});
    });
    ScopedEnv env("LOCKSTEP_FAULT", fault);
    const Summary s = trainer.run();
    // The survivors' communicator after a shrink.
    CHECK(s.communicator == fmt::format("shared memory: {} workers of one process", *fault ? 2 : 3));
    CHECK(s.to_json().find("\"communicator\": \"shared memory") != std::string::npos);
    CHECK(s.recoveries == (*fault ? 1 : 0));
    CHECK(s.steps_redone == 0);
    return std::pair{lines, progress};
  };
  const auto [plain, plain_progress] = run(1, "");
  const auto [each, each_progress] = run(1, "1:5:lost:forward");
  REQUIRE(plain.size() == 12);
  REQUIRE(each.size() == 12);
  REQUIRE(each_progress.size() == 12);
  for (std::size_t i = 0; i < each.size(); ++i) {
    CAPTURE(i);
    CHECK(each[i].first == static_cast<std::int64_t>(i) + 1);
    CHECK(each_progress[i].first == static_cast<std::int64_t>(i) + 1);
  }
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(each[i].second.loss == plain[i].second.loss);
    CHECK(each[i].second.accuracy == plain[i].second.accuracy);
    CHECK(each[i].second.grad_norm == plain[i].second.grad_norm);
  }
  CHECK(each[3].second.grad_norm == plain[3].second.grad_norm);  // step 4's update stands
  CHECK(each[3].second.lr == plain[3].second.lr);
  // Step 4's loss over two workers' samples, each worker's 8: losing each of the three in turn,
  // the three lines' mean is the three workers' mean, the run without the loss.
  double loss = each[3].second.loss, accuracy = each[3].second.accuracy;
  for (const char* other : {"0:5:lost:forward", "2:5:lost:forward"}) {
    const auto lines = run(1, other).first;
    REQUIRE(lines.size() == 12);
    CHECK(lines[3].first == 4);
    CHECK(lines[3].second.loss != plain[3].second.loss);
    loss += lines[3].second.loss;
    accuracy += lines[3].second.accuracy;
  }
  CHECK(loss / 3 == doctest::Approx(plain[3].second.loss).epsilon(1e-12));
  CHECK(accuracy / 3 == doctest::Approx(plain[3].second.accuracy).epsilon(1e-12));

  const auto samples = [](std::int64_t step) { return step < 4 ? 24.0 : 16.0; };
  for (const int log_every : {3, 4}) {
    CAPTURE(log_every);
    const auto lines = run(log_every, "1:5:lost:forward").first;
    std::int64_t first = 1;
    REQUIRE(lines.size() == static_cast<std::size_t>(12 / log_every));
    for (const auto& [step, line] : lines) {
      CAPTURE(step);
      CHECK(step % log_every == 0);
      double loss = 0.0, accuracy = 0.0, n = 0.0;
      for (std::int64_t k = first; k <= step; ++k) {
        loss += each[static_cast<std::size_t>(k - 1)].second.loss * samples(k);
        accuracy += each[static_cast<std::size_t>(k - 1)].second.accuracy * samples(k);
        n += samples(k);
      }
      CHECK(line.loss == doctest::Approx(loss / n).epsilon(1e-12));
      CHECK(line.accuracy == doctest::Approx(accuracy / n).epsilon(1e-12));
      CHECK(line.grad_norm == each[static_cast<std::size_t>(step - 1)].second.grad_norm);
      first = step + 1;
    }
  }
}

TEST_CASE("shrink: where the survivors hold no whole state, the newest snapshot is the state") {
  // Snapshots every 3 steps; the loss at step 8. With ZeRO-1 the lost worker's shard is gone;
  // with updates per bucket (no clipping) a lost:all-reduce lets the first bucket land and be
  // applied: the state is the snapshot of step 6, and the steps whose update was applied after
  // it are taken again (7, and 8 for a loss in its update phase). Without either a loss in the
  // update phase leaves every survivor with step 8's update applied: the state after step 8.
  // Each phase meets ZeRO-1 at least once, and accumulation, at N = 2, 3 and 4.
  struct Case {
    std::vector<int> devices;
    const char* fault;
    int zero;
    std::int64_t from;  // the step of the state the survivors go on from
    std::int64_t redone;
    int accumulate = 1;
    double clip = 5.0;
  };
  const Case cases[] = {{{0, 1, 2}, "1:8:lost:backward", 1, 6, 1},
                        {{0, 1, 2}, "2:8:lost:update", 0, 8, 0},
                        {{0, 1, 2, 3}, "0:8:lost:forward", 1, 6, 1},
                        {{0, 1}, "1:8:lost:all-reduce", 1, 6, 1, 2},
                        {{0, 1}, "0:8:lost:update", 1, 6, 2, 2},
                        {{0, 1, 2, 3}, "3:8:lost:update", 0, 8, 0},
                        {{0, 1, 2}, "0:8:lost:all-reduce", 0, 6, 1, 1, 0.0},
                        // ZeRO-2: the lost worker's gradient shard is gone as well.
                        {{0, 1, 2}, "1:8:lost:backward", 2, 6, 1},
                        {{0, 1, 2, 3}, "2:8:lost:all-reduce", 2, 6, 1, 1, 0.0}};
  for (const Case& c : cases) {
    CAPTURE(c.fault);
    CAPTURE(c.devices.size());
    const fs::path dir = fresh_dir("snapshot");
    Config reference = shrink_config(c.devices);
    reference.optimizer.clip_grad_norm = c.clip;
    reference.trainer.zero = c.zero;
    reference.trainer.accumulate_steps = c.accumulate;
    reference.trainer.on_worker_failure = WorkerFailurePolicy::stop;
    reference.trainer.checkpoint.dir = dir.string();
    reference.trainer.checkpoint.every_steps = 1;
    reference.trainer.checkpoint.keep_last = 100;
    Trainer(reference, train_split(), eval_split()).run();

    Config cfg = shrink_config(c.devices);
    cfg.optimizer.clip_grad_norm = c.clip;
    cfg.trainer.zero = c.zero;
    cfg.trainer.accumulate_steps = c.accumulate;
    cfg.trainer.snapshot_every = 3;
    Trainer trainer(cfg, train_split(), eval_split());
    Summary s;
    {
      ScopedEnv fault("LOCKSTEP_FAULT", c.fault);
      s = trainer.run();
    }
    CHECK(s.workers_lost == 1);
    CHECK(s.recoveries == 1);
    CHECK(s.steps_redone == c.redone);

    Config survivors = reference;
    survivors.trainer.devices = s.devices;
    survivors.trainer.checkpoint.dir.clear();
    Trainer resumed(survivors, train_split(), eval_split());
    resumed.resume_from(checkpoint_at(dir, c.from));
    fs::remove_all(dir);
    resumed.run();
    CHECK(trainer.final_parameters() == resumed.final_parameters());
    CHECK(s.devices.size() == c.devices.size() - 1);
  }
}

// Note [Shrink]: with no state in memory as new (no snapshots, ZeRO-1 took the step's start
// with the lost shard), the newest checkpoint the run wrote is the state; the steps after it are
// taken again, and the run ends as a resume from it on the survivors.
TEST_CASE("shrink: with no snapshot, the newest checkpoint on disk is the state") {
  const fs::path dir = fresh_dir("on_disk");
  Config cfg = shrink_config({0, 1, 2});
  cfg.trainer.zero = 1;
  cfg.trainer.checkpoint.dir = dir.string();
  cfg.trainer.checkpoint.every_steps = 3;
  cfg.trainer.checkpoint.keep_last = 100;
  Trainer trainer(cfg, train_split(), eval_split());
  Summary s;
  {
    ScopedEnv fault("LOCKSTEP_FAULT", "1:8:lost:backward");
    s = trainer.run();
  }
  CHECK(s.workers_lost == 1);
  CHECK(s.recoveries == 1);
  CHECK(s.steps_redone == 1);  // step 7: the checkpoint is of step 6
  CHECK(s.devices == std::vector<int>{0, 2});

  Config survivors = cfg;
  survivors.trainer.devices = s.devices;
  survivors.trainer.on_worker_failure = WorkerFailurePolicy::stop;
  survivors.trainer.checkpoint.dir.clear();
  Trainer resumed(survivors, train_split(), eval_split());
  resumed.resume_from(checkpoint_at(dir, 6));
  fs::remove_all(dir);
  resumed.run();
  CHECK(trainer.final_parameters() == resumed.final_parameters());
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

TEST_CASE("shrink: two workers lost in one step, the two others go on from its start") {
  const std::vector<float> want = expected({0, 1, 2, 3}, {{5, {0, 3}}});
  Trainer trainer(shrink_config({0, 1, 2, 3}), train_split(), eval_split());
  TrainerHooks hooks;
  // Ranks 1 and 2 both reach step 5, then both lose their devices; once (in the survivors'
  // group ranks 1 and 2 are other devices).
  hooks.before_forward = [arrived = std::make_shared<std::atomic<int>>(0)](int rank,
                                                                          std::int64_t step) {
    if ((rank != 1 && rank != 2) || step != 5 || arrived->load() >= 2) return;
    arrived->fetch_add(1);
    while (arrived->load() < 2) std::this_thread::yield();
    throw DeviceLost(fmt::format("test: the device of rank {} was lost at step 5", rank));
  };
  trainer.set_hooks(hooks);
  const Summary s = trainer.run();
  CHECK(trainer.final_parameters() == want);
  CHECK(s.devices == std::vector<int>{0, 3});
  CHECK(s.workers_lost == 2);
  CHECK(s.recoveries == 1);
  CHECK(s.steps_redone == 0);
}

// A survivor's device dies while the survivors' group restores the recovery's state, or in that
// group's first step: the state is still in memory, so the run recovers again from it (with its
// sample position as first recorded), with one worker fewer; below trainer.min_workers it stops,
// as at any loss, within trainer.stop_grace_s.
TEST_CASE("shrink: a second loss during the recovery recovers again from its state, or stops") {
  const std::vector<float> want = expected({0, 1, 2, 3}, {{5, {0, 3}}});
  struct Case {
    int min_workers;
    bool in_first_step;  // else as it restores the state
  };
  for (const Case c : {Case{1, false}, Case{1, true}, Case{3, false}}) {
    const int min_workers = c.min_workers;
    CAPTURE(min_workers);
    CAPTURE(c.in_first_step);
    ScopedEnv fault("LOCKSTEP_FAULT", "1:5:lost");
    Config cfg = shrink_config({0, 1, 2, 3});
    cfg.trainer.min_workers = min_workers;
    cfg.trainer.stop_grace_s = 2.0;
    Trainer trainer(cfg, train_split(), eval_split());
    auto set_ups = std::make_shared<std::atomic<int>>(0);
    auto once = std::make_shared<std::atomic<bool>>(false);
    TrainerHooks hooks;
    // The first group restores 4 workers, the survivors' 3: its rank 1 (device 2) fails.
    hooks.restoring = [set_ups, once, c](int rank) {
      if (set_ups->fetch_add(1) >= 4 && rank == 1 && !c.in_first_step && !once->exchange(true))
        throw DeviceLost("test: the device was lost during the recovery");
    };
    // Or once its ranks 0 and 2 have begun its first step.
    hooks.before_forward = [set_ups, once, c, begun = std::make_shared<std::atomic<int>>(0)](
                               int rank, std::int64_t step) {
      if (set_ups->load() <= 4 || step != 5 || !c.in_first_step || once->load()) return;
      if (rank != 1) {
        begun->fetch_add(1);
        return;
      }
      while (begun->load() < 2) std::this_thread::yield();
      once->store(true);
      throw DeviceLost("test: the device was lost during the recovery");
    };
    trainer.set_hooks(hooks);
    const auto t0 = std::chrono::steady_clock::now();
    if (min_workers == 1) {
      const Summary s = trainer.run();
      CHECK(trainer.final_parameters() == want);
      CHECK(s.devices == std::vector<int>{0, 3});
      CHECK(s.workers_lost == 2);
      CHECK(s.recoveries == 2);
      CHECK(s.steps_redone == 0);
      CHECK(s.steps == 12);
      continue;
    }
    try {
      trainer.run();
      FAIL("run() should have thrown");
    } catch (const WorkerError& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.find("the device was lost during the recovery; trainer.on_worker_failure: "
                              "shrink cannot go on: 2 of 3 workers are left, fewer than "
                              "trainer.min_workers = 3") != std::string::npos,
                    what);
    }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
  }
}

// Note [Shrink], step 1: the lost worker's thread never returns (lost:...:stuck); after
// trainer.stop_grace_s it is left running, as Note [Bounded stop] leaves one, and the survivors
// go on without it.
TEST_CASE("shrink: a lost worker whose thread never returns is left behind, the survivors go on") {
  const std::vector<float> want = expected({0, 1, 2}, {{5, {0, 1}}});
  ScopedEnv fault("LOCKSTEP_FAULT", "2:5:lost:backward:stuck");
  Config cfg = shrink_config({0, 1, 2});
  cfg.trainer.stop_grace_s = 0.5;
  // Left running, it refers to the trainer's state: the Trainer leaks it when destroyed.
  Trainer trainer(cfg, train_split(), eval_split());
  const Summary s = trainer.run();
  CHECK(trainer.final_parameters() == want);
  CHECK(s.devices == std::vector<int>{0, 1});
  CHECK(s.workers_lost == 1);
  CHECK(s.recoveries == 1);
  CHECK(s.steps_redone == 0);
  CHECK(s.recovery_s >= 0.5);  // the grace it was given
  CHECK(s.recovery_s < 3.0);
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
       "no in-memory snapshot (trainer.snapshot_every) or checkpoint on disk to recover from"},
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
                                         "all-reduce, update; either may end in :stuck), got '1:4:lost:sideways'"),
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

// The note a shrink prints names every worker lost, not only the first (two may go in a step).
TEST_CASE("shrink: the failure log words every lost worker's error, in the order caught") {
  detail::FailureLog log;
  log.record(2, std::make_exception_ptr(DeviceLost("the device of rank 2 was lost")), "cpu:2");
  log.record(0, std::make_exception_ptr(CommAborted()), "cpu:0");
  log.record(1, std::make_exception_ptr(DeviceLost("the device of rank 1 was lost")), "cpu:1");
  CHECK(log.lost_ranks() == std::vector<int>{2, 1});
  const std::vector<std::string> losses = log.losses();
  REQUIRE(losses.size() == 2);
  CHECK(losses[0] == "worker 2 (cpu:2): the device of rank 2 was lost");
  CHECK(losses[1] == "worker 1 (cpu:1): the device of rank 1 was lost");
}
