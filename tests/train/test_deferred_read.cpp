// Note [Deferred step read] in src/train/worker_loop.hpp: each step's record is read while the
// next step's first forward is queued, on the CPU as on a GPU. Against the same runs read at
// each step's end (TrainerHooks::defer_read = false): the same metrics, bit for bit, each step
// once and in order; the non-finite policy keeps every NaN out of the weights and names the
// step; a stop request stops at the same step, with a checkpoint that resumes bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<const Dataset> synthetic(std::size_t n, std::uint64_t seed) {
  return std::make_shared<InMemoryDataset>(make_synthetic(n, 10, 3, seed));
}

Config mlp_config(int devices) {
  Config cfg = test::cpu_config(devices, /*batch=*/8, /*steps=*/9, /*seed=*/7);
  cfg.model.hidden = {16, 16};
  cfg.optimizer.type = OptimizerKind::adamw;
  cfg.optimizer.lr = 0.01;
  cfg.trainer.log_every = 1;
  cfg.trainer.check_replicas_every = 0;
  cfg.trainer.eval_every = 4;  // steps 4 and 8 (and 9, the last) are read at their end
  return cfg;
}

// The bits of what a step reports.
std::string bits(const StepMetrics& m) {
  const auto hex = [](double x) {
    std::uint64_t u = 0;
    std::memcpy(&u, &x, sizeof(u));
    return fmt::format("{:016x}", u);
  };
  return fmt::format("step {} loss {} acc {} lr {} norm {}", m.step, hex(m.loss), hex(m.accuracy),
                     hex(m.lr), hex(m.grad_norm));
}

struct Run {
  std::vector<std::string> steps;   // on_step, in the order reported
  std::vector<std::string> events;  // "forward k" (rank 0's before_forward) and "step k"
  std::vector<float> params;
  Summary summary;
};

Run train(const Config& cfg, bool defer) {
  Trainer trainer(cfg, synthetic(240, 1), synthetic(30, 2));
  Run run;
  std::mutex mutex;
  TrainerHooks hooks;
  hooks.defer_read = defer;
  hooks.before_forward = [&](int rank, std::int64_t step) {
    std::lock_guard lock(mutex);
    if (rank == 0) run.events.push_back(fmt::format("forward {}", step));
  };
  trainer.set_hooks(hooks);
  trainer.on_step([&](const StepMetrics& m) {
    std::lock_guard lock(mutex);
    run.steps.push_back(bits(m));
    run.events.push_back(fmt::format("step {}", m.step));
  });
  run.summary = trainer.run();
  run.params = trainer.final_parameters();
  return run;
}

// Where "step k" came among the events: after "forward k+1" when its read was deferred.
bool reported_after_next_forward(const std::vector<std::string>& events, std::int64_t step) {
  const auto at = [&](const std::string& e) {
    return std::find(events.begin(), events.end(), e) - events.begin();
  };
  return at(fmt::format("step {}", step)) > at(fmt::format("forward {}", step + 1));
}

}  // namespace

TEST_CASE("deferred read: each step reported once, in order, with the bits of a read at its end") {
  // Per bucket; a norm agreed first, with accumulation, clipping and skip; ZeRO-1.
  const std::vector<std::pair<const char*, std::function<void(Config&)>>> variants = {
      {"plain", [](Config&) {}},
      {"accumulate 2, clip 0.5, skip",
       [](Config& cfg) {
         cfg.trainer.accumulate_steps = 2;
         cfg.optimizer.clip_grad_norm = 0.5;
         cfg.trainer.on_nonfinite = NonfinitePolicy::skip;
       }},
      {"ZeRO-1", [](Config& cfg) { cfg.trainer.zero = 1; }},
      {"ZeRO-2", [](Config& cfg) { cfg.trainer.zero = 2; }}};
  for (const auto& [name, apply] : variants) {
    CAPTURE(std::string(name));
    Config cfg = mlp_config(2);
    apply(cfg);
    const Run deferred = train(cfg, true), at_end = train(cfg, false);
    REQUIRE(deferred.steps.size() == 9);
    CHECK(deferred.steps == at_end.steps);
    CHECK(deferred.params == at_end.params);
    CHECK(deferred.summary.final_train_loss == at_end.summary.final_train_loss);
    CHECK(deferred.summary.eval_loss == at_end.summary.eval_loss);
    // One host sync per step either way (Note [Host syncs]).
    CHECK(deferred.summary.host_syncs_per_step == 1);
    CHECK(at_end.summary.host_syncs_per_step == 1);
    // Read during the next step's forward, but where the step's end needs the device: eval
    // after steps 4 and 8, and the last step.
    for (std::int64_t step = 1; step < 9; ++step) {
      CAPTURE(step);
      CHECK(reported_after_next_forward(deferred.events, step) == (step % 4 != 0));
      CHECK_FALSE(reported_after_next_forward(at_end.events, step));
    }
  }
}

TEST_CASE("deferred read: on_nonfinite stop keeps the NaN out of the weights and names its step") {
  // Updates per bucket (no clipping, on_nonfinite: stop), with and without ZeRO-1: each bucket's
  // own skip flag drops the NaN bucket's update while step 8's forward is queued on the
  // weights after step 7.
  for (const int zero : {0, 1}) {
    CAPTURE(zero);
    test::ScopedEnv fault("LOCKSTEP_FAULT", "1:7:nan");
    Config cfg = mlp_config(2);
    cfg.trainer.eval_every = 0;
    cfg.trainer.steps = 12;
    cfg.trainer.zero = zero;
    cfg.trainer.bucket_cap_mb = 0.0001;  // a bucket per layer
    Trainer trainer(cfg, synthetic(240, 1), synthetic(30, 2));
    Replica* replica = nullptr;
    std::vector<float> after_6, after_7;
    TrainerHooks hooks;
    hooks.after_update = [&](int rank, std::int64_t step, Replica& r) {
      if (rank == 0 && step == 6) {
        replica = &r;
        after_6 = r.parameters();
      }
    };
    hooks.before_forward = [&](int rank, std::int64_t step) {
      if (rank == 0 && step == 8 && replica) after_7 = replica->parameters();
    };
    trainer.set_hooks(hooks);
    CHECK_THROWS_WITH_AS(
        trainer.run(),
        doctest::Contains("non-finite gradient at step 7: global norm nan, first in layers.4.weight"),
        WorkerError);
    REQUIRE(after_7.size() == after_6.size());
    REQUIRE(!after_7.empty());
    std::size_t nonfinite = 0, changed = 0;
    for (std::size_t i = 0; i < after_7.size(); ++i) {
      nonfinite += std::isfinite(after_7[i]) ? 0 : 1;
      changed += after_7[i] != after_6[i] ? 1 : 0;
    }
    CHECK(nonfinite == 0);
    CHECK(changed > 0);  // the finite buckets took step 7's update as they landed
  }
}

TEST_CASE("deferred read: a stop request stops at the same step, and its checkpoint resumes") {
  const auto config = [](const fs::path& dir) {
    Config cfg = mlp_config(2);
    cfg.trainer.eval_every = 0;
    cfg.trainer.steps = 12;
    cfg.trainer.checkpoint.dir = dir.string();
    return cfg;
  };
  // Asked during step 5's report (after_update), as SIGINT would: agreed at step 6's read.
  const auto stopped = [&](bool defer, const fs::path& dir) {
    Trainer first(config(dir), synthetic(240, 1), synthetic(30, 2));
    TrainerHooks hooks;
    hooks.defer_read = defer;
    hooks.after_update = [&first](int rank, std::int64_t step, Replica&) {
      if (rank == 0 && step == 5) first.request_stop();
    };
    first.set_hooks(hooks);
    const Summary s = first.run();
    CHECK(s.stopped_early);
    CHECK(s.steps == 6);
    CHECK(s.replicas_identical);
    return *CheckpointManager(dir, 0).load_latest();
  };
  const Checkpoint deferred = stopped(true, test::fresh_dir("lockstep_deferred_stop"));
  const Checkpoint at_end = stopped(false, test::fresh_dir("lockstep_deferred_stop_at_end"));
  CHECK(deferred.state.step == 6);
  CHECK(deferred.state.samples == at_end.state.samples);
  CHECK(deferred.state.batch_in_epoch == at_end.state.batch_in_epoch);
  CHECK(deferred.state.optimizer_steps == 6);
  CHECK(deferred.params == at_end.params);
  REQUIRE(deferred.optimizer_state.size() == at_end.optimizer_state.size());
  for (std::size_t i = 0; i < deferred.optimizer_state.size(); ++i)
    CHECK(deferred.optimizer_state[i].values == at_end.optimizer_state[i].values);

  // Resumed: the uninterrupted run, bit for bit.
  Trainer uninterrupted(config(test::fresh_dir("lockstep_deferred_whole")), synthetic(240, 1),
                        synthetic(30, 2));
  uninterrupted.run();
  Trainer again(config(test::fresh_dir("lockstep_deferred_again")), synthetic(240, 1),
                synthetic(30, 2));
  again.resume_from(deferred);
  CHECK(again.run().steps == 12);
  CHECK(again.final_parameters() == uninterrupted.final_parameters());
}
