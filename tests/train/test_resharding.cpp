// Which samples a run serves after its worker count changes mid-epoch (Note [Re-sharding] in
// src/train/worker_loop.cpp), pinned against the DistributedSampler's definition: a dataset
// that records every index it serves, a resume on another device count, and a shrink. 480
// samples in batches of 8 over 2, 3 or 4 workers; a re-sharded rest may end in a short batch
// and pad its last positions, as a whole epoch would.
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

// Epoch 0's order: the DistributedSampler's permutation, seed 5, that every rank's positions
// index.
std::vector<std::size_t> epoch_order() {
  return DistributedSampler(kSamples, 1, 0, true, 5, false).indices();
}

// Per rank, the samples of epoch 0 a sharding over `world` ranks begun at position `start`
// serves (Note [Re-sharding]): rank r's j-th is at position start + r + j x world, j < the
// ceil((480 - start) / world) of each rank, wrapping past the end (PyTorch's padding).
std::size_t per_rank(int world, std::size_t start) {
  return (kSamples - start + static_cast<std::size_t>(world) - 1) / static_cast<std::size_t>(world);
}

// What `world` ranks of a sharding begun at `start` serve from batch `first` to batch `last` of
// each (the last one possibly short), sorted, by that definition.
std::vector<std::size_t> by_definition(int world, std::size_t start, std::size_t first,
                                       std::size_t last) {
  const std::vector<std::size_t> order = epoch_order();
  const std::size_t n = per_rank(world, start);
  std::vector<std::size_t> out;
  for (int r = 0; r < world; ++r)
    for (std::size_t j = first * kBatch; j < std::min(last * kBatch, n); ++j)
      out.push_back(order.at((start + static_cast<std::size_t>(r) + j * static_cast<std::size_t>(world)) % kSamples));
  std::sort(out.begin(), out.end());
  return out;
}

// Batches of each rank in the rest of the epoch from `start` on `world` ranks.
std::size_t batches_left(int world, std::size_t start) {
  return (per_rank(world, start) + kBatch - 1) / kBatch;
}

// The epoch that `before` ranks served to batch `b` of each and `after` ranks then finished:
// every sample exactly once, but the padding of the second sharding (its positions past the
// epoch's last, fewer than `after`), which wraps to the order's first samples.
void check_epoch(const std::vector<std::size_t>& first, const std::vector<std::size_t>& second,
                 int before, int after, std::size_t b) {
  const std::size_t start = b * kBatch * static_cast<std::size_t>(before);
  const std::size_t padded = start + per_rank(after, start) * static_cast<std::size_t>(after);
  const std::vector<std::size_t> order = epoch_order();
  std::vector<int> expected(kSamples, 1);
  for (std::size_t p = kSamples; p < padded; ++p) ++expected.at(order.at(p % kSamples));
  std::vector<int> count(kSamples, 0);
  for (std::size_t i : first) ++count.at(i);
  for (std::size_t i : second) ++count.at(i);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < kSamples; ++i) {
    if (count[i] == expected[i]) continue;
    if (++wrong <= 5) MESSAGE("sample " << i << " served " << count[i] << " times, expected " << expected[i]);
  }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("re-sharding: a resume on another worker count serves the epoch's rest once") {
  struct Case {
    int before, after;
    std::size_t b;  // batches per worker before the change
  };
  // 3 -> 2 and 4 -> 3 where the position does not divide the new worker count's batches, 2 -> 4
  // and 3 -> 2 where it does; 4 -> 3 pads its last batches (416 samples over 3 ranks).
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
    CHECK(at.state.epoch_start == 0);
    CHECK(at.state.batch_in_epoch == c.b);

    // The rest of epoch 0 on `after` workers: a new sharding from the first position not served.
    const std::size_t start = c.b * kBatch * static_cast<std::size_t>(c.before);
    const std::size_t rest = batches_left(c.after, start);
    auto second = std::make_shared<RecordingDataset>(c.after);
    Trainer b(resharding_config(c.after, static_cast<std::int64_t>(c.b + rest)), second,
              eval_split());
    record_groups(b, second);
    b.resume_from(at);
    b.run();
    CHECK(first->served(0) == by_definition(c.before, 0, 0, c.b));
    CHECK(second->served(0) == by_definition(c.after, start, 0, rest));
    check_epoch(first->served(0), second->served(0), c.before, c.after, c.b);
  }
}

// A checkpoint written inside a re-sharded epoch records where that sharding began, and a resume
// on the same worker count goes on from it: 3 workers for 2 batches, 2 workers for 5, then 2
// again to the epoch's end, every sample once.
TEST_CASE("re-sharding: a checkpoint inside a re-sharded epoch resumes where it stopped") {
  const fs::path dir = test::fresh_dir(fmt::format("lockstep_resharding_twice_{}", getpid()));
  auto first = std::make_shared<RecordingDataset>(3);
  Config cfg = resharding_config(3, 2);
  cfg.trainer.checkpoint.dir = dir.string();
  Trainer a(cfg, first, eval_split());
  record_groups(a, first);
  a.run();
  const Checkpoint at3 = *CheckpointManager(dir, 0).load_latest();

  auto second = std::make_shared<RecordingDataset>(2);
  Config cfg2 = resharding_config(2, 2 + 5);
  cfg2.trainer.checkpoint.dir = dir.string();
  cfg2.trainer.checkpoint.overwrite = true;
  Trainer b(cfg2, second, eval_split());
  record_groups(b, second);
  b.resume_from(at3);
  b.run();
  const Checkpoint at2 = *CheckpointManager(dir, 0).load_latest();
  fs::remove_all(dir);
  CHECK(at2.state.epoch_start == 2 * kBatch * 3);
  CHECK(at2.state.batch_in_epoch == 5);
  CHECK(at2.state.workers == 2);

  const std::size_t start = 2 * kBatch * 3, rest = batches_left(2, start);
  auto third = std::make_shared<RecordingDataset>(2);
  Trainer c(resharding_config(2, static_cast<std::int64_t>(2 + rest)), third, eval_split());
  record_groups(c, third);
  c.resume_from(at2);
  c.run();
  std::vector<std::size_t> after = second->served(0);
  const std::vector<std::size_t> last = third->served(0);
  after.insert(after.end(), last.begin(), last.end());
  std::sort(after.begin(), after.end());
  CHECK(second->served(0) == by_definition(2, start, 0, 5));
  CHECK(last == by_definition(2, start, 5, rest));
  check_epoch(first->served(0), after, 3, 2, 2);
}

// A shrink resumes from the state it holds by the same rule: 3 workers lose one in step 4's
// forward, the survivors hold the state after step 3 (3 batches of each of 3 workers, positions
// [0, 72)) and serve epoch 0's rest on 2 from position 72, to its end.
TEST_CASE("re-sharding: a shrink serves the epoch's rest once") {
  test::ScopedEnv fault("LOCKSTEP_FAULT", "1:4:lost:forward");
  auto data = std::make_shared<RecordingDataset>(3);
  const std::size_t start = 3 * kBatch * 3, rest = batches_left(2, start);
  Config cfg = resharding_config(3, static_cast<std::int64_t>(3 + rest));
  cfg.trainer.on_worker_failure = WorkerFailurePolicy::shrink;
  Trainer trainer(cfg, data, eval_split());
  record_groups(trainer, data);
  const Summary s = trainer.run();
  REQUIRE(s.recoveries == 1);
  CHECK(s.steps_redone == 0);
  // What the first group trained: the first 3 batches each of its workers served (each had
  // staged the next already).
  const std::vector<std::size_t> trained = data->served(0, 3 * kBatch);
  CHECK(trained == by_definition(3, 0, 0, 3));
  CHECK(data->served(1) == by_definition(2, start, 0, rest));
  check_epoch(trained, data->served(1), 3, 2, 3);
}
