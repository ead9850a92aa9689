// Multi-rank training that would mean something on 2 or more GPUs (issue 31), on the GPUs this
// machine has: a GPT with several gradient buckets all-reduced while backward runs, ZeRO-1, and
// a checkpoint resumed; and a rank lost mid-backward while its peers' bucket all-reduces are in
// flight. On the peer communicator (4 replicas of GPU 0, which any one GPU runs) and, with 2
// GPUs, on NCCL (devices 0 and 1). Public API only: builds without CUDA, and each case skips
// without a usable GPU.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../cli/cli_runner.hpp"
#include "../train/trainer_fixtures.hpp"
#include "gpu_vs_cpu.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

// small_gpt_config's GPT widened to d_model 128 (about 400,000 parameters) in buckets of 0.25 MB
// (65,536 floats, 4 grains of ZeRO's 16,384): several buckets, so backward overlaps their
// all-reduces, and under ZeRO-1 every one of 4 ranks owns a shard of most of them. 12 steps of 4
// samples per worker.
Config multi_rank_gpt(const std::vector<int>& devices, int zero, const fs::path& checkpoints) {
  Config cfg = test::small_gpt_config(static_cast<int>(devices.size()), /*batch=*/4);
  cfg.model.d_model = 128;
  cfg.model.n_head = 4;
  cfg.trainer.backend = BackendKind::cuda;
  cfg.trainer.devices = devices;
  cfg.trainer.bucket_cap_mb = 0.25;
  cfg.trainer.zero = zero;
  cfg.trainer.steps = 12;
  cfg.trainer.log_every = 1;
  cfg.trainer.checkpoint.dir = checkpoints.string();
  return cfg;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep_multi_rank_" + name);
  fs::remove_all(dir);
  return dir;
}

// The device lists to run: 4 peer replicas of GPU 0 always, NCCL on GPUs 0 and 1 when there.
std::vector<std::vector<int>> device_lists(const Backend& cuda) {
  std::vector<std::vector<int>> lists = {{0, 0, 0, 0}};
  if (cuda.devices().size() >= 2) lists.push_back({0, 1});
  else MESSAGE("one GPU: NCCL across GPUs (devices 0 and 1) not run");
  return lists;
}

}  // namespace

TEST_SUITE("cuda multi-rank") {
  TEST_CASE("cuda multi-rank: a GPT in several overlapped buckets, zero 0 and 1, stopped and resumed exactly, bf16 reduction on NCCL") {
    auto cuda = test::cuda_or_skip();
    if (!cuda) return;
    auto train = std::make_shared<TokenDataset>(test::token_stream(4000, 8, 1));
    auto eval = std::make_shared<TokenDataset>(test::token_stream(400, 8, 2));
    for (const std::vector<int>& devices : device_lists(*cuda)) {
      const bool peer = devices[0] == devices[1];
      CAPTURE(peer);
      std::vector<float> replicated;
      double replicated_loss = 0.0;
      for (int zero : {0, 1}) {
        CAPTURE(zero);
        Trainer whole(multi_rank_gpt(devices, zero, fresh_dir("whole")), train, eval);
        const Summary w = whole.run();
        CHECK(w.backend == "cuda");
        CHECK(w.replicas_identical);
        CHECK(w.buckets > 2);
        CHECK(w.zero == zero);
        // The peer group sums every element over the ranks in rank order, in the all-reduce as
        // in ZeRO's reduce-scatter: the same bits. NCCL may choose another order per algorithm.
        if (zero == 0) {
          replicated = whole.final_parameters();
          replicated_loss = w.final_train_loss;
        }
        else if (peer) CHECK(whole.final_parameters() == replicated);
        else CHECK(test::relative_difference(whole.final_parameters(), replicated) <= 1e-5);

        // Stopped after step 6 (as SIGINT stops a run: a checkpoint), then resumed: the
        // uninterrupted run's bits.
        const fs::path dir = fresh_dir("stopped");
        Trainer first(multi_rank_gpt(devices, zero, dir), train, eval);
        TrainerHooks hooks;
        hooks.after_update = [&first](int rank, std::int64_t step, Replica&) {
          if (rank == 0 && step == 5) first.request_stop();
        };
        first.set_hooks(hooks);
        CHECK(first.run().steps == 6);
        Trainer resumed(multi_rank_gpt(devices, zero, fresh_dir("resumed")), train, eval);
        resumed.resume_from(*CheckpointManager(dir, 0).load_latest());
        const Summary r = resumed.run();
        CHECK(r.steps == 12);
        CHECK(r.replicas_identical);
        CHECK(resumed.final_parameters() == whole.final_parameters());
        CHECK(r.param_hash == w.param_hash);
      }
      // bf16 gradient reduction needs NCCL (the peer group refuses it): the replicas stay
      // identical, and the last step's loss is the fp32 run's to a few percent (bf16 keeps 8
      // bits of each gradient).
      if (peer) continue;
      Config bf16 = multi_rank_gpt(devices, 0, fresh_dir("bf16"));
      bf16.trainer.grad_reduce_dtype = ReduceDtype::bf16;
      Trainer wire(bf16, train, eval);
      const Summary b = wire.run();
      CHECK(b.replicas_identical);
      CHECK(b.final_train_loss == doctest::Approx(replicated_loss).epsilon(0.05));
    }
  }

  TEST_CASE("cuda multi-rank: a rank lost mid-backward, its peers' all-reduces in flight, stops every rank within 10 s") {
    auto cuda = test::cuda_or_skip();
    if (!cuda) return;
    const std::string gpt_tiny = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
    for (const std::vector<int>& devices : device_lists(*cuda)) {
      const std::string ids = fmt::format("[{}]", fmt::join(devices, ","));
      CAPTURE(ids);
      // Buckets of 0.05 MB: backward starts an all-reduce every few layers, so worker 1 fails
      // with earlier buckets' collectives queued on every rank (trainer.on_worker_failure stop).
      const auto start = std::chrono::steady_clock::now();
      const test::CliResult r = test::run_cli(
          "train " + gpt_tiny + " --set trainer.backend=cuda --set 'trainer.devices=" + ids +
              "' --set trainer.steps=100 --set trainer.bucket_cap_mb=0.05 "
              "--set trainer.checkpoint.dir=null",
          "LOCKSTEP_FAULT=1:5:lost:backward timeout -s KILL 60");
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      CHECK_MESSAGE(r.code == 1, r.output);
      CHECK(seconds < 10.0);
      CHECK_MESSAGE(r.output.find("worker 1 (cuda:") != std::string::npos, r.output);
      CHECK(r.output.find("injected fault: the device was lost in backward") != std::string::npos);
    }
  }

  // Note [Shrink] on NCCL: GPUs 0 and 1 lose GPU 1 at step 5; GPU 0 goes on in a new NCCL group
  // of one, bit-identical to a resume on it from a checkpoint of step 4.
  TEST_CASE("cuda multi-rank: NCCL on 2 GPUs loses one and goes on (shrink), as a resume on 1") {
    auto cuda = test::cuda_or_skip();
    if (!cuda) return;
    if (cuda->devices().size() < 2)
      return test::skip(test::Skip::gpu, "one GPU: an NCCL group across GPUs needs two");
    auto train = std::make_shared<TokenDataset>(test::token_stream(4000, 8, 1));
    const fs::path dir = fresh_dir("nccl_shrink_reference");
    Config reference = multi_rank_gpt({0, 1}, 0, dir);
    reference.trainer.comm = CommKind::nccl;
    reference.trainer.checkpoint.every_steps = 4;
    reference.trainer.checkpoint.keep_last = 10;
    Trainer(reference, train, nullptr).run();
    Config survivor = multi_rank_gpt({0}, 0, fresh_dir("nccl_shrink_survivor"));
    survivor.trainer.comm = CommKind::nccl;
    Trainer resumed(survivor, train, nullptr);
    resumed.resume_from(CheckpointManager::load(dir / "step_00000004.safetensors"));
    resumed.run();

    Config cfg = multi_rank_gpt({0, 1}, 0, fresh_dir("nccl_shrink"));
    cfg.trainer.comm = CommKind::nccl;
    cfg.trainer.on_worker_failure = WorkerFailurePolicy::shrink;
    test::ScopedEnv fault("LOCKSTEP_FAULT", "1:5:lost:backward");
    Trainer shrunk(cfg, train, nullptr);
    const Summary s = shrunk.run();
    CHECK(shrunk.final_parameters() == resumed.final_parameters());
    CHECK(s.workers_lost == 1);
    CHECK(s.steps_redone == 0);
    CHECK(s.devices == std::vector<int>{0});
  }

  // Note [Shrink] on the GPU: the peer group is made anew over the survivors. The run that loses
  // replica 2 at step 5 ends bit-identical to one that resumes on the 3 others from a checkpoint
  // of step 4; through the CLI, 4 peer replicas of gpt_tiny lose replica 2 at step 20 and finish
  // with exit 0, one worker lost, recovered within 10 s.
  TEST_CASE("cuda multi-rank: 4 peer replicas lose one and go on (shrink), as a resume on 3") {
    auto cuda = test::cuda_or_skip();
    if (!cuda) return;
    auto train = std::make_shared<TokenDataset>(test::token_stream(4000, 8, 1));
    const fs::path dir = fresh_dir("shrink_reference");
    Config reference = multi_rank_gpt({0, 0, 0, 0}, 0, dir);
    reference.trainer.checkpoint.every_steps = 4;
    reference.trainer.checkpoint.keep_last = 10;
    Trainer(reference, train, nullptr).run();
    Config survivors = multi_rank_gpt({0, 0, 0}, 0, fresh_dir("shrink_survivors"));
    Trainer resumed(survivors, train, nullptr);
    resumed.resume_from(CheckpointManager::load(dir / "step_00000004.safetensors"));
    resumed.run();

    Config cfg = multi_rank_gpt({0, 0, 0, 0}, 0, fresh_dir("shrink"));
    cfg.trainer.on_worker_failure = WorkerFailurePolicy::shrink;
    Summary s;
    {
      test::ScopedEnv fault("LOCKSTEP_FAULT", "2:5:lost:backward");
      Trainer shrunk(cfg, train, nullptr);
      s = shrunk.run();
      CHECK(shrunk.final_parameters() == resumed.final_parameters());
    }
    CHECK(s.workers_lost == 1);
    CHECK(s.steps_redone == 0);
    CHECK(s.devices == std::vector<int>{0, 0, 0});

    const std::string gpt_tiny = std::string(LOCKSTEP_SOURCE_DIR) + "/configs/gpt_tiny.yaml";
    const fs::path json = fs::temp_directory_path() / "lockstep_multi_rank_shrink.json";
    const test::CliResult r = test::run_cli(
        "train " + gpt_tiny + " --set trainer.backend=cuda --set 'trainer.devices=[0,0,0,0]' "
            "--set trainer.comm=peer --set trainer.steps=40 --set trainer.eval_every=0 "
            "--set trainer.checkpoint.dir=null --set trainer.on_worker_failure=shrink "
            "--summary-json " + json.string(),
        "LOCKSTEP_FAULT=2:20:lost timeout -s KILL 120");
    CHECK_MESSAGE(r.code == 0, r.output);
    std::ifstream in(json);
    const std::string summary((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK_MESSAGE(summary.find("\"workers_lost\": 1,") != std::string::npos, summary);
    const std::regex seconds("\"recovery_s\": ([0-9.e+-]+)");
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_search(summary, m, seconds), summary);
    CHECK(std::stod(m[1].str()) < 10.0);
  }

  // Note [Snapshots] on the GPU: with ZeRO-1 the lost replica's optimiser shard is gone, so the
  // state is the newest complete snapshot, copied asynchronously (pinned memory, its own stream)
  // by every replica. Replica 1 is lost at step 8's backward; the snapshot of step 6 has landed
  // unless its copies were still running at step 7's end, when it is step 3's. Either way the
  // run ends bit-identical to a resume on the 3 others from a checkpoint of that step.
  TEST_CASE("cuda multi-rank: under ZeRO-1 a lost peer replica recovers from the asynchronous snapshot") {
    auto cuda = test::cuda_or_skip();
    if (!cuda) return;
    auto train = std::make_shared<TokenDataset>(test::token_stream(4000, 8, 1));
    const fs::path dir = fresh_dir("snapshot_reference");
    Config reference = multi_rank_gpt({0, 0, 0, 0}, 1, dir);
    reference.trainer.checkpoint.every_steps = 1;
    reference.trainer.checkpoint.keep_last = 100;
    Trainer(reference, train, nullptr).run();

    Config cfg = multi_rank_gpt({0, 0, 0, 0}, 1, fresh_dir("snapshot"));
    cfg.trainer.checkpoint.dir.clear();
    cfg.trainer.on_worker_failure = WorkerFailurePolicy::shrink;
    cfg.trainer.snapshot_every = 3;
    Summary s;
    std::vector<float> shrunk_params;
    {
      test::ScopedEnv fault("LOCKSTEP_FAULT", "1:8:lost:backward");
      Trainer shrunk(cfg, train, nullptr);
      s = shrunk.run();
      shrunk_params = shrunk.final_parameters();
    }
    CHECK(s.workers_lost == 1);
    REQUIRE((s.steps_redone == 1 || s.steps_redone == 4));
    Config survivors = multi_rank_gpt({0, 0, 0}, 1, fresh_dir("snapshot_survivors"));
    survivors.trainer.checkpoint.dir.clear();
    Trainer resumed(survivors, train, nullptr);
    resumed.resume_from(CheckpointManager::load(
        dir / fmt::format("step_{:08}.safetensors", 7 - s.steps_redone)));
    resumed.run();
    CHECK(shrunk_params == resumed.final_parameters());
  }
}
