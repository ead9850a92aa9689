// The recovery rule alone (Note [Shrink] in src/train/recovery.hpp): what the survivors go on
// from, as a function of the failed step, where the survivors stood and the states kept
// elsewhere. The runs behind it are in test_shrink.cpp.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "train/recovery.hpp"

using namespace lockstep::detail;

namespace {

// Survivors of ranks 0, 2, ... (rank 1 lost) that each hold the state after `updated`.
std::vector<Survivor> holding(std::int64_t updated, int count, std::uint64_t hash = 0xabc) {
  std::vector<Survivor> out;
  for (int i = 0; i < count; ++i)
    out.push_back({.rank = i == 0 ? 0 : i + 1,
                   .progress = SurvivorProgress{.updated = updated, .param_hash = hash, .lacks = {}}});
  return out;
}

RecoveryInput input(std::int64_t failed_step, std::vector<Survivor> survivors,
                    StoredStates stored = {}) {
  const int workers = static_cast<int>(survivors.size()) + 1;
  return {.failed_step = failed_step,
          .survivors = std::move(survivors),
          .workers = workers,
          .min_workers = 1,
          .processes = 1,
          .zero = false,
          .stored = stored};
}

}  // namespace

TEST_CASE("recovery rule: survivors that hold one state go on from it, nothing redone") {
  // A loss in step 9's forward, backward, or all-reduce before any update: the state after 8.
  RecoveryChoice c = choose_recovery(input(9, holding(8, 2), {.group_start = std::nullopt,
                                                              .snapshot = 6,
                                                              .checkpoint = 3}));
  CHECK(c.source == RecoverySource::survivors);
  CHECK(c.step == 8);
  CHECK(c.redone == 0);
  CHECK(c.why.empty());
  // A loss in step 9's update phase: every survivor had applied it; so did a loss in step 10's
  // forward before step 9's totals were agreed (Note [Deferred step read]).
  c = choose_recovery(input(9, holding(9, 3)));
  CHECK(c.source == RecoverySource::survivors);
  CHECK(c.step == 9);
  CHECK(c.redone == 0);
  c = choose_recovery(input(10, holding(9, 2)));
  CHECK(c.source == RecoverySource::survivors);
  CHECK(c.step == 9);
  CHECK(c.redone == 0);
  // Where that state is the group's start, the start itself: its sample position is exact.
  c = choose_recovery(input(5, holding(4, 2), {.group_start = 4, .snapshot = std::nullopt,
                                               .checkpoint = std::nullopt}));
  CHECK(c.source == RecoverySource::group_start);
  CHECK(c.step == 4);
  CHECK(c.redone == 0);
}

TEST_CASE("recovery rule: where no survivor state is whole, the newest stored one, and the "
          "applied steps after it are redone") {
  std::vector<Survivor> mid = holding(7, 2);
  mid[1].progress->lacks = "had begun the update of step 8, so the state after step 7 is gone";
  const StoredStates stored{.group_start = 2, .snapshot = 6, .checkpoint = 5};
  RecoveryChoice c = choose_recovery(input(8, mid, stored));
  CHECK(c.source == RecoverySource::snapshot);
  CHECK(c.step == 6);
  CHECK(c.redone == 1);  // step 7
  CHECK(c.why == "worker 2 had begun the update of step 8, so the state after step 7 is gone");
  // The lost worker reached step 10's forward, step 9's totals unagreed, and a survivor could
  // not read step 9's record: steps 7, 8 and 9 had been applied, so all three are redone.
  std::vector<Survivor> unread = holding(9, 2);
  unread[0].progress->lacks = "had not read the record of step 9";
  c = choose_recovery(input(10, unread, stored));
  CHECK(c.source == RecoverySource::snapshot);
  CHECK(c.redone == 3);
  // ZeRO-1: the lost shard; a loss in step 8's update phase had applied step 8 everywhere.
  RecoveryInput zero = input(8, holding(8, 2), stored);
  zero.zero = true;
  c = choose_recovery(zero);
  CHECK(c.source == RecoverySource::snapshot);
  CHECK(c.redone == 2);
  CHECK(c.why == "with trainer.zero: 1 the lost worker held its shard of the optimizer state");
  // A checkpoint on disk newer than the snapshot is read back; one newer than anything the
  // survivors applied is another run's, and is not.
  c = choose_recovery(input(8, mid, {.group_start = 2, .snapshot = 3, .checkpoint = 5}));
  CHECK(c.source == RecoverySource::checkpoint);
  CHECK(c.step == 5);
  CHECK(c.redone == 2);
  c = choose_recovery(input(8, mid, {.group_start = 2, .snapshot = 3, .checkpoint = 12}));
  CHECK(c.source == RecoverySource::snapshot);
  // In memory first where as new: the group's start before a snapshot of the same step.
  c = choose_recovery(input(8, mid, {.group_start = 6, .snapshot = 6, .checkpoint = 6}));
  CHECK(c.source == RecoverySource::group_start);
}

TEST_CASE("recovery rule: survivors that differ, or cannot report, are no state") {
  std::vector<Survivor> differ = holding(7, 2);
  differ[1].progress->param_hash = 0xdef;
  RecoveryChoice c = choose_recovery(input(8, differ));
  CHECK(c.source == RecoverySource::none);
  CHECK(c.why == "the survivors differ: the state after step 7 with parameter hash "
                 "0000000000000abc, and after step 7 with 0000000000000def, and there is no "
                 "in-memory snapshot (trainer.snapshot_every) or checkpoint on disk to recover "
                 "from");
  std::vector<Survivor> silent = holding(7, 2);
  silent[0].progress.reset();
  c = choose_recovery(input(8, silent, {.group_start = std::nullopt, .snapshot = 6,
                                        .checkpoint = std::nullopt}));
  CHECK(c.source == RecoverySource::snapshot);
  CHECK(c.why == "worker 0 could not report its state");
}

TEST_CASE("recovery rule: too few survivors, or several processes, cannot go on") {
  RecoveryInput few = input(8, holding(7, 1));
  few.min_workers = 2;
  RecoveryChoice c = choose_recovery(few);
  CHECK(c.source == RecoverySource::none);
  CHECK(c.why == "1 of 2 workers are left, fewer than trainer.min_workers = 2");
  RecoveryInput spread = input(8, holding(7, 3));
  spread.processes = 2;
  c = choose_recovery(spread);
  CHECK(c.source == RecoverySource::none);
  CHECK(c.why == "the run spans 2 processes, whose communicators cannot be rebuilt from one of "
                 "them");
}

TEST_CASE("recovery rule: the survivors keep their batch, or with keep_global_batch the global one") {
  // 2 workers x 2 micro-batches of 8 lose one: each keeps its batch, or 1 x 4 keeps all 32.
  SurvivorsBatch b = survivors_batch(2, 1, 2, 8, false);
  CHECK(b.accumulate_steps == 2);
  CHECK(b.words == "16 samples per step");
  b = survivors_batch(2, 1, 2, 8, true);
  CHECK(b.accumulate_steps == 4);
  CHECK(b.words == "32 samples per step (trainer.keep_global_batch: accumulate_steps 4)");
  // 3 x 1 on 2: 3 micro-batches do not divide, each keeps its batch.
  b = survivors_batch(3, 2, 1, 8, true);
  CHECK(b.accumulate_steps == 1);
  CHECK(b.words == "16 samples per step (trainer.keep_global_batch: 3 micro-batches do not "
                   "divide among 2 workers)");
}
