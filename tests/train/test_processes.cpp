// The trainer across processes (Note [Processes] in trainer.cpp), with fake processes in this
// test process (tests/comm/loopback_processes.hpp): each runs its own Trainer on its own thread.
// The real thing, under mpirun, is tested end to end in tests/mpi/.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <thread>

#include "comm/loopback_processes.hpp"
#include "trainer_fixtures.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;

namespace {

Config job_config(int devices, std::vector<int> hidden = {16, 8}) {
  Config cfg = test::cpu_config(devices, /*batch=*/6, /*steps=*/15, /*seed=*/11);
  cfg.source = "job.yaml";
  cfg.model.hidden = std::move(hidden);
  cfg.trainer.check_replicas_every = 5;
  return cfg;
}

struct ProcessRun {
  Summary summary;
  std::vector<float> params;
  std::exception_ptr error;
};

// Runs process p's trainer, made by make(p, processes[p]), on a thread of its own per process.
std::vector<ProcessRun> run_job(
    int processes,
    const std::function<std::unique_ptr<Trainer>(int, std::shared_ptr<ProcessGroup>)>& make) {
  auto group = test::make_loopback_processes(processes);
  std::vector<ProcessRun> runs(processes);
  std::vector<std::thread> threads;
  for (int p = 0; p < processes; ++p)
    threads.emplace_back([&, p] {
      try {
        std::unique_ptr<Trainer> trainer = make(p, group[p]);
        runs[p].summary = trainer->run();
        runs[p].params = trainer->final_parameters();
      } catch (const InputError&) {
        // A refusal at start-up: every process refuses on its own. (An abort here could reach a
        // peer still leaving the loopback's last barrier, which a completed MPI call cannot.)
        runs[p].error = std::current_exception();
      } catch (...) {
        runs[p].error = std::current_exception();
        group[p]->abort_job(1);  // what the CLI does: the launcher ends the others
      }
    });
  for (auto& t : threads) t.join();
  return runs;
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

}  // namespace

TEST_CASE("2 processes x 2 workers train like 1 process x 4 workers, replicas identical") {
  auto data = std::make_shared<InMemoryDataset>(make_synthetic(300, 10, 3, 4));
  const DataSplit split = split_dataset(*data, 0.2, true, 4);
  Trainer single(job_config(4), split.train, split.eval);
  const Summary one = single.run();

  const auto runs = run_job(2, [&](int, std::shared_ptr<ProcessGroup> processes) {
    return std::make_unique<Trainer>(job_config(2), split.train, split.eval, processes);
  });
  for (const ProcessRun& r : runs) {
    REQUIRE_MESSAGE(!r.error, message_of(r.error));
    CHECK(r.summary.processes == 2);
    CHECK(r.summary.worker_times.size() == 4);
    CHECK(r.summary.samples == one.samples);
    CHECK(r.summary.replicas_identical);
    CHECK(std::abs(r.summary.eval_loss - one.eval_loss) <= 1e-4 * std::abs(one.eval_loss));
  }
  CHECK(runs[0].params == runs[1].params);  // bit-identical across processes
  CHECK(runs[0].summary.param_hash == runs[1].summary.param_hash);
}

TEST_CASE("ZeRO-1 across 2 processes x 2 workers ends bit-identical to zero 0 across them") {
  auto data = std::make_shared<InMemoryDataset>(make_synthetic(300, 10, 3, 4));
  const DataSplit split = split_dataset(*data, 0.2, true, 4);
  // 10-256-256-3: the middle layer's bucket is 5 grains of 16,384, shared by all 4 workers;
  // AdamW with clipping (the norm from every process's grains).
  auto config = [](int zero) {
    Config cfg = job_config(2, {256, 256});
    cfg.optimizer.clip_grad_norm = 0.05;
    cfg.trainer.bucket_cap_mb = 0.05;
    cfg.trainer.zero = zero;
    return cfg;
  };
  std::vector<std::vector<float>> params;
  for (int zero : {0, 1}) {
    const auto runs = run_job(2, [&](int, std::shared_ptr<ProcessGroup> processes) {
      return std::make_unique<Trainer>(config(zero), split.train, split.eval, processes);
    });
    for (const ProcessRun& r : runs) {
      REQUIRE_MESSAGE(!r.error, message_of(r.error));
      CHECK(r.summary.replicas_identical);
    }
    CHECK(runs[0].params == runs[1].params);
    params.push_back(runs[0].params);
  }
  CHECK(params[1] == params[0]);
}

TEST_CASE("processes that disagree on the model are refused at start-up, naming what differs") {
  auto data = std::make_shared<InMemoryDataset>(make_synthetic(120, 10, 3, 4));
  const auto runs = run_job(2, [&](int p, std::shared_ptr<ProcessGroup> processes) {
    return std::make_unique<Trainer>(job_config(2, p == 0 ? std::vector<int>{16, 8}
                                                          : std::vector<int>{16, 4}),
                                     data, nullptr, processes);
  });
  for (const ProcessRun& r : runs) {
    REQUIRE(r.error);
    CHECK_THROWS_AS(std::rethrow_exception(r.error), InputError);
    CHECK(message_of(r.error).find("job.yaml: process 1 of 2 differs from process 0 in the config "
                                   "hash") != std::string::npos);
  }
}

TEST_CASE("a worker failing in one process stops every process, naming its global rank") {
  auto data = std::make_shared<InMemoryDataset>(make_synthetic(120, 10, 3, 4));
  const auto runs = run_job(2, [&](int, std::shared_ptr<ProcessGroup> processes) {
    auto trainer = std::make_unique<Trainer>(job_config(2), data, nullptr, processes);
    TrainerHooks hooks;
    hooks.before_forward = [](int rank, std::int64_t step) {
      if (rank == 3 && step == 4) throw std::runtime_error("injected");
    };
    trainer->set_hooks(hooks);
    return trainer;
  });
  REQUIRE(runs[0].error);
  REQUIRE(runs[1].error);
  CHECK(message_of(runs[1].error) == "worker 3 (cpu:1): injected");
}

// Note [Shrink]: the survivors' communicators would span every process; one process cannot
// rebuild them, so a lost device stops the job as any failure does, saying why.
TEST_CASE("on_worker_failure shrink across processes stops at a lost device and says why") {
  auto data = std::make_shared<InMemoryDataset>(make_synthetic(120, 10, 3, 4));
  const auto runs = run_job(2, [&](int, std::shared_ptr<ProcessGroup> processes) {
    Config cfg = job_config(2);
    cfg.trainer.on_worker_failure = WorkerFailurePolicy::shrink;
    auto trainer = std::make_unique<Trainer>(cfg, data, nullptr, processes);
    TrainerHooks hooks;
    hooks.before_forward = [](int rank, std::int64_t step) {
      if (rank == 3 && step == 4) throw DeviceLost("injected");
    };
    trainer->set_hooks(hooks);
    return trainer;
  });
  REQUIRE(runs[0].error);
  REQUIRE(runs[1].error);
  CHECK(message_of(runs[1].error) ==
        "worker 3 (cpu:1): injected; trainer.on_worker_failure: shrink cannot go on: the run "
        "spans 2 processes, whose communicators cannot be rebuilt from one of them");
}
