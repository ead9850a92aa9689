// Which samples a run serves after its worker count changes mid-epoch (Note [Re-sharding] in
// src/train/worker_loop.cpp), pinned against the DistributedSampler's definition: a dataset
// that records every index it serves, a resume on another device count, and a shrink. 480
// samples in batches of 8 over 2, 3 or 4 workers: whole batches, no padding.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kSamples = 480;
constexpr int kBatch = 8;

// The training samples, recording each index served, per group of workers (the first group,
// then the survivors' after a shrink: TrainerHooks::restoring tells a worker's thread which)
// and per worker thread, in the order served. The data loader runs on the worker's thread
// (data.prefetch 0), so a thread's indices are its rank's shard in order.
class RecordingDataset final : public Dataset {
 public:
  explicit RecordingDataset(int first_group)
      : inner_(make_synthetic(kSamples, 12, 4, 1)), first_group_(first_group) {}
  std::size_t size() const noexcept override { return inner_.size(); }
  int features() const noexcept override { return inner_.features(); }
  int classes() const noexcept override { return inner_.classes(); }
  void get(std::size_t i, float* x, std::int32_t* y) const override {
    {
      std::lock_guard lock(mutex_);
      reads_[{group_.at(std::this_thread::get_id()), std::this_thread::get_id()}].push_back(i);
    }
    inner_.get(i, x, y);
  }
  // For TrainerHooks::restoring: the first `first_group` workers to set up are group 0.
  void restoring() {
    std::lock_guard lock(mutex_);
    group_[std::this_thread::get_id()] = set_ups_++ < first_group_ ? 0 : 1;
  }
  // Group `g`'s indices: the first `per_worker` each of its workers served (all: 0), together.
  std::vector<std::size_t> served(int g, std::size_t per_worker = 0) const {
    std::vector<std::size_t> out;
    for (const auto& [key, reads] : reads_)
      if (key.first == g)
        out.insert(out.end(), reads.begin(),
                   reads.begin() + static_cast<std::ptrdiff_t>(
                                       per_worker == 0 ? reads.size() : std::min(per_worker, reads.size())));
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  InMemoryDataset inner_;
  int first_group_;
  mutable std::mutex mutex_;
  int set_ups_ = 0;
  std::map<std::thread::id, int> group_;
  mutable std::map<std::pair<int, std::thread::id>, std::vector<std::size_t>> reads_;
};

// Makes `trainer`'s workers tell `data` which group their thread is in.
void record_groups(Trainer& trainer, const std::shared_ptr<RecordingDataset>& data) {
  TrainerHooks hooks;
  hooks.restoring = [data](int) { data->restoring(); };
  trainer.set_hooks(hooks);
}

Config resharding_config(int workers, std::int64_t steps) {
  Config cfg = test::small_mlp_config(workers, kBatch, OptimizerKind::sgd);
  cfg.data.shuffle = true;
  cfg.data.prefetch = 0;
  cfg.trainer.steps = steps;
  return cfg;
}

std::shared_ptr<const Dataset> eval_split() {
  return std::make_shared<InMemoryDataset>(make_synthetic(30, 12, 4, 2));
}

// Epoch 0's order (the DistributedSampler's permutation, seed 5: every rank's positions index
// it) and what `world` ranks serve of it from batch `first` to batch `last` of each, sorted:
// rank r's j-th sample is at position r + j x world.
std::vector<std::size_t> by_definition(int world, std::size_t first, std::size_t last) {
  const std::vector<std::size_t> order = DistributedSampler(kSamples, 1, 0, true, 5, false).indices();
  std::vector<std::size_t> out;
  for (int r = 0; r < world; ++r)
    for (std::size_t j = first * kBatch; j < last * kBatch; ++j)
      out.push_back(order.at(r + j * static_cast<std::size_t>(world)));
  std::sort(out.begin(), out.end());
  return out;
}

// Note [Re-sharding]'s guarantee for an epoch that `before` ranks served to batch `b` of each
// and `after` ranks then finished: every sample once, but for those at positions
// [b' x 8 x after, b x 8 x before), b' = b x before / after rounded down, which come twice.
void check_epoch(const std::vector<std::size_t>& first, const std::vector<std::size_t>& second,
                 int before, int after, std::size_t b) {
  const std::size_t resumed_at = b * static_cast<std::size_t>(before) / static_cast<std::size_t>(after);
  const std::vector<std::size_t> order = DistributedSampler(kSamples, 1, 0, true, 5, false).indices();
  std::vector<int> count(kSamples, 0);
  for (std::size_t i : first) ++count.at(i);
  for (std::size_t i : second) ++count.at(i);
  std::vector<std::size_t> twice, missing;
  for (std::size_t i = 0; i < kSamples; ++i) {
    if (count[i] == 0) missing.push_back(i);
    if (count[i] == 2) twice.push_back(i);
    CHECK(count[i] <= 2);
  }
  CHECK(missing.empty());
  std::vector<std::size_t> gap(order.begin() + static_cast<std::ptrdiff_t>(resumed_at * kBatch * after),
                               order.begin() + static_cast<std::ptrdiff_t>(b * kBatch * before));
  std::sort(gap.begin(), gap.end());
  CHECK(twice == gap);
}

}  // namespace

TEST_CASE("re-sharding: a resume on another worker count serves the epoch's rest by the rule") {
  struct Case {
    int before, after;
    std::size_t b;  // batches per worker before the change
  };
  // 3 -> 2 and 4 -> 3 where the position does not divide (samples served twice), 2 -> 4 and
  // 3 -> 2 where it does (none).
  for (const Case c : {Case{3, 2, 3}, Case{4, 3, 2}, Case{2, 4, 6}, Case{3, 2, 4}}) {
    CAPTURE(c.before);
    CAPTURE(c.after);
    CAPTURE(c.b);
    const fs::path dir = test::fresh_dir(fmt::format("lockstep_resharding_{}_{}", c.before, getpid()));
    auto first = std::make_shared<RecordingDataset>(c.before);
    Config cfg = resharding_config(c.before, static_cast<std::int64_t>(c.b));
    cfg.trainer.checkpoint.dir = dir.string();
    Trainer a(cfg, first, eval_split());
    record_groups(a, first);
    a.run();
    const Checkpoint at = *CheckpointManager(dir, 0).load_latest();
    fs::remove_all(dir);

    // The rest of epoch 0 on `after` workers: from batch b' of each to its last.
    const std::size_t resumed_at = c.b * c.before / c.after, per_epoch = kSamples / kBatch / c.after;
    auto second = std::make_shared<RecordingDataset>(c.after);
    Trainer b(resharding_config(c.after, static_cast<std::int64_t>(c.b + per_epoch - resumed_at)),
              second, eval_split());
    record_groups(b, second);
    b.resume_from(at);
    b.run();
    CHECK(first->served(0) == by_definition(c.before, 0, c.b));
    CHECK(second->served(0) == by_definition(c.after, resumed_at, per_epoch));
    check_epoch(first->served(0), second->served(0), c.before, c.after, c.b);
  }
}

// A shrink resumes from the state it holds by the same rule: 3 workers lose one in step 4's
// forward, the survivors hold the state after step 3 (3 batches of each of 3 workers) and serve
// epoch 0's rest on 2 from batch 4 of each, to its end.
TEST_CASE("re-sharding: a shrink serves the epoch's rest by the rule") {
  test::ScopedEnv fault("LOCKSTEP_FAULT", "1:4:lost:forward");
  auto data = std::make_shared<RecordingDataset>(3);
  Config cfg = resharding_config(3, 3 + 30 - 4);
  cfg.trainer.on_worker_failure = WorkerFailurePolicy::shrink;
  Trainer trainer(cfg, data, eval_split());
  record_groups(trainer, data);
  const Summary s = trainer.run();
  REQUIRE(s.recoveries == 1);
  CHECK(s.steps_redone == 0);
  // What the first group trained: the first 3 batches each of its workers served (each had
  // staged the next already).
  const std::vector<std::size_t> trained = data->served(0, 3 * kBatch);
  CHECK(trained == by_definition(3, 0, 3));
  CHECK(data->served(1) == by_definition(2, 4, 30));
  check_epoch(trained, data->served(1), 3, 2, 3);
}
