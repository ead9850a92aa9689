// Overlap, timings and aborts on the GPU (Note [Stream work] in src/cuda/stream_work.hpp, Note
// [Abortable waits] in lockstep/device.hpp):
//   - async collectives of the peer communicator give the synchronous one's sums, with compute
//     queued between the enqueue and the wait, and report their timing once the GPU is done;
//   - the trainer on GPUs reports communication time and its hidden share, and traces it;
//   - a worker in a device wait that only the abort can end, a throw and a stall in one of 4
//     replicas on one GPU each end the run within 10 s, without a worker left behind.
// Public API only, so this file builds without CUDA; without a GPU every case skips.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../train/trainer_fixtures.hpp"
#include "gpu_vs_cpu.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;
using namespace lockstep::test;

namespace {

struct ScopedFault {
  explicit ScopedFault(const std::string& spec) { setenv("LOCKSTEP_FAULT", spec.c_str(), 1); }
  ~ScopedFault() { unsetenv("LOCKSTEP_FAULT"); }
};

Config peer_config(int replicas) {
  Config cfg = test::small_mlp_config(replicas, 8, OptimizerKind::adamw);
  cfg.data.dataset = DatasetKind::synthetic;
  cfg.trainer.backend = BackendKind::cuda;
  cfg.trainer.devices = std::vector<int>(static_cast<std::size_t>(replicas), 0);
  cfg.model.hidden = {256, 256, 256};
  cfg.trainer.bucket_cap_mb = 0.1;  // one bucket per layer
  return cfg;
}

std::shared_ptr<const Dataset> synthetic(std::size_t n, std::uint64_t seed) {
  return std::make_shared<InMemoryDataset>(make_synthetic(n, 12, 4, seed));
}

}  // namespace

TEST_SUITE("cuda overlap") {
  TEST_CASE("peer: async all-reduces of 4 buckets with compute between enqueue and wait") {
    auto backend = cuda_or_skip();
    if (!backend) return;
    for (int n : {2, 4}) {
      CAPTURE(n);
      const std::size_t bucket = 100003, buckets = 4, count = bucket * buckets;
      on_ranks(*backend, std::vector<int>(n, 0), [&](int r, Device& d, Communicator& c) {
        std::vector<float> mine(count);
        for (std::size_t i = 0; i < count; ++i) mine[i] = float((r + 1) * int(i % 13 + 1));
        auto grads = on_device(d, mine);
        DeviceArray<float> other(d, count);
        for (int round = 0; round < 3; ++round) {
          grads.upload(mine);
          std::vector<std::unique_ptr<CommWork>> works;
          for (std::size_t b = 0; b < buckets; ++b) {
            works.push_back(c.all_reduce_async(grads.data() + b * bucket, bucket, ReduceOp::sum));
            d.fill(other.data(), float(b), count);  // backward goes on meanwhile
          }
          for (auto& w : works) w->wait();
          const auto s = grads.download();
          for (std::size_t i = 0; i < count; ++i)
            REQUIRE(s[i] == float(n * (n + 1) / 2 * int(i % 13 + 1)));
          d.synchronize();
          for (auto& w : works) {
            const std::optional<CommTiming> t = w->timing();
            REQUIRE(t.has_value());
            CHECK(t->finished_s > t->started_s);
            CHECK(t->exposed_s >= 0.0);
            CHECK(t->exposed_s <= t->finished_s - t->started_s + 1e-3);
          }
        }
      });
    }
  }

  TEST_CASE("the trainer on one GPU reports and traces the time of its bucket all-reduces") {
    if (!cuda_or_skip()) return;
    const std::filesystem::path trace =
        std::filesystem::temp_directory_path() / "lockstep_cuda_overlap_trace.json";
    Config cfg = peer_config(2);
    cfg.trainer.trace = trace.string();
    Trainer trainer(cfg, synthetic(240, 1), synthetic(40, 2));
    const Summary s = trainer.run();
    MESSAGE("all-reduce " << s.comm_s << " s per worker, " << 100 * s.comm_hidden_fraction
                          << "% hidden");
    CHECK(s.replicas_identical);
    CHECK(s.buckets >= 3);
    CHECK(s.comm_s > 0.0);
    CHECK(s.comm_hidden_fraction >= 0.0);
    CHECK(s.comm_hidden_fraction <= 1.0);
    std::stringstream text;
    text << std::ifstream(trace).rdbuf();
    CHECK(text.str().find("all-reduce bucket 0") != std::string::npos);
  }

  TEST_CASE("4 replicas on one GPU: a device wait, a throw and a stall each end within 10 s") {
    if (!cuda_or_skip()) return;
    for (const char* spec : {"2:3:hang", "1:3:forward", "3:4:stall"}) {
      CAPTURE(spec);
      ScopedFault fault(spec);
      Config cfg = peer_config(4);
      cfg.trainer.steps = 1000;
      cfg.trainer.step_timeout_s = 1.0;
      cfg.trainer.stop_grace_s = 30.0;  // a worker left behind would take longer than 10 s
      Trainer trainer(cfg, synthetic(240, 1), synthetic(40, 2));
      const auto t0 = std::chrono::steady_clock::now();
      try {
        trainer.run();
        FAIL("run() should have thrown");
      } catch (const WorkerError& e) {
        MESSAGE(e.what());
        CHECK(std::string(e.what()).find("left running") == std::string::npos);
      }
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    }
  }
}
