// ZeRO-1 (trainer.zero: 1, Note [ZeRO-1] in src/train/reducer.hpp) against the replicated
// optimiser on the CPU backend:
//   - the same run ends with bit-identical parameters, for SGD with momentum and AdamW, with
//     clipping active, N = 2, 3, 4; each worker holds its shards' state, together the whole;
//   - checkpoints hold the whole state: a zero 1 checkpoint is bit-identical to zero 0's, and
//     resumes on another device count and with zero 0, as zero 0's does;
//   - a decoder, GPT-2 or a Llama, ends bit-identical under zero 1 and 2 too.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "lockstep/lockstep.hpp"
#include "train/reducer.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<const Dataset> synthetic(std::size_t n, std::uint64_t seed) {
  return std::make_shared<InMemoryDataset>(make_synthetic(n, 12, 4, seed));
}

// A 12-256-256-4 MLP, 70,148 parameters: with 0.05 MB buckets every layer is a bucket of its own,
// and the middle one (65,792) is 5 grains of kZeroGrain, so that every rank of 2 to 4 owns a
// shard of it. The clip norm is below the gradient's norm, so clipping scales every step. Weight
// decay applies to the matrices only (Note [Decay groups]), so the shards' edges cut across runs
// of decayed and undecayed elements.
Config zero_config(int devices, OptimizerKind opt, int zero) {
  Config cfg = test::small_mlp_config(devices, /*batch=*/6, opt);
  cfg.model.hidden = {256, 256};
  cfg.optimizer.clip_grad_norm = 0.05;
  cfg.optimizer.weight_decay = 0.01;
  cfg.trainer.bucket_cap_mb = 0.05;
  cfg.trainer.zero = zero;
  return cfg;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep_zero_" + name);
  fs::remove_all(dir);
  return dir;
}

}  // namespace

TEST_CASE("zero 1 ends bit-identical to zero 0 (SGD with momentum, AdamW, clipping, N = 2..4)") {
  auto train = synthetic(240, 1), eval = synthetic(40, 2);
  for (OptimizerKind opt : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    for (int n : {2, 3, 4}) {
      CAPTURE(to_string(opt));
      CAPTURE(n);
      Trainer replicated(zero_config(n, opt, 0), train, eval);
      Trainer sharded(zero_config(n, opt, 1), train, eval);
      double clipped_norm = 0.0;
      sharded.on_step([&](const StepMetrics& m) { clipped_norm = m.grad_norm; });
      const Summary r = replicated.run();
      const Summary s = sharded.run();
      CHECK(s.replicas_identical);
      CHECK(s.replica_checks == r.replica_checks);
      CHECK(sharded.final_parameters() == replicated.final_parameters());
      CHECK(s.param_hash == r.param_hash);
      CHECK(s.final_train_loss == r.final_train_loss);
      CHECK(clipped_norm > 0.05);  // clipping acted
      // Every element's state is held by exactly one worker: 4 bytes per element per vector.
      const std::size_t vectors = opt == OptimizerKind::adamw ? 2 : 1;
      const std::size_t whole = vectors * sizeof(float) * r.parameters;
      std::size_t total = 0;
      for (const WorkerTimes& w : s.worker_times) {
        CHECK(w.optimizer_state_bytes > 0);
        total += w.optimizer_state_bytes;
      }
      CHECK(total == whole);
      CHECK(r.optimizer_state_bytes == whole);
      CHECK(s.optimizer_state_bytes < whole);
      CHECK(s.zero == 1);
    }
  }
}

TEST_CASE("a zero 1 checkpoint holds the whole state and resumes with 3 workers or zero 0") {
  auto train = synthetic(240, 1), eval = synthetic(40, 2);
  const fs::path sharded_dir = fresh_dir("sharded"), replicated_dir = fresh_dir("replicated");
  // 20 steps; the final train loss is the last step's.
  auto config = [&](int devices, int zero, const fs::path& dir) {
    Config cfg = zero_config(devices, OptimizerKind::adamw, zero);
    cfg.trainer.steps = 20;
    cfg.trainer.log_every = 1;
    cfg.trainer.checkpoint.dir = dir.string();
    return cfg;
  };
  // Stopped after 10 steps of 4 workers, with and without ZeRO: the checkpoints are the same.
  auto stopped = [&](int zero, const fs::path& dir) {
    Trainer first(config(4, zero, dir), train, eval);
    TrainerHooks hooks;
    hooks.after_update = [&first](int rank, std::int64_t step, Replica&) {
      if (rank == 0 && step == 9) first.request_stop();  // as SIGINT would: stops after step 10
    };
    first.set_hooks(hooks);
    CHECK(first.run().steps == 10);
  };
  stopped(1, sharded_dir);
  stopped(0, replicated_dir);
  const Checkpoint sharded = *CheckpointManager(sharded_dir, 0).load_latest();
  const Checkpoint replicated = *CheckpointManager(replicated_dir, 0).load_latest();
  CHECK(sharded.state.step == 10);
  CHECK(sharded.params == replicated.params);
  REQUIRE(sharded.optimizer_state.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(sharded.optimizer_state[i].name == replicated.optimizer_state[i].name);
    CHECK(sharded.optimizer_state[i].values.size() == sharded.params.size());
    CHECK(sharded.optimizer_state[i].values == replicated.optimizer_state[i].values);
  }

  // Resumed with the same 4 workers and zero 1: the uninterrupted zero 1 run, bit for bit.
  Trainer uninterrupted(config(4, 1, fresh_dir("uninterrupted")), train, eval);
  const Summary u = uninterrupted.run();
  Trainer again(config(4, 1, fresh_dir("again")), train, eval);
  again.resume_from(sharded);
  const Summary a = again.run();
  CHECK(again.final_parameters() == uninterrupted.final_parameters());
  CHECK(a.final_train_loss == u.final_train_loss);

  // Resumed as 3 workers with zero 1, and as 2 workers with zero 0: each ends where the zero 0
  // checkpoint, resumed the same way, ends (the same samples and the same arithmetic).
  for (auto [devices, zero] : {std::pair{3, 1}, std::pair{2, 0}}) {
    CAPTURE(devices);
    CAPTURE(zero);
    Trainer from_sharded(config(devices, zero, fresh_dir("from_sharded")), train, eval);
    from_sharded.resume_from(sharded);
    Trainer from_replicated(config(devices, 0, fresh_dir("from_replicated")), train, eval);
    from_replicated.resume_from(replicated);
    const Summary s = from_sharded.run();
    const Summary r = from_replicated.run();
    CHECK(s.steps == 20);
    CHECK(s.replicas_identical);
    CHECK(from_sharded.final_parameters() == from_replicated.final_parameters());
    CHECK(s.final_train_loss == doctest::Approx(r.final_train_loss).epsilon(1e-6));
  }
}

TEST_CASE("with zero 1 and 2 the non-finite policy names the tensor, and skip drops the update") {
  setenv("LOCKSTEP_FAULT", "1:7:nan", 1);  // each case runs in its own process under CTest
  auto train = synthetic(240, 1), eval = synthetic(40, 2);
  for (NonfinitePolicy policy : {NonfinitePolicy::stop, NonfinitePolicy::skip}) {
    for (int clip : {0, 1}) {  // without clipping stop updates per bucket, then gathers to name
      for (int zero : {1, 2}) {
        CAPTURE(to_string(policy));
        CAPTURE(clip);
        CAPTURE(zero);
        Config cfg = zero_config(2, OptimizerKind::adamw, zero);
        cfg.optimizer.clip_grad_norm = clip ? 0.05 : 0.0;
        cfg.trainer.on_nonfinite = policy;
        Trainer trainer(cfg, train, eval);
        if (policy == NonfinitePolicy::stop) {
          // Rank 1's NaN lands in the last layer, whose one grain rank 0 owns.
          CHECK_THROWS_WITH_AS(trainer.run(),
                               doctest::Contains("non-finite gradient at step 7: global norm nan, "
                                                 "first in layers.4.weight"),
                               WorkerError);
          continue;
        }
        const Summary s = trainer.run();
        CHECK(s.nonfinite_skips == 1);
        CHECK(s.replicas_identical);
        for (float p : trainer.final_parameters()) REQUIRE(std::isfinite(p));
      }
    }
  }
  unsetenv("LOCKSTEP_FAULT");
}

// ZeRO-2 (Note [ZeRO-2]): the same runs end bit-identical to zero 0 and zero 1, each worker
// holding less than the whole gradient buffer (its shards and the buckets' buffers), as the
// memory plan says; with accumulation the whole buffer, with the same bits.
TEST_CASE("zero 2 ends bit-identical to zero 0 and 1 (SGD with momentum, AdamW, clipping, "
          "accumulation, N = 2..4) and holds the gradient bytes the plan says") {
  auto train = synthetic(240, 1), eval = synthetic(40, 2);
  for (OptimizerKind opt : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    for (int n : {2, 3, 4}) {
      for (int accumulate : {1, 2}) {
        if (accumulate == 2 && n != 3) continue;
        CAPTURE(to_string(opt));
        CAPTURE(n);
        CAPTURE(accumulate);
        auto config = [&](int zero) {
          Config cfg = zero_config(n, opt, zero);
          cfg.trainer.accumulate_steps = accumulate;
          return cfg;
        };
        Trainer replicated(config(0), train, eval);
        Trainer sharded(config(2), train, eval);
        const Summary r = replicated.run();
        const Summary s = sharded.run();
        CHECK(s.replicas_identical);
        CHECK(sharded.final_parameters() == replicated.final_parameters());
        CHECK(s.final_train_loss == r.final_train_loss);
        CHECK(s.zero == 2);
        if (opt == OptimizerKind::adamw && n == 4) {
          Trainer zero1(config(1), train, eval);
          zero1.run();
          CHECK(sharded.final_parameters() == zero1.final_parameters());
        }
        // The plan's figure is what the worker holding most holds: with accumulation the whole
        // buffer; without, its shards and the 3 buckets' buffers (more than the whole here, as
        // one bucket is most of this model: the next case has many).
        const std::size_t whole = sizeof(float) * r.parameters;
        std::size_t most = 0;
        for (const WorkerTimes& w : s.worker_times) {
          if (accumulate == 2) CHECK(w.gradient_bytes == whole);
          most = std::max(most, w.gradient_bytes);
        }
        CHECK(s.grad_bytes == most);
        for (const WorkerTimes& w : r.worker_times) CHECK(w.gradient_bytes == whole);
      }
    }
  }
}

TEST_CASE("zero 2 at N = 4 holds a quarter of the gradients plus the buckets in flight") {
  // Five hidden layers of 512: buckets of 2,052, three of 262,656 (a 512 x 512 layer, 17
  // grains) and 269,312 parameters; a rank's shard of each is at most a grain over a quarter.
  auto train = synthetic(240, 1), eval = synthetic(40, 2);
  Config cfg = zero_config(4, OptimizerKind::sgd, 2);
  cfg.model.hidden = std::vector<int>(5, 512);
  cfg.trainer.bucket_cap_mb = 1.1;
  cfg.trainer.steps = 2;
  Trainer sharded(cfg, train, eval);
  const Summary s = sharded.run();
  const std::size_t whole = sizeof(float) * s.parameters, grain = sizeof(float) * detail::kZeroGrain;
  const std::size_t largest = sizeof(float) * (269312 + 16);  // a bucket's buffer, aligned
  for (const WorkerTimes& w : s.worker_times) {
    CHECK(w.gradient_bytes <= whole / 4 + 5 * grain + 2 * largest);
    CHECK(w.gradient_bytes < whole);
    CHECK(w.gradient_bytes <= s.grad_bytes);
  }
  CHECK(s.memory_plan.find("as ZeRO-2 shards and buckets") != std::string::npos);
}

TEST_CASE("zero 2 retires buckets without overlap and inline as with it: the same bits") {
  auto train = synthetic(240, 1), eval = synthetic(40, 2);
  Trainer reference(zero_config(3, OptimizerKind::adamw, 0), train, eval);
  reference.run();
  for (const char* mode : {"inline", "async"}) {
    for (bool overlap : {false, true}) {
      CAPTURE(mode);
      CAPTURE(overlap);
      setenv("LOCKSTEP_COMM_MODE", mode, 1);  // each case runs in its own process under CTest
      Config cfg = zero_config(3, OptimizerKind::adamw, 2);
      cfg.trainer.overlap = overlap;
      cfg.optimizer.clip_grad_norm = 0.0;  // updates per bucket, as each lands
      Config plain = zero_config(3, OptimizerKind::adamw, 0);
      plain.optimizer.clip_grad_norm = 0.0;
      Trainer sharded(cfg, train, eval), replicated(plain, train, eval);
      const Summary s = sharded.run();
      replicated.run();
      CHECK(s.comm_mode == mode);
      CHECK(sharded.final_parameters() == replicated.final_parameters());
      unsetenv("LOCKSTEP_COMM_MODE");
    }
  }
}

TEST_CASE("zero 1 and 2 on a decoder, GPT-2 (the LM head tied to the token embedding: a held "
          "bucket) and a Llama (untied, grouped-query), fp32 and bf16, end bit-identical to zero 0") {
  auto train = std::make_shared<TokenDataset>(test::token_stream(4000, 8, 1));
  for (const bool llama : {false, true})
    for (Precision precision : {Precision::fp32, Precision::bf16}) {
      CAPTURE(llama);
      CAPTURE(to_string(precision));
      auto config = [&](int zero) {
        Config cfg = llama ? test::small_llama_config(3, 4) : test::small_gpt_config(3, 4);
        cfg.model.n_layer = 4;
        cfg.trainer.precision = precision;
        cfg.trainer.bucket_cap_mb = 0.004;  // a bucket per layer or so: several rotate
        cfg.trainer.zero = zero;
        return cfg;
      };
      Trainer replicated(config(0), train, nullptr);
      const Summary r = replicated.run();
      for (const int zero : {1, 2}) {
        CAPTURE(zero);
        Trainer sharded(config(zero), train, nullptr);
        const Summary s = sharded.run();
        CHECK(s.replicas_identical);
        CHECK(sharded.final_parameters() == replicated.final_parameters());
        CHECK(s.final_train_loss == r.final_train_loss);
        // zero 2, buckets smaller than a grain: rank 0 holds every shard; the plan knows.
        if (zero == 2) CHECK(s.worker_times.front().gradient_bytes == s.grad_bytes);
      }
    }
}

TEST_CASE("a zero 2 checkpoint is zero 0's, and resumes with zero 0, 1 and 2 on other counts") {
  auto train = synthetic(240, 1), eval = synthetic(40, 2);
  auto config = [&](int devices, int zero, const fs::path& dir) {
    Config cfg = zero_config(devices, OptimizerKind::adamw, zero);
    cfg.trainer.steps = 20;
    cfg.trainer.checkpoint.dir = dir.string();
    cfg.trainer.checkpoint.every_steps = 10;
    cfg.trainer.checkpoint.keep_last = 5;
    return cfg;
  };
  const fs::path sharded_dir = fresh_dir("zero2"), replicated_dir = fresh_dir("zero2_ref");
  Trainer(config(4, 2, sharded_dir), train, eval).run();
  Trainer(config(4, 0, replicated_dir), train, eval).run();
  const auto at_10 = [](const fs::path& dir) {
    return CheckpointManager::load(dir / "step_00000010.safetensors");
  };
  const Checkpoint sharded = at_10(sharded_dir), replicated = at_10(replicated_dir);
  CHECK(sharded.params == replicated.params);
  REQUIRE(sharded.optimizer_state.size() == replicated.optimizer_state.size());
  for (std::size_t i = 0; i < sharded.optimizer_state.size(); ++i)
    CHECK(sharded.optimizer_state[i].values == replicated.optimizer_state[i].values);
  for (auto [devices, zero] : {std::pair{3, 2}, std::pair{2, 0}, std::pair{2, 1}}) {
    CAPTURE(devices);
    CAPTURE(zero);
    Trainer from_sharded(config(devices, zero, fresh_dir("from_zero2")), train, eval);
    from_sharded.resume_from(sharded);
    Trainer from_replicated(config(devices, 0, fresh_dir("from_zero0")), train, eval);
    from_replicated.resume_from(replicated);
    from_sharded.run();
    from_replicated.run();
    CHECK(from_sharded.final_parameters() == from_replicated.final_parameters());
  }
}
