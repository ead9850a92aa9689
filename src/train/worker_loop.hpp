// One worker of the data-parallel trainer: its set-up, its steps and its share of the summary.
//
//   WorkerLoop loop(run, rank, comm);
//   try { loop.run(backend); } catch (...) { /* record the failure, abort comm */ }
//   loop.drain();  // then the teardown latch; see Note [Failure]
//
// Note [One step]
//   worker r, for each of accumulate_steps micro-batches (run_micro_batch):
//              next batch from its shard loader (assembled ahead on the loader's thread)
//              -> staged to the device a batch ahead (StagedBatches) -> forward -> loss
//              -> backward
//   The loss and correct count stay on the device, in the step record (step_record.hpp).
//   A decoder's LM head runs with the loss and its own backward, a chunk of rows at a time,
//   once the gradients are zeroed (Note [Chunked classifier] in src/model/lm_head.cpp).
//   On a GPU the forward and the backward, the loss inside whichever runs it, may each run as
//   device graphs, captured once and replayed (trainer.cuda_graphs; Note [Step graphs] in step_graphs.hpp).
//   During the last micro-batch's backward the reducer all-reduces (avg) each gradient bucket as
//   soon as backward has filled it (see Note [Buckets] in reducer.hpp); every replica then holds
//   the average over the global batch.
//              -> optimiser step, bucket by bucket as the all-reduces finish (whole buffer at
//                 once when clipping or skipping: the global norm needs every bucket first;
//                 the clip factor and the skip flag are made and read on the device)
//              -> the step record's copy to the host, queued (reduce_and_update)
//   and once it is read, during the next step's first forward (Note [Deferred step read]) or at
//   once when the step's end needs the device (close_step):
//              -> the step record read: the step's one host sync (Note [One read per step] in
//                 step_record.hpp)
//              -> all_reduce_host(StepTotals)  metrics for the log, and the stop decision
//              -> the non-finite policy (after_update), callbacks (report)
//              -> eval, replica check, barrier, checkpoint (end_of_step)
//   With trainer.zero: 1 the buckets are reduce-scattered instead, each rank updates only its
//   shard of each, and the parameters are all-gathered before the step goes on (Note [ZeRO-1]
//   in reducer.hpp; update_bucket, gather_parameters). With trainer.zero: 2 backward writes
//   into the reducer's bucket buffers, and each rank keeps only its shard of the reduced
//   gradient (Note [ZeRO-2]).
//   The norm of the averaged gradient is identical on every replica, so clipping and the
//   non-finite check agree everywhere. Every `check_replicas_every` steps, and at the end, the
//   ranks all-gather a hash of their parameters; any difference stops the run.
//
// Note [Deferred step read]
//   The host reads step k's record while step k+1 is already queued, so that a GPU never idles
//   for its host between steps: the host's wake-up, the all-reduce of the totals, the callbacks
//   and logs, and the next enqueue all happen while the device runs step k+1's first forward.
//   The loop (run):
//     step k:   forward/backward/all-reduce/update queued; the record's copy queued (two
//               records, steps use them in turn: StepRecord::start_read)
//     step k+1: begin_step; micro-batch 0's forward queued; then close_step(k): read k's
//               record, agree its totals, the non-finite policy, report, end_of_step; then
//               micro-batch 0's backward (zero_grads first), and the rest of step k+1.
//   At that point the device holds exactly the state after step k: the forward changed no
//   parameter, optimiser state or gradient (the gradients are zeroed only after the read, so a
//   non-finite one can still be named). So every hook, message and checkpoint of step k sees
//   what it saw when the read came at step k's end, and
//     - metrics, logs, the progress and step callbacks, the report and the metrics stream come
//       one step later in time, each step once, in order, with the same values;
//     - the stop decision (request_stop, SIGINT, the Python KeyboardInterrupt) is agreed at
//       step k's read as before: the run then stops at step k, its end written from the state
//       after step k (a checkpoint that --resume continues bit for bit); step k+1's queued
//       forward is dropped, along with its batch, which the checkpoint's position does not
//       count;
//     - trainer.on_nonfinite: the skip flag is on the device (step_control), and with updates
//       per bucket (no clipping, on_nonfinite: stop) each bucket has its own (step_control over
//       the grains it updates: StepRecord::bucket_control), so no non-finite value reaches the
//       weights or the optimiser state, while finite buckets are still applied as they land;
//       the host then stops naming step k and the tensor, before step k+1's update is queued.
//   A step whose end needs the device's state (eval, a replica check, a checkpoint, a
//   snapshot, the last step) is read at its end, as before (defers_read): its end runs before
//   the next step's forward overwrites the activations. TrainerHooks::defer_read = false reads
//   every step so, for tests. The state a step starts from (mark_step_start) is final once the
//   step before is closed, its totals agreed; until then a survivor of a lost worker reports
//   the step before as applied but unagreed, its record read (Note [Shrink] in recovery.hpp,
//   step 2). Host syncs are counted per step (Note [Host
//   syncs] in device.hpp): those from its start to its queued end, less closing the step
//   before, plus its own record's read.
//
// Note [Warm-up]
//   Before step 1 each worker runs forward and backward once at its batch size, on zeros with a
//   zero gradient of the logits (Replica::warm_up), so that what a device makes on the first
//   product of each shape (oneDNN primitives on the CPU, Note [CPU matrix products] in
//   src/cpu/matmul.hpp; cuBLAS's first-call set-up) costs step 1 nothing: gpt_tiny's step 1 took
//   about 1.8x a later step without it, and as long as one with it (bench/RESULTS.md). Then the
//   kernels of the step's end run once on scratch memory (warm_up_step_tail in optimizer.hpp), so
//   that a GPU has loaded every kernel of a step before its first collective. It touches
//   no optimiser state, loss statistics, random state, data position or step count, and leaves
//   the gradients zero, so every result is what it was without it. It runs before the loop's
//   clock (loop_s) and step 1's count of host syncs start (Note [Host syncs] in device.hpp). Eval
//   runs at the same batch size; a shorter last batch (an epoch's with drop_last false, the eval
//   split's) still makes its own primitives. TrainerHooks::warm_up = false leaves it out, for
//   tests.
//
// Note [Failure]
//   A worker that throws records its error (FailureLog, failures.hpp) and aborts the group:
//   every rank blocked in (or later entering) a collective throws CommAborted and leaves its
//   loop too. Before anything a worker owns is freed, it drains its in-flight all-reduces and
//   its communicator (WorkerLoop::drain), and meets the others at a teardown latch, because a
//   peer's communication thread, or its kernels on a GPU, may still be reading its buffers. So each worker's resources live in its
//   WorkerLoop, which outlives the try block (Trainer::Impl::run_workers in trainer.cpp).
//   Trainer::run joins all threads, then rethrows the first error that was not CommAborted
//   (FailureLog::rethrow_first).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "lockstep/checkpoint.hpp"
#include "lockstep/config.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/device.hpp"
#include "lockstep/model.hpp"
#include "lockstep/trainer.hpp"
#include "train/fault_injection.hpp"
#include "train/recovery.hpp"
#include "train/device_busy.hpp"
#include "train/snapshot.hpp"
#include "train/step_graphs.hpp"
#include "train/step_record.hpp"
#include "train/trace.hpp"
#include "train/watchdog.hpp"

namespace lockstep {
class Communicator;
}

namespace lockstep::detail {

class DeviceMemoryRecord;
class MetricsLog;
class RunReport;
class Optimizer;
class Reducer;

struct TrainerCallbacks {
  std::function<void(const StepMetrics&)> step;
  std::function<void(const StepMetrics&)> progress;
  std::function<void(const EvalMetrics&)> eval;
  std::function<void(std::int64_t step, const std::string& weights_file)> checkpoint;
  TrainerHooks hooks;
};

// The run as its workers see it, set up by Trainer::run before the threads start. Workers only
// read it, except `summary` and `final_params`, which local worker 0 alone writes.
struct RunContext {
  const Config& cfg;
  const Model& model;
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> eval;  // may be null
  const TrainerCallbacks& callbacks;
  const Checkpoint* resume;        // null: a fresh run from `initial`
  std::span<const float> initial;
  // The model's frozen parameters, loaded into every replica (Note [Frozen parameters] in
  // src/model/lora.cpp); empty without.
  std::span<const float> base;
  std::string_view base_source;  // where it came from (Note [LoRA exports] in src/io/lora_checkpoint.cpp)
  std::int64_t total_steps;
  double start_s;
  double peak_flops;  // of every worker of the job together; 0 when unknown (see mfu())
  Fault fault;
  const std::atomic<bool>& stop_requested;
  std::atomic<std::int64_t>& saving_step;  // the step rank 0 is saving, or -1
  Trace& trace;
  Heartbeats& heartbeats;
  CheckpointManager* checkpoints;  // null: no checkpoints, or not the writing process
  MetricsLog* metrics;             // trainer.metrics; null: unset, or not the writing process
  RunReport* report;               // trainer.report; null: unset, or not the writing process
  SnapshotSlot& snapshot;
  Summary& summary;
  DeviceMemoryRecord& device_memory;  // Note [Device memory measured]
  std::vector<float>& final_params;
  const std::map<std::string, std::string>& tokenizer_record;  // for checkpoints' metadata
  // The failed group's log window, after a shrink (Note [Window across a shrink] in
  // recovery.hpp); null: none.
  const CarriedWindow* carried_window = nullptr;

  // Model FLOPs utilisation at `tokens_per_s` over the job: 0 without a known peak or FLOP count.
  double mfu(double tokens_per_s) const {
    return peak_flops > 0.0 ? summary.flops_per_token * tokens_per_s / peak_flops : 0.0;
  }
};

// The step's totals over every worker: what one host all-reduce agrees on each step.
struct StepTotals {
  double loss_sum = 0.0;
  double correct = 0.0;
  double samples = 0.0;
  double counted = 0.0;  // labels that count toward the loss (samples x targets unless masked)
  double stop = 0.0;  // > 0: some process asked to stop (request_stop)

  std::array<double, 5> fields() const { return {loss_sum, correct, samples, counted, stop}; }
  static StepTotals from(std::span<const double, 5> f) {
    return {f[0], f[1], f[2], f[3], f[4]};
  }
};

// Double buffering: while the device computes on one batch, the next is already on its way
// (see StagedBuffer in device.hpp).
class StagedBatches {
 public:
  struct Staged {
    std::unique_ptr<StagedBuffer> x;  // (batch, features) floats
    std::unique_ptr<StagedBuffer> y;  // (batch, targets) int32
    // (batch, features) int32 positions of packed data (Note [Packed windows] in
    // src/data/chat.cpp); null otherwise.
    std::unique_ptr<StagedBuffer> positions;
    Batch batch;                      // its host copy: size, epoch and position
  };
  // `batches`: how many the run will take. Stages the first. `position_bytes` 0: no positions.
  StagedBatches(Device& device, ShardLoader& loader, std::size_t x_bytes, std::size_t y_bytes,
                std::size_t position_bytes, std::int64_t batches, std::vector<TraceEvent>* track);
  // The next batch, ready for kernels; the one after starts on its way.
  const Staged& take();
  // The labels that count (Batch::counted) in the next `n` batches take() returns, read ahead
  // from the loader as far as needed (Note [Global token mean]).
  std::int64_t counted_ahead(int n);
  double data_wait_s() const noexcept { return data_wait_s_; }

 private:
  void stage(Staged& s);

  ShardLoader& loader_;
  std::vector<TraceEvent>* track_;
  Staged staged_[2];
  std::deque<Batch> ahead_;  // loaded, not yet staged (counted_ahead)
  int current_ = 0;
  std::int64_t left_;
  double data_wait_s_ = 0.0;
};

class WorkerLoop {
 public:
  // `rank` is the local worker index (device, trace track, heartbeat); comm.rank() its rank in
  // the whole job (Note [Processes] in trainer.cpp).
  WorkerLoop(const RunContext& run, int rank, Communicator& comm);
  ~WorkerLoop();
  WorkerLoop(const WorkerLoop&) = delete;
  WorkerLoop& operator=(const WorkerLoop&) = delete;

  // Set-up, every step, then the final eval, replica check and summary.
  void run(Backend& backend);
  // Waits for the all-reduces still in flight, after a failure (Note [Failure]).
  void drain() noexcept;

  // Where this worker stood once its group was aborted, and the state it holds then: what Note
  // [Shrink] in recovery.hpp needs of a survivor. Called on the worker's thread, after drain()
  // and the teardown meeting; recovery_state() only where progress().lacks is empty, without
  // ZeRO-1: the state after progress().updated, as a checkpoint written at that step's end
  // holds it (save_checkpoint).
  SurvivorProgress progress() const;
  Checkpoint recovery_state() const;

 private:
  class SurvivorReads;  // Note [Survivor reads] in worker_loop.cpp
  // Everything this worker owns, in dependency order: later members use earlier ones.
  struct Resources {
    std::unique_ptr<Device> device;
    std::unique_ptr<Replica> replica;
    std::unique_ptr<Optimizer> optimizer;
    std::unique_ptr<Reducer> reducer;
    std::unique_ptr<StepRecord> records[2];  // steps use them in turn (Note [Deferred step read])
    std::unique_ptr<ShardLoader> loader;
    std::unique_ptr<StagedBatches> batches;
    // (batch x targets, classes); empty where the replica's LM head fuses the loss (Note
    // [Chunked classifier] in src/model/lm_head.cpp).
    DeviceArray<float> dlogits;
    // trainer.snapshot_every's copies (Note [Snapshots]); last, so that it is destroyed first:
    // its copies read the replica's and the optimiser's memory.
    std::unique_ptr<Download> download;
    // trainer.cuda_graphs (Note [Step graphs]); after everything its graphs use.
    std::unique_ptr<StepGraphs> graphs;
  };
  // Where the run stands: the step being taken, and where the next batch comes from.
  struct Position {
    std::int64_t step = 0;
    std::uint64_t epoch = 0;
    std::uint64_t batch_in_epoch = 0;
    std::uint64_t epoch_start = 0;  // TrainState::epoch_start
    std::int64_t samples = 0;  // consumed over all workers, this run
    std::int64_t loss_tokens = 0;  // labels that counted, over all workers, this run
  };
  // Metrics since the last log_every report.
  struct Window {
    double last_report_s = 0.0;
    double last_step_s = 0.0;         // when the step before was reported (Summary::step_*)
    std::vector<double> step_rates;   // each step's tokens/s, worker 0's (Summary::step_*)
    std::vector<WindowStep> steps;    // since the last line (Note [Window across a shrink])
    double comm_s = 0.0, exposed_s = 0.0, data_wait_s = 0.0;  // cumulative, at the last report
    StepMetrics last{};
  };
  // Time accounting, seconds (data waits are counted by StagedBatches).
  struct Times {
    double loop_start_s = 0.0;
    double barrier_wait_s = 0.0;
  };
  // What the last micro-batch's backward reports per layer: trace spans, and the nan fault
  // (Fault::Kind::nan) on its way.
  struct BackwardProbe {
    double layer_start_s = 0.0;
    bool inject_nan = false;
  };
  struct UpdateResult {
    double loss = 0.0;  // mean per prediction over the global batch
    double lr = 0.0;
    double grad_norm = 0.0;
  };

  // Host syncs per step (Note [Host syncs] in device.hpp): the first step's, and the most of
  // any later one.
  struct SyncCount {
    std::uint64_t at_step_start = 0;
    std::uint64_t other_step = 0;  // since then, closing the step before (Note [Deferred step read])
    std::uint64_t first = 0;
    std::uint64_t steady_max = 0;
    std::int64_t steps = 0;
    std::uint64_t per_step() const noexcept { return steps > 1 ? steady_max : first; }
  };
  // A step whose work is queued and whose record is not read yet (Note [Deferred step read]).
  struct Pending {
    Position end;         // where it ended
    StepTotals mine;      // its samples; its loss comes from the record
    StepRecord* record;
    std::uint64_t host_syncs = 0;  // from its start to its queued end, less closing the step before
    std::optional<StepRecord::Host> read;  // the record, once read (a recovery looks at it)
  };
  void set_up(Backend& backend);
  bool cores_scarce(const Backend& backend) const;
  void set_up_data(bool cores_scarce);
  void warm_up();
  void begin_step();
  void mark_step_start();
  void count_host_syncs(std::uint64_t n);
  bool run_micro_batch(int micro, StepTotals& mine);
  float loss_scale(int micro, const Batch& b);
  StepTotals agree_totals(StepTotals mine);
  void reduce_and_update();
  void queue_end(const StepTotals& mine);
  bool defers_read(std::int64_t step) const;
  bool close_step(bool deferred);
  UpdateResult after_update(const StepTotals& totals, const StepControl& control);
  bool updates_per_bucket() const;
  void update_bucket(std::size_t bucket, double lr, const StepControl* control);
  void gather_parameters();
  bool zero() const noexcept { return run_.cfg.trainer.zero >= 1; }
  // ZeRO-2 without accumulation: the reducer holds the gradients (Note [ZeRO-2]).
  bool shards_gradients() const noexcept {
    return run_.cfg.trainer.zero == 2 && run_.cfg.trainer.accumulate_steps == 1;
  }
  // Backward's GradientTarget: the reducer's under ZeRO-2, else unset (the replica's buffer).
  GradientTarget gradient_target();
  void on_nonfinite(double loss, double grad_norm, bool skipped);
  // `carried`: the unagreed step of a failed group, reported as the survivors start (Note
  // [Window across a shrink]); not a step this loop timed.
  void report(const StepTotals& totals, const UpdateResult& update, bool stop_now,
              bool carried = false);
  void carry_window(const CarriedWindow& w);
  void add_window_times(StepMetrics& m);
  void end_of_step(bool stop_now);
  void finish();
  void fill_summary(std::span<const double> time_rows, const EvalMetrics& final_eval);

  void grads_ready(std::size_t layer);
  void lose_device_in_all_reduce();
  EvalMetrics evaluate();
  void check_replicas();
  void checkpoint_if_due(bool stop_now);
  bool snapshots() const;
  std::vector<SnapshotRange> snapshot_ranges() const;
  void snapshot_if_due();
  void poll_snapshot(bool wait);
  void fence_snapshot();
  std::vector<StateVector> gather_optimizer_state();
  // A checkpoint of the state at `at`: everything but the parameters and the optimiser state's
  // values (describe_state), then with them.
  Checkpoint describe_state(const Position& at, std::int64_t optimizer_steps) const;
  Checkpoint make_checkpoint(const Position& at, std::int64_t optimizer_steps,
                             std::vector<StateVector> optimizer_state) const;
  void save_checkpoint(std::vector<StateVector> optimizer_state);
  [[noreturn]] void report_nonfinite(double loss, double grad_norm);
  void beat();
  // What this worker does now, for the watchdog's and the bounded stop's reports.
  void enter(Phase phase, int index = -1);

  const RunContext& run_;
  const int rank_;
  const int global_;
  Communicator& comm_;
  std::vector<TraceEvent>* track_;
  Resources res_;
  double step_counted_ = 0.0;  // the step's counted labels, all workers (Note [Global token mean])
  Position pos_;
  // The position and the optimiser's step count the next step starts from (the last step's
  // end, until that next step's update begins), and whether it has: a recovery's state (Note
  // [Shrink] in recovery.hpp). Set as a step begins and once it is closed.
  struct StepStart {
    Position pos;
    std::int64_t optimizer_steps = 0;
    bool updating = false;
  };
  std::optional<StepStart> step_start_;  // nullopt before the first step
  Window window_;
  Times times_;
  BackwardProbe backward_;
  SyncCount syncs_;
  DeviceBusy busy_;
  int skips_in_row_ = 0;  // updates dropped in a row by on_nonfinite: skip
  // Note [Snapshots]: the step of this worker's copy not yet seen landed (-1: none), and
  // whether the next update must still be ordered after it.
  std::int64_t snapshot_pending_ = -1;
  bool snapshot_fence_ = false;
  std::optional<Pending> pending_;  // the step whose record is still to be read
  bool stopped_ = false;  // the ranks agreed to stop before the last step: no final eval
};

}  // namespace lockstep::detail
