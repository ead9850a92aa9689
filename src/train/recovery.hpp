// What a run that lost a worker's device goes on from (trainer.on_worker_failure: shrink): the
// rule, as a function of the failure point and of where the survivors stood.
//
//   std::vector<Survivor> survivors = ...;  // each survivor's WorkerLoop::progress()
//   const RecoveryChoice c = choose_recovery({.failed_step = ..., .survivors = survivors, ...});
//   if (c.source == RecoverySource::none) /* stop, saying c.why */;
//
// Note [Shrink]
//   trainer.on_worker_failure: shrink keeps a run going when a worker's device is lost: every
//   survivor holds a whole replica, and without ZeRO-1 the whole optimiser state, in this very
//   process. Only a device-class failure (DeviceLost: a device that is gone or poisoned, the
//   injected `lost` fault) is survived. The rest stay fatal: an input error would fail again on
//   the survivors; a non-finite loss or gradient is the same on every replica (the gradient is
//   averaged), so the survivors would meet it too; replicas that diverged leave no state known
//   to be right; a watchdog stall names a worker that may still run and touch the group.
//   The survivors' run is, by construction, a resume from a checkpoint in memory:
//   1. The group is aborted as for any failure (Note [Failure] in worker_loop.hpp); run_workers
//      waits for every worker within trainer.stop_grace_s (Note [Bounded stop] in trainer.cpp).
//      A lost worker that does not return (a driver call on a dead device that never does;
//      LOCKSTEP_FAULT lost:...:stuck) is left running, as the bounded stop leaves one, and the
//      survivors go on without it: what it can still touch is never freed (its group's
//      communicators, heartbeats, context and teardown meeting move to
//      RunResources::abandoned_groups, the survivors' loops to kept_loops, and the run's and the
//      Trainer's state are leaked at the end), and the log line says so. Any other worker left
//      behind stops the run, as before: it may still write state the survivors would read.
//   2. Where the survivors stand is a function of the failure point alone. A collective that
//      every rank had joined before the abort completes on every rank, however late a rank
//      wakes from it (Note [A completed phase stands] in src/comm/abortable_barrier.hpp), and
//      one that the lost worker never joined completes on none; between collectives a worker
//      never looks at the abort on the CPU. So each survivor runs on until the first collective
//      the lost worker did not join, and stops there: after the teardown meeting it reports
//      (WorkerLoop::progress, SurvivorProgress; its device reads wait though the group is
//      aborted: Note [Survivor reads] in worker_loop.cpp) the newest step whose update it
//      applied whole,
//      and whether its memory holds the state after that step (not when it had begun the next
//      step's update: with per-bucket updates a bucket that landed was applied). A step whose
//      update is whole but whose record is unread (Note [Deferred step read] in worker_loop.hpp:
//      the lost worker died before agreeing its totals) counts as done: the survivor reads its
//      own record (finite and not skipped, the same on every replica) and its state is the one
//      a checkpoint at that step's end holds, its samples those of the whole group; its metrics
//      are the survivors' (the lost worker's loss is gone), reported as their run starts (Note
//      [Window across a shrink]). The first survivor copies that state
//      (WorkerLoop::recovery_state).
//      So, by failure point (LOCKSTEP_FAULT=RANK:K:lost:PHASE):
//        forward, backward   the state after step K - 1;
//        all-reduce          the buckets it handed over land (with overlap the first, without
//                            it every one): where that is every bucket, each survivor applies
//                            the whole update, the state after step K; else with clipping or
//                            skipping (the update waits for every bucket) the state after
//                            K - 1, and with per-bucket updates none (3.): a bucket that
//                            landed was applied;
//        update              the state after step K, whose update every replica had applied;
//        ZeRO-1, any phase   none (3.): the lost worker held its shard of the optimiser state.
//   3. choose_recovery, a pure function of the failed step (the lost worker's), the survivors'
//      progress and the states kept elsewhere: where every survivor holds the state after the
//      same step with the same parameter hash (as the replica check demands), that state;
//      and where that step is the one the group started from, the group's start itself, as it
//      records the sample position exactly (one recorded again on N - 1 workers is rounded
//      down to whole batches: Note [Re-sharding] in worker_loop.cpp). Otherwise the newest
//      of: the newest in-memory snapshot (with trainer.snapshot_every K every worker copies its part of the
//      state to host memory after every K-th step's barrier, as a checkpoint would hold it, and
//      a snapshot replaces the older one only once every part has landed: Note [Snapshots] in
//      snapshot.hpp), the state the group started from (a recovery's, or --resume's, held in
//      memory: a second loss while the survivors restore it recovers from it again), and the
//      newest complete checkpoint this run wrote (trainer.checkpoint.dir, read back from disk
//      only then; one of a step the survivors had not passed). The steps whose update had been
//      applied after that state are taken again (steps_redone), and their metrics reported
//      again. Without any, the run stops and says why; so it does with fewer than
//      trainer.min_workers survivors, or several processes (their communicators span the job and
//      cannot be rebuilt from one).
//      Snapshots cost a copy of the parameters and optimiser state each K steps, 1/N of it per
//      device: on a GPU asynchronous, into pinned memory, beside the next step's forward and
//      backward; on the CPU a memcpy on the step's thread. The memory plan counts two on the
//      host (MemoryPlan::snapshots).
//   4. The communicators are made anew over the survivors' devices (Backend::
//      rebuilds_communicators: the CPU's, and the CUDA backend's peer and NCCL groups; a
//      backend that cannot is refused before step 1), and the survivors' workers start from
//      that state with N - 1 ranks: the data is re-sharded from its sample position by the rule
//      any resume with another device count follows (Note [Re-sharding] in worker_loop.cpp),
//      each worker keeps its batch (so the global batch shrinks; with
//      trainer.keep_global_batch, accumulate_steps is raised to N k / (N - 1) where that is
//      whole, and the global batch stays), and trainer.steps stays; with trainer.epochs the step
//      count is that of N - 1 workers.
//   So the run ends bit-identical to one that --resumes, on the survivors' devices, from a
//   checkpoint written at the end of the step the state follows: tests/train/test_shrink.cpp,
//   and the rule alone in tests/train/test_recovery.cpp. One line on stderr says which worker
//   and device, the error, the state, the steps redone and the seconds (the abort to the
//   survivors' start); the Summary counts them (workers_lost, recoveries, steps_redone,
//   recovery_s), and devices and the time accounting are then the survivors'.
//   On a GPU step 2 holds as far as the device's waits go: a survivor whose queue had not
//   reached a collective's end when the group was aborted throws from its wait (Note [Abortable
//   waits] in device.hpp) and reports less; the rule then takes a stored state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace lockstep::detail {

// One step's totals in the log window, kept from the step's report until the line that covers
// it is written (trainer.log_every); Note [Window across a shrink].
struct WindowStep {
  std::int64_t step = 0;
  double loss_sum = 0.0;
  double correct = 0.0;
  double samples = 0.0;
  double counted = 0.0;
  double grad_norm = 0.0;  // of the unagreed step (the line's own); unused for the others
};

// Where a survivor stood once its group was aborted (WorkerLoop::progress).
struct SurvivorProgress {
  std::int64_t updated = 0;      // the newest step whose optimiser update it had applied whole
  std::uint64_t param_hash = 0;  // of its parameters, as the replica check hashes them
  std::string lacks;  // why its memory does not hold the state after `updated`; empty: it does
  // The log window: the agreed steps since the last line (the same on every survivor), when it
  // began (steady seconds), and the step whose update stands but whose totals were never
  // agreed, with this survivor's own totals (nullopt: none).
  std::vector<WindowStep> window = {};
  double window_start_s = 0.0;
  std::optional<WindowStep> unagreed = std::nullopt;
};

// Note [Window across a shrink]
//   A log line (trainer.log_every) covers the steps since the one before; a shrink must not
//   lose the steps of the window it cuts. The survivors' first worker goes on from the failed
//   group's window: its steps up to the state the run goes on from (a step redone is reported
//   again, so it is left out), and the step whose update stands though the lost worker never
//   agreed its totals (Note [Shrink], step 2), with the survivors' totals summed: its loss and
//   accuracy over the samples that are left (the lost worker's are gone with its device),
//   reported as the survivors' run starts. So every step that stands has its line, or is in
//   the next one, once: tests/train/test_shrink.cpp.
struct CarriedWindow {
  std::vector<WindowStep> agreed;
  std::optional<WindowStep> unagreed;  // summed over the survivors
  double start_s = 0.0;
};
// The window the survivors go on from, after state `resumed_step`, from each survivor's
// progress (nullopt: it could not report), in rank order: the agreed steps up to it, and the
// unagreed step where it is that state's.
CarriedWindow carried_window(std::span<const std::optional<SurvivorProgress>> survivors,
                             std::int64_t resumed_step);

struct Survivor {
  int rank = 0;                             // in the group that failed
  std::optional<SurvivorProgress> progress;  // nullopt: it could not report
};

// The steps of the states kept outside the survivors' memory; nullopt: none.
struct StoredStates {
  std::optional<std::int64_t> group_start;  // the state the group started from (--resume's, or a recovery's)
  std::optional<std::int64_t> snapshot;     // the newest complete in-memory snapshot
  std::optional<std::int64_t> checkpoint;   // the newest complete checkpoint on disk
};

struct RecoveryInput {
  std::int64_t failed_step = 0;  // the step the lost worker was in
  std::vector<Survivor> survivors;
  int workers = 0;  // of the group that failed
  int min_workers = 1;
  int processes = 1;
  int zero = 0;  // trainer.zero
  StoredStates stored;
};

enum class RecoverySource { none, survivors, group_start, snapshot, checkpoint };

struct RecoveryChoice {
  RecoverySource source = RecoverySource::none;  // none: the run cannot go on, `why` says why
  std::int64_t step = 0;    // the state is the one after this step
  std::int64_t redone = 0;  // steps whose update had been applied, taken again
  std::string why;          // why not the survivors' own state; empty when it is that
};

// The state every survivor holds alike: the step it follows, or why there is none (`why`).
struct CommonState {
  std::optional<std::int64_t> step;
  std::string why;
};
CommonState common_state(std::span<const Survivor> survivors, int zero);

// Note [Shrink], step 3.
RecoveryChoice choose_recovery(const RecoveryInput& in);

// Note [Shrink], step 4: the survivors' accumulate_steps, and the log line's words for their
// global batch. `workers` of the failed group, `left` of them survive.
struct SurvivorsBatch {
  int accumulate_steps = 1;
  std::string words;  // "48 samples per step (trainer.keep_global_batch: ...)"
};
SurvivorsBatch survivors_batch(int workers, int left, int accumulate_steps, int batch_size,
                               bool keep_global_batch);

}  // namespace lockstep::detail
