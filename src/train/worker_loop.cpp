// One worker's loop; Note [One step] and Note [Failure] in worker_loop.hpp.
#include "train/worker_loop.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "common/elementwise_math.hpp"
#include "common/median.hpp"
#include "common/random.hpp"
#include "lockstep/comm.hpp"
#include "lockstep/error.hpp"
#include "train/device_memory.hpp"
#include "train/evaluation.hpp"
#include "train/metrics_log.hpp"
#include "train/optimizer.hpp"
#include "train/reducer.hpp"
#include "train/report.hpp"
#include "train/step_record.hpp"
#include "train/watchdog.hpp"

namespace lockstep::detail {
namespace {

// One worker's time accounting, in seconds. A host all-reduce over a row per worker (each fills
// its own, the rest are 0) gives every worker every row.
struct TimeRow {
  double loop_s = 0.0;  // the training loop, first step to last
  double comm_exposed_s = 0.0;
  double data_wait_s = 0.0;
  double barrier_wait_s = 0.0;
  double comm_s = 0.0;
  double optimizer_state_bytes = 0.0;  // exact in a double up to 2^53
  double gradient_bytes = 0.0;         // likewise
  double host_syncs_per_step = 0.0;
  // The worker's linear products over the run (LinearCounts), exact in a double up to 2^53.
  double linear_fused = 0.0, linear_partial = 0.0, linear_composed = 0.0;
  double device_busy = -1.0;  // Note [Device step time]; -1: not measured

  static constexpr std::size_t kFields = 12;
  std::array<double, kFields> fields() const {
    return {loop_s,         comm_exposed_s,        data_wait_s,         barrier_wait_s,
            comm_s,         optimizer_state_bytes, gradient_bytes,      host_syncs_per_step,
            linear_fused,   linear_partial,        linear_composed,     device_busy};
  }
  static TimeRow from(std::span<const double> f) {
    return {f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11]};
  }
};

// Sums a named struct over every worker of `comm`: its fields() travel as one host all-reduce.
template <class Totals>
Totals all_reduce_fields(Communicator& comm, const Totals& mine) {
  auto fields = mine.fields();
  comm.all_reduce_host(fields);
  return Totals::from(fields);
}

}  // namespace

// ---- Double buffering ---------------------------------------------------------------------------

StagedBatches::StagedBatches(Device& device, ShardLoader& loader, std::size_t x_bytes,
                             std::size_t y_bytes, std::size_t position_bytes, std::int64_t batches,
                             std::vector<TraceEvent>* track)
    : loader_(loader), track_(track), left_(batches) {
  for (Staged& s : staged_) {
    s.x = device.make_staged_buffer(x_bytes);
    s.y = device.make_staged_buffer(y_bytes);
    if (position_bytes > 0) s.positions = device.make_staged_buffer(position_bytes);
  }
  if (left_ > 0) stage(staged_[current_]);
}

void StagedBatches::stage(Staged& s) {
  {
    TraceSpan span(track_, "data wait");
    const double t0 = steady_now_s();
    if (ahead_.empty()) {
      s.batch = loader_.next();
    } else {
      s.batch = std::move(ahead_.front());
      ahead_.pop_front();
    }
    data_wait_s_ += steady_now_s() - t0;
  }
  s.x->stage(std::as_bytes(std::span(s.batch.x)));
  s.y->stage(std::as_bytes(std::span(s.batch.y)));
  if (s.positions) s.positions->stage(std::as_bytes(std::span(s.batch.positions)));
  --left_;
}

std::int64_t StagedBatches::counted_ahead(int n) {
  // staged_[current_] is the next take() returns; then ahead_, in order, and left_ batches
  // not staged yet (those in ahead_ among them).
  std::int64_t count = 0;
  for (int i = 0; i < n && i <= left_; ++i) {
    if (i == 0) {
      count += staged_[current_].batch.counted;
      continue;
    }
    const auto k = static_cast<std::size_t>(i - 1);
    if (k >= ahead_.size()) {
      TraceSpan span(track_, "data wait");
      const double t0 = steady_now_s();
      ahead_.push_back(loader_.next());
      data_wait_s_ += steady_now_s() - t0;
    }
    count += ahead_[k].counted;
  }
  return count;
}

const StagedBatches::Staged& StagedBatches::take() {
  Staged& ready = staged_[current_];
  ready.x->wait();
  ready.y->wait();
  if (ready.positions) ready.positions->wait();
  current_ = 1 - current_;
  if (left_ > 0) stage(staged_[current_]);  // the next batch travels while this one computes
  return ready;
}

// ---- Set-up -------------------------------------------------------------------------------------

WorkerLoop::WorkerLoop(const RunContext& run, int rank, Communicator& comm)
    : run_(run),
      rank_(rank),
      global_(comm.rank()),
      comm_(comm),
      track_(run.trace.worker(rank)),
      pos_{.step = run.resume ? run.resume->state.step : 0} {}

WorkerLoop::~WorkerLoop() = default;

void WorkerLoop::drain() noexcept {
  if (res_.reducer) res_.reducer->drain();
  comm_.drain();  // work it enqueued on a device may still read a peer's buffers
}

void WorkerLoop::beat() { run_.heartbeats.beat(rank_, pos_.step); }

void WorkerLoop::enter(Phase phase, int index) { run_.heartbeats.enter(rank_, phase, index); }

// Note [Inline collectives]: on the CPU, whether the workers' compute threads (the arenas the
// CPU backend gives them) take every core, so that a communication thread could only run in
// their time slices.
bool WorkerLoop::cores_scarce(const Backend& backend) const {
  if (backend.name() != "cpu") return false;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int workers = static_cast<int>(run_.cfg.trainer.devices.size());
  return workers * cpu_threads_per_device(workers, run_.cfg.trainer.threads_per_device) >= cores;
}

namespace {

// The key of a training micro-batch's dropout masks (Note [LoRA dropout] in src/model/lora.cpp):
// the same for the same seed, step, micro-batch and rank, in any run, resumed or not.
std::uint64_t dropout_key(std::uint64_t seed, std::int64_t step, int micro, int rank) {
  using detail::derive_key;
  return derive_key(derive_key(derive_key(seed, static_cast<std::uint64_t>(step)),
                               static_cast<std::uint64_t>(micro)),
                    static_cast<std::uint64_t>(rank));
}

// A std::bad_alloc in a worker's set-up says what was being made, and (from the device) how much
// and where: "out of memory allocating the model replica (...): 12.0 MiB on cpu:1" (Note
// [Naming an allocation] in lockstep/error.hpp).
template <class Make>
auto allocating(std::string_view what, Make&& make) {
  try {
    return make();
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(fmt::format("{}: {}", what, e.allocation()));
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(std::string(what));
  }
}

}  // namespace

void WorkerLoop::set_up(Backend& backend) {
  const TrainerConfig& tc = run_.cfg.trainer;
  const Checkpoint* resume = run_.resume;
  res_.device = backend.create_device(tc.devices[rank_], static_cast<int>(tc.devices.size()),
                                      tc.threads_per_device);
  Device& dev = *res_.device;
  comm_.attach(dev);
  // ZeRO-2 without accumulation: no whole gradient buffer (Note [ZeRO-2]).
  res_.replica = allocating("the model replica (parameters, gradients, activations)", [&] {
    return std::make_unique<Replica>(dev, run_.model, run_.cfg.data.batch_size, tc.precision,
                                     /*own_gradients=*/!shards_gradients(), tc.recompute);
  });
  Replica& replica = *res_.replica;
  replica.load_parameters(resume ? std::span<const float>(resume->params) : run_.initial);
  if (!run_.base.empty()) replica.load_frozen(run_.base);
  if (run_.callbacks.hooks.restoring) run_.callbacks.hooks.restoring(global_);
  // The replicas start from the same host copy; the broadcast makes rank 0 the authority anyway,
  // as any later backend (several processes) needs.
  comm_.broadcast(replica.params(), replica.param_count(), 0);
  replica.refresh_bf16();

  std::vector<Bucket> buckets = plan_buckets(run_.model, tc.bucket_cap_mb);
  const bool scarce = cores_scarce(backend);
  const CommMode mode = choose_comm_mode(scarce, comm_.size(), buckets.size());
  res_.reducer = allocating("the gradient buckets", [&] {
    return std::make_unique<Reducer>(run_.model, comm_, dev,
                                     shards_gradients() ? nullptr : replica.grads(),
                                     std::move(buckets),
                                     tc.overlap, zero(), mode, tc.grad_reduce_dtype,
                                     run_.trace.comm(rank_));
  });
  // ZeRO-1: the optimiser holds the state of this rank's shards only (Note [ZeRO-1]).
  res_.optimizer = allocating("the optimiser state", [&] {
    return std::make_unique<Optimizer>(
        dev, run_.cfg.optimizer, replica.param_count(),
        decay_spans(run_.model.param_tensors(), replica.param_count(),
                    run_.cfg.optimizer.decay_all),
        zero() ? std::optional(res_.reducer->owned()) : std::nullopt);
  });
  if (resume)
    res_.optimizer->load_state(resume->optimizer_state, resume->state.optimizer_steps,
                               resume->weights_file.string());
  for (auto& record : res_.records)
    record = std::make_unique<StepRecord>(dev, res_.reducer->grains(),
                                          res_.reducer->buckets().size());
  if (snapshots()) {  // Note [Snapshots]: host memory for the first two, allocated now
    res_.download = dev.make_download();
    run_.snapshot.reserve(
        rank_,
        SnapshotSlot::part_floats(snapshot_ranges(), res_.optimizer->state_names().size()),
        [&dev](std::size_t bytes) { return dev.allocate_host(bytes); });
  }
  // ZeRO-2 retires buckets mid-backward: no graphs (Note [ZeRO-2]); nor with LoRA dropout, whose
  // key changes every micro-batch (Note [LoRA dropout]).
  res_.graphs = std::make_unique<StepGraphs>(
      dev,
      shards_gradients() || run_.train->masks_targets() || run_.cfg.model.lora.dropout > 0.0
          ? GraphMode::off
          : tc.cuda_graphs,
      pos_.step + 1, run_.total_steps,
      /*speaks=*/global_ == 0);
  if (rank_ == 0) {
    run_.summary.buckets = res_.reducer->buckets().size();
    run_.summary.comm_mode = to_string(mode);
    run_.summary.reduce_bytes_per_step = res_.reducer->bytes_per_step();
    run_.summary.reduce_dtype = to_string(run_.cfg.trainer.grad_reduce_dtype);
  }
  set_up_data(scarce);
}

// Note [Re-sharding]
//   A resumed run (and a shrink's survivors: Note [Shrink] in recovery.hpp) continues inside the
//   epoch it stopped in, each sample of the epoch served once. The DistributedSampler gives rank
//   r of N the positions s + r, s + r + N, ... of the epoch's order, s the epoch's start
//   position (0 in an epoch begun whole), so after b batches of B on each of N workers the
//   positions [0, s + b B N) are served; the checkpoint holds s (TrainState::epoch_start) and b.
//     - On N' = N workers the run goes on from batch b of the same sharding: the same batches,
//       bit for bit, as a run that never stopped.
//     - On N' != N it begins a new sharding of the epoch's rest at s' = s + b B N, batch 0:
//       rank r of N' takes s' + r, s' + r + N', ... (DistributedSampler::start_at), the rest
//       padded or trimmed as a whole epoch is. With s' at or past the epoch's last sample the
//       epoch is done and the next begins whole.
//   The next epoch is whole on N' workers. b counts whole batches only: an epoch's last batch,
//   full or not, ends the epoch. tests/train/test_resharding.cpp pins the samples served, for a
//   resume and for a shrink, against this definition.
// Note [Inline loader]: when the compute threads take every core, the loader has no core of its
// own either. Its thread then only adds a wake-up and two context switches per batch, taken
// from compute (a batch handed through the queue wakes the producer to refill it), so the
// worker assembles each batch itself (ShardLoader with prefetch 0): the same batches, no thread.
// bench/RESULTS.md measured it (issue 18).
void WorkerLoop::set_up_data(bool cores_scarce) {
  const Config& cfg = run_.cfg;
  const Dataset& train = *run_.train;
  const Checkpoint* resume = run_.resume;
  const int batch = cfg.data.batch_size, world = comm_.size();
  DistributedSampler sampler(train.size(), world, global_, cfg.data.shuffle, cfg.trainer.seed,
                             cfg.data.drop_last);
  if (resume) {
    const TrainState& at = resume->state;
    pos_.epoch = at.epoch;
    pos_.epoch_start = at.epoch_start;
    pos_.batch_in_epoch = at.batch_in_epoch;
    if (at.workers != world) {  // a new sharding of the epoch's rest (Note [Re-sharding])
      const std::uint64_t served =
          at.epoch_start + at.batch_in_epoch * static_cast<std::uint64_t>(batch) *
                               static_cast<std::uint64_t>(at.workers);
      pos_.batch_in_epoch = 0;
      pos_.epoch_start = served;
      if (served >= train.size()) {
        ++pos_.epoch;
        pos_.epoch_start = 0;
      }
    }
  }
  sampler.start_at(pos_.epoch, static_cast<std::size_t>(pos_.epoch_start));
  sampler.set_epoch(pos_.epoch);
  const int k = cfg.trainer.accumulate_steps;
  const int prefetch = cores_scarce ? 0 : cfg.data.prefetch;  // 0: no loader thread
  res_.loader = std::make_unique<ShardLoader>(
      run_.fault.loader_data(run_.train, global_, pos_.step, static_cast<std::size_t>(k * batch)),
      sampler, batch, cfg.data.drop_last, prefetch, pos_.batch_in_epoch);
  if (rank_ == 0) run_.summary.loader = prefetch == 0 ? "inline" : "thread";
  // As wide as the logits: a GPT's padded vocabulary (Note [Padded vocabulary], model/gpt.cpp).
  const int logits = run_.model.outputs();
  if (!res_.replica->fuses_loss())
    res_.dlogits = DeviceArray<float>(*res_.device, static_cast<std::size_t>(logits) * batch);
  // Workspaces sized before the first step, which then allocates nothing (Note [Host syncs]):
  // rows of predictions, each no wider than the widest activation per prediction.
  const int targets = std::max(1, train.targets());
  res_.device->reserve_workspace(batch * train.targets(),
                                 std::max(logits, run_.model.max_width()) / targets);
  res_.batches = std::make_unique<StagedBatches>(
      *res_.device, *res_.loader, static_cast<std::size_t>(batch) * train.features() * sizeof(float),
      static_cast<std::size_t>(batch) * train.targets() * sizeof(std::int32_t),
      train.packed() ? static_cast<std::size_t>(batch) * train.features() * sizeof(std::int32_t)
                        : 0,
      (run_.total_steps - pos_.step) * k, track_);
}

// ---- The step -----------------------------------------------------------------------------------

void WorkerLoop::run(Backend& backend) {
  enter(Phase::set_up);
  set_up(backend);
  warm_up();
  const int k = run_.cfg.trainer.accumulate_steps;
  times_.loop_start_s = steady_now_s();
  window_.last_report_s = times_.loop_start_s;
  window_.last_step_s = times_.loop_start_s;
  if (global_ == 0)  // Summary::step_tokens_per_s, without growing inside a step
    window_.step_rates.reserve(
        static_cast<std::size_t>(std::max<std::int64_t>(0, run_.total_steps - pos_.step)));
  window_.steps.reserve(static_cast<std::size_t>(
      std::clamp<std::int64_t>(run_.cfg.trainer.log_every, 1, std::max<std::int64_t>(1, run_.total_steps)) + 1));
  if (run_.carried_window) carry_window(*run_.carried_window);
  while (pos_.step < run_.total_steps) {
    begin_step();
    StepTotals mine;
    bool stop = false;
    // The step before is closed during micro-batch 0 (Note [Deferred step read]).
    for (int micro = 0; micro < k && !stop; ++micro) stop = !run_micro_batch(micro, mine);
    if (stop) break;
    beat();
    enter(Phase::all_reduce);  // starting it, or running it inline
    res_.reducer->launch_remaining();
    // Without overlap no bucket left during backward: the all-reduce fault strikes here.
    lose_device_in_all_reduce();
    reduce_and_update();
    run_.fault.lose_device(global_, pos_.step, Fault::Phase::update);
    queue_end(mine);
    if (!defers_read(pos_.step) && close_step(/*deferred=*/false)) break;
  }
  beat();
  enter(Phase::finish);
  finish();
}

// Note [Warm-up] in worker_loop.hpp. A progress point first, so that set-up and warm-up each
// have the step timeout, as set-up and step 1 had.
void WorkerLoop::warm_up() {
  if (!run_.callbacks.hooks.warm_up) return;
  beat();
  enter(Phase::warm_up);
  TraceSpan span(track_, "warm-up");
  Reducer& reducer = *res_.reducer;
  res_.replica->warm_up(run_.cfg.data.batch_size,
                        reducer.shards_gradients()
                            ? GradientTarget([&reducer](std::size_t l) {
                                return reducer.warm_up_target(l);
                              })
                            : GradientTarget());
  warm_up_step_tail(*res_.device, run_.cfg.optimizer, res_.replica->params_bf16() != nullptr);
}

// The state the next step starts from is now final: a survivor aborted from here to that
// step's update holds it (Note [Shrink] in recovery.hpp; a peer may leave the end-of-step
// barrier, begin the next step and fail there while this worker is still in the barrier).
void WorkerLoop::mark_step_start() {
  step_start_ = StepStart{.pos = pos_, .optimizer_steps = res_.optimizer->steps_taken()};
}

// The gradients are zeroed in micro-batch 0, once the step before is read (Note [Deferred step
// read]).
void WorkerLoop::begin_step() {
  if (!pending_) mark_step_start();  // else once the step before is read (close_step)
  ++pos_.step;
  beat();
  const double now = steady_now_s();
  busy_.begin_step(pos_.step, now);
  res_.graphs->begin_step(pos_.step, now, comm_);
  res_.device->mark_step(/*end=*/false);
  syncs_.at_step_start = res_.device->host_syncs();
  syncs_.other_step = 0;
  res_.reducer->reset();
  res_.records[pos_.step % 2]->reset();
}

// A step's host syncs (Note [Host syncs] in device.hpp; counted as Note [Deferred step read]
// says). The first step of a run is not steady: the summary reports the most of any later step.
void WorkerLoop::count_host_syncs(std::uint64_t n) {
  if (syncs_.steps++ == 0)
    syncs_.first = n;
  else
    syncs_.steady_max = std::max(syncs_.steady_max, n);
}

// Note [Global token mean]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The loss of a step is the mean over the labels that count (not kIgnoreLabel) of the whole
// global batch: every worker's k micro-batches. Its gradient is sum(dloss) / C, C the global
// count. The reducer averages the workers' gradients (a sum over N ranks, divided by N), so
// each worker's loss kernel scales its rows by N / C: sum_w (N / C) g_w / N = sum(dloss) / C,
// whatever the mask's shape and however the counted labels fall among workers and
// micro-batches. C is known before the step's first forward: each worker counts the labels of
// its k micro-batches on the host (StagedBatches::counted_ahead reads ahead of the loader as
// far as it must) and one host all-reduce sums them. Unmasked data needs none of it: C = N B T
// k on every step, and N / C rounds to the 1 / (B T k) of every worker's own mean.
// A per-worker mean (each worker dividing by its own count, the all-reduce then averaging the
// means) would weigh a label of a worker with few counted labels more than one of a worker with
// many: N workers x batch B would then train on another loss than 1 worker x batch N B, which
// sees the same labels in one mean (tests/train/test_chat_trainer.cpp shows it cannot pass).
// Accumulation is the same argument over micro-batches. The scale differs from step to step, so
// device graphs are off for masked data (their captured loss would keep the first step's).

// The gradient scale of this step's loss (Note [Global token mean]): the first micro-batch
// counts the step's labels, which the rest reuse.
float WorkerLoop::loss_scale(int micro, const Batch& b) {
  const int k = run_.cfg.trainer.accumulate_steps;
  const int targets = run_.train->targets();
  if (!run_.train->masks_targets()) return 1.0f / static_cast<float>(b.size * targets * k);
  if (micro == 0) {
    double counted[1] = {static_cast<double>(b.counted + res_.batches->counted_ahead(k - 1))};
    comm_.all_reduce_host(counted);
    step_counted_ = counted[0];
  }
  return step_counted_ > 0.0
             ? static_cast<float>(comm_.size()) / static_cast<float>(step_counted_)
             : 0.0f;
}

// Forward, loss and backward of one micro-batch: its loss and correct count go to the step
// record on the device, its samples to `mine`. Micro-batch 0 closes the step before between its
// forward and its backward (Note [Deferred step read]); false: the run stops there.
bool WorkerLoop::run_micro_batch(int micro, StepTotals& mine) {
  const int k = run_.cfg.trainer.accumulate_steps;
  const int targets = run_.train->targets(), classes = run_.model.outputs() / targets;
  Device& dev = *res_.device;
  Replica& replica = *res_.replica;
  const StagedBatches::Staged& in = res_.batches->take();
  const Batch& b = in.batch;
  // Where the next batch comes from, for checkpoints.
  pos_.epoch = b.epoch;
  pos_.epoch_start = b.epoch_start;
  pos_.batch_in_epoch = b.index_in_epoch + 1;
  if (b.last_in_epoch) {
    ++pos_.epoch;
    pos_.epoch_start = 0;
    pos_.batch_in_epoch = 0;
  }
  enter(Phase::forward);
  if (run_.callbacks.hooks.before_forward) run_.callbacks.hooks.before_forward(global_, pos_.step);
  run_.fault.before_forward(global_, pos_.step, comm_, dev);
  run_.fault.lose_device(global_, pos_.step, Fault::Phase::forward);
  // An LM head fused with the loss: forward stops below it; the head, the loss and the head's
  // backward run a chunk of rows at a time at the start of backward, once the gradients are
  // zeroed (Note [Chunked classifier] in src/model/lm_head.cpp). Other models: the logits,
  // the loss and its gradient here.
  const bool fused = replica.fuses_loss();
  const float* x = in.x->data<float>();
  const std::int32_t* y = in.y->data<std::int32_t>();
  LossStats* loss = res_.records[pos_.step % 2]->loss();
  // The mean over the global batch's counted labels (Note [Global token mean]); a language
  // model predicts `targets` tokens per sample.
  const int predictions = b.size * targets;
  const float grad_scale = loss_scale(micro, b);
  replica.set_positions(in.positions ? in.positions->data<std::int32_t>() : nullptr);
  // This micro-batch's masks (Note [LoRA dropout]), set again before backward: closing the step
  // before, between the two, may evaluate, which drops nothing.
  const std::uint64_t masks = run_.cfg.model.lora.dropout > 0.0
                                  ? dropout_key(run_.cfg.trainer.seed, pos_.step, micro, global_)
                                  : 0;
  replica.set_dropout_key(masks);
  StepGraphs& graphs = *res_.graphs;  // Note [Step graphs]: each part captured, replayed or not
  {
    TraceSpan span(track_, "forward", pos_.step);
    const auto forward = [&](const StepGraphs::Layer&) {
      if (fused) {
        replica.forward_hidden(x, b.size);
      } else {
        const float* logits = replica.forward(x, b.size);
        dev.softmax_cross_entropy(logits, y, predictions, classes, res_.dlogits.data(),
                                  grad_scale, loss);
      }
    };
    graphs.run({.part = StepGraphs::Part::forward,
                .input = x,
                .labels = fused ? nullptr : y,
                .record = fused ? nullptr : loss,
                .batch = b.size},
               forward, nullptr, nullptr);
  }
  mine.samples += b.size;
  mine.counted += static_cast<double>(b.counted);
  if (micro == 0) {
    beat();  // the first forward is queued: a worker stalled before it is the one behind
    if (pending_ && close_step(/*deferred=*/true)) return false;
    replica.zero_grads();
  }
  replica.set_dropout_key(masks);
  // Gradients accumulate over the micro-batches; only the last one is reduced (no_sync).
  const bool last_micro = micro == k - 1;
  backward_.inject_nan = last_micro && run_.fault.at(global_, pos_.step, Fault::Kind::nan);
  backward_.layer_start_s = steady_now_s();
  enter(Phase::backward, last_micro ? 0 : -1);
  if (last_micro) run_.fault.lose_device(global_, pos_.step, Fault::Phase::backward);
  TraceSpan span(track_, "backward", pos_.step);
  // A captured backward ends a graph where the reducer starts a bucket (Note [Step graphs]).
  Reducer::DryRun dry;
  if (graphs.active()) dry = res_.reducer->dry_run();
  graphs.run({.part = StepGraphs::Part::backward,
              .input = x,
              .labels = fused ? y : nullptr,
              .record = fused ? loss : nullptr,
              .batch = b.size,
              .reports_layers = last_micro},
             [&](const StepGraphs::Layer& report) {
               if (fused)
                 replica.head_loss(b.size, {.labels = y, .grad_scale = grad_scale, .stats = loss},
                                   /*gradients=*/true, gradient_target());
               replica.backward(x, fused ? nullptr : res_.dlogits.data(), b.size, report,
                                gradient_target());
             },
             last_micro ? StepGraphs::Layer([this](std::size_t layer) { grads_ready(layer); })
                        : nullptr,
             [&](std::size_t layer) { return res_.reducer->dry_layer_ready(dry, layer); });
  return true;
}

GradientTarget WorkerLoop::gradient_target() {
  if (!res_.reducer->shards_gradients()) return {};
  return [&reducer = *res_.reducer](std::size_t layer) { return reducer.gradient_target(layer); };
}

// Backward reports each layer; the reducer starts a bucket's all-reduce once it is full.
void WorkerLoop::grads_ready(std::size_t layer) {
  if (track_) {
    const double now = steady_now_s();
    track_->push_back({fmt::format("backward layers.{}", layer), backward_.layer_start_s, now, {}});
    backward_.layer_start_s = now;
  }
  if (backward_.inject_nan) {
    res_.device->fill(res_.reducer->shards_gradients()
                          ? res_.reducer->gradient_target(layer)
                          : res_.replica->grads() + run_.model.param_offset(layer),
                      std::numeric_limits<float>::quiet_NaN(), 1);
    backward_.inject_nan = false;
  }
  Reducer& reducer = *res_.reducer;
  reducer.layer_ready(layer);
  if (reducer.launched() > 0) lose_device_in_all_reduce();
  if (reducer.launched() < reducer.buckets().size())
    enter(Phase::backward, static_cast<int>(reducer.launched()));
}

// The lost:all-reduce fault: the device dies once the buckets it has handed over have landed
// (with overlap the first, else all), so that what the survivors hold does not depend on
// whether its communication thread beat its abort (Note [Shrink] in recovery.hpp, step 2).
void WorkerLoop::lose_device_in_all_reduce() {
  if (!run_.fault.loses(global_, pos_.step, Fault::Phase::all_reduce)) return;
  for (std::size_t i = 0; i < res_.reducer->launched(); ++i) res_.reducer->wait(i);
  run_.fault.lose_device(global_, pos_.step, Fault::Phase::all_reduce);
}

// Metrics and the stop decision, agreed by every rank once the step's record is read.
StepTotals WorkerLoop::agree_totals(StepTotals mine) {
  mine.stop = run_.stop_requested.load() ? 1.0 : 0.0;
  const StepTotals totals = all_reduce_fields(comm_, mine);
  pos_.samples += static_cast<std::int64_t>(totals.samples);
  pos_.loss_tokens += static_cast<std::int64_t>(totals.counted);
  return totals;
}

// Waits for each bucket's reduction and queues the optimiser step, then the copy of the step
// record to the host, which close_step reads (Note [One read per step] in step_record.hpp). Each
// bucket is updated as it lands when updates_per_bucket(), reading its own skip flag;
// otherwise after the global norm, the update kernels reading the clip factor and the skip flag
// from the device.
void WorkerLoop::reduce_and_update() {
  const Config& cfg = run_.cfg;
  TraceSpan span(track_, "optimizer", pos_.step);
  Reducer& reducer = *res_.reducer;
  StepRecord& record = *res_.records[pos_.step % 2];
  const double lr = learning_rate(cfg.optimizer, cfg.schedule, pos_.step - 1, run_.total_steps);
  const bool per_bucket = updates_per_bucket();
  fence_snapshot();
  if (per_bucket) res_.optimizer->begin_step();
  for (std::size_t i = 0; i < reducer.buckets().size(); ++i) {
    enter(Phase::all_reduce, static_cast<int>(i));
    if (const double blocked = reducer.wait(i); track_ && blocked > 0.0) {
      const double now = steady_now_s();
      track_->push_back({fmt::format("wait bucket {}", i), now - blocked, now, {}});
    }
    enter(Phase::optimizer);
    reducer.sum_grain_squares(i, *res_.device, record.grain_sums());
    if (per_bucket) {
      // The bucket's own skip flag (Note [Deferred step read]): no clipping, so no clip factor.
      const ShardRange grains = reducer.shard_grains(i);
      res_.device->step_control(record.grain_sums() + grains.begin, grains.size(), 0.0,
                                record.bucket_control(i));
      update_bucket(i, lr, record.bucket_control(i));
    }
  }
  reducer.share_grain_sums(record.grain_sums());  // ZeRO-1: Note [ZeRO-1]
  res_.device->step_control(record.grain_sums(), record.grains(), cfg.optimizer.clip_grad_norm,
                            record.control());
  if (!per_bucket) {
    res_.optimizer->begin_step();
    for (std::size_t i = 0; i < reducer.buckets().size(); ++i)
      update_bucket(i, lr, record.control());
  }
  res_.device->mark_step(/*end=*/true);
  record.start_read();
  gather_parameters();
  beat();
}

// The step's work is queued: what is left of it waits for its record (Note [Deferred step read]).
void WorkerLoop::queue_end(const StepTotals& mine) {
  pending_ = Pending{.end = pos_,
                     .mine = mine,
                     .record = res_.records[pos_.step % 2].get(),
                     .host_syncs = res_.device->host_syncs() - syncs_.at_step_start -
                                   syncs_.other_step,
                     .read = std::nullopt};
}

// Whether step `step`'s record may be read during the next step: a next step follows, and
// nothing at the step's end needs the device's state (Note [Deferred step read]).
bool WorkerLoop::defers_read(std::int64_t step) const {
  const TrainerConfig& tc = run_.cfg.trainer;
  const auto every = [step](std::int64_t n) { return n > 0 && step % n == 0; };
  return run_.callbacks.hooks.defer_read && step < run_.total_steps && !every(tc.eval_every) &&
         !every(tc.check_replicas_every) && !(snapshots() && every(tc.snapshot_every)) &&
         !(!tc.checkpoint.dir.empty() && every(tc.checkpoint.every_steps));
}

// Reads the pending step's record and does what is left of the step: its totals, the
// non-finite policy, its report and its end. While the next step is queued (`deferred`), the
// functions it calls see the pending step's position, as at its own end. True: the run stops
// at that step.
bool WorkerLoop::close_step(bool deferred) {
  const Pending step = *pending_;
  const Position queued = pos_;
  pos_ = step.end;
  if (deferred) beat();  // the watchdog names the step being closed
  const std::uint64_t syncs_before = res_.device->host_syncs();
  const StepRecord::Host record = step.record->read();
  pending_->read = record;
  count_host_syncs(step.host_syncs + res_.device->host_syncs() - syncs_before);
  busy_.step_read(pos_.step, res_.device->device_step_seconds());
  if (!updates_per_bucket() && record.control.skip) res_.optimizer->cancel_step();
  check_labels(record.loss, run_.train->classes(),
               fmt::format("training data, step {}, a micro-batch", pos_.step));
  StepTotals mine = step.mine;
  mine.loss_sum = record.loss.loss_sum;
  mine.correct = static_cast<double>(record.loss.correct);
  enter(Phase::totals);
  const StepTotals totals = agree_totals(mine);
  pending_.reset();  // agreed: a recovery now goes on from the step's end (Note [Shrink])
  mark_step_start();
  const bool stop_now = totals.stop > 0.0;
  const UpdateResult update = after_update(totals, record.control);
  enter(Phase::report);
  report(totals, update, stop_now);
  end_of_step(stop_now);
  if (stop_now) {
    stopped_ = pos_.step < run_.total_steps;
    if (rank_ == 0) run_.summary.stopped_early = stopped_;
    return true;
  }
  if (deferred) {
    syncs_.other_step += res_.device->host_syncs() - syncs_before;
    const std::int64_t samples = pos_.samples, loss_tokens = pos_.loss_tokens;
    pos_ = queued;
    pos_.samples = samples;
    pos_.loss_tokens = loss_tokens;
    beat();
    enter(Phase::forward);
  }
  return false;
}

// What the host does once the step's record is read and its totals agreed: the metrics, and the
// non-finite policy (trainer.on_nonfinite). The loss and the norm are the same on every rank, so
// every rank decides the same.
WorkerLoop::UpdateResult WorkerLoop::after_update(const StepTotals& totals,
                                                  const StepControl& control) {
  const Config& cfg = run_.cfg;
  UpdateResult r;
  r.loss = totals.counted > 0.0 ? totals.loss_sum / totals.counted : 0.0;
  r.lr = learning_rate(cfg.optimizer, cfg.schedule, pos_.step - 1, run_.total_steps);
  r.grad_norm = control.grad_norm;
  if (!std::isfinite(r.grad_norm) || !std::isfinite(r.loss))
    on_nonfinite(r.loss, r.grad_norm, !updates_per_bucket() && control.skip);
  else
    skips_in_row_ = 0;
  if (run_.callbacks.hooks.after_update)
    run_.callbacks.hooks.after_update(global_, pos_.step, *res_.replica);
  return r;
}

// ZeRO-1: waits for the all-gathers of the updated shards; every replica is whole again. The
// optimiser wrote the bf16 copy of no shard, so it is refreshed whole, in one pass (Note [bf16
// compute] in src/model/ops.hpp).
void WorkerLoop::gather_parameters() {
  if (!zero()) return;
  TraceSpan span(track_, "all-gather wait", pos_.step);
  res_.reducer->wait_gathers();
  res_.replica->refresh_bf16();
}

// Updating each bucket as soon as it lands is only possible when nothing must be decided about
// the whole gradient first: no clipping, and no update to drop on a non-finite norm.
bool WorkerLoop::updates_per_bucket() const {
  return run_.cfg.optimizer.clip_grad_norm <= 0.0 &&
         run_.cfg.trainer.on_nonfinite == NonfinitePolicy::stop;
}

// The optimiser step on this rank's part of bucket i (all of it without ZeRO), reading the clip
// factor and the skip flag from `control` on the device (null: neither); with ZeRO-1 then the
// all-gather that brings every rank's updated shard of it.
void WorkerLoop::update_bucket(std::size_t i, double lr, const StepControl* control) {
  Replica& replica = *res_.replica;
  const ShardRange mine = res_.reducer->shard(i);
  step_start_->updating = true;  // the state at the step's start is gone from here on
  // Without ZeRO the step writes the bf16 copy too; with it, gather_parameters() does.
  if (mine.size() > 0)
    res_.optimizer->apply_at(replica.params(), res_.reducer->shard_gradients(i), lr, mine.begin,
                             mine.end, control, zero() ? nullptr : replica.params_bf16());
  if (zero()) res_.reducer->start_gather(i, replica.params());
}

// A non-finite loss or gradient (trainer.on_nonfinite): stop, or count the skipped update, up
// to max_nonfinite_skips in a row. The device skipped it for a non-finite norm; a non-finite
// loss with a finite norm (which Note [One read per step] rules out) was applied, so it stops.
void WorkerLoop::on_nonfinite(double loss, double grad_norm, bool skipped) {
  const TrainerConfig& tc = run_.cfg.trainer;
  if (tc.on_nonfinite == NonfinitePolicy::stop || !skipped) report_nonfinite(loss, grad_norm);
  ++skips_in_row_;
  if (rank_ == 0) ++run_.summary.nonfinite_skips;
  if (skips_in_row_ >= tc.max_nonfinite_skips)
    throw std::runtime_error(fmt::format(
        "{} steps in a row had a non-finite loss or gradient (the last at step {}); stopping "
        "(trainer.max_nonfinite_skips: {})",
        skips_in_row_, pos_.step, tc.max_nonfinite_skips));
}

void WorkerLoop::report_nonfinite(double loss, double grad_norm) {
  const Config& cfg = run_.cfg;
  if (!std::isfinite(loss))
    throw std::runtime_error(fmt::format("non-finite loss ({}) at step {} (trainer.on_nonfinite: {})",
                                         loss, pos_.step, to_string(cfg.trainer.on_nonfinite)));
  // ZeRO-1: each rank holds only its shards of the averaged gradient; gather the rest (every
  // rank is here, as every rank saw the same norm). ZeRO-2 has no whole buffer to gather into:
  // one is allocated here, on the way out of the run.
  Reducer& reducer = *res_.reducer;
  DeviceArray<float> whole;
  float* gathered = res_.replica->grads();
  if (reducer.shards_gradients()) {
    whole = DeviceArray<float>(*res_.device, res_.replica->param_count());
    gathered = whole.data();
    for (std::size_t i = 0; i < reducer.buckets().size(); ++i)
      if (const ShardRange mine = reducer.shard(i); mine.size() > 0)
        res_.device->copy(gathered + mine.begin, reducer.shard_gradients(i),
                          mine.size() * sizeof(float));
  }
  if (zero())
    for (const Bucket& b : reducer.buckets())
      comm_.all_gather(gathered + b.begin, b.end - b.begin, kZeroGrain);
  // Name the first tensor, in forward order, whose averaged gradient is not finite.
  const std::vector<float> grads =
      reducer.shards_gradients() ? whole.download() : res_.replica->gradients();
  std::string where = "?";
  for (const ParamTensor& t : run_.model.param_tensors()) {
    const auto begin = grads.begin() + static_cast<std::ptrdiff_t>(t.offset);
    if (std::any_of(begin, begin + static_cast<std::ptrdiff_t>(t.numel()),
                    [](float g) { return !std::isfinite(g); })) {
      where = t.name;
      break;
    }
  }
  throw std::runtime_error(fmt::format(
      "non-finite gradient at step {}: global norm {}, first in {} (trainer.on_nonfinite: {})",
      pos_.step, grad_norm, where, to_string(cfg.trainer.on_nonfinite)));
}

// The callbacks: every step's progress, and the log window's metrics every log_every steps.
void WorkerLoop::report(const StepTotals& totals, const UpdateResult& update, bool stop_now,
                        bool carried) {
  const std::int64_t step = pos_.step, total_steps = run_.total_steps;
  const int targets = run_.train->targets();
  window_.steps.push_back({.step = step,
                           .loss_sum = totals.loss_sum,
                           .correct = totals.correct,
                           .samples = totals.samples,
                           .counted = totals.counted,
                           .grad_norm = update.grad_norm});
  // Loss and accuracy over the `predictions` that count; throughput: `counted` samples in
  // `seconds`.
  const auto metrics = [&](double loss_sum, double correct, double predictions, double counted,
                           double seconds, double now) {
    predictions = std::max(predictions, 1.0);
    const double tokens_per_s = counted * targets / std::max(1e-9, seconds);
    return StepMetrics{.step = step,
                       .total_steps = total_steps,
                       .epoch = pos_.epoch,
                       .loss = loss_sum / predictions,
                       .accuracy = correct / predictions,
                       .lr = update.lr,
                       .grad_norm = update.grad_norm,
                       .samples_per_s = counted / std::max(1e-9, seconds),
                       .tokens_per_s = tokens_per_s,
                       .mfu = run_.mfu(tokens_per_s),
                       .elapsed_s = now - run_.start_s};
  };
  if (global_ == 0 && !carried) {  // Summary::step_tokens_per_s
    const double now = steady_now_s();
    window_.step_rates.push_back(totals.samples * targets /
                                 std::max(1e-9, now - window_.last_step_s));
    window_.last_step_s = now;
  }
  if (global_ == 0 && (run_.callbacks.progress || run_.report)) {
    const double now = steady_now_s();
    const StepMetrics m = metrics(totals.loss_sum, totals.correct, totals.counted,
                                  static_cast<double>(pos_.samples), now - run_.start_s, now);
    if (run_.report) run_.report->step(m);
    if (run_.callbacks.progress) run_.callbacks.progress(m);
  }
  const bool log = step % run_.cfg.trainer.log_every == 0 || step == total_steps || stop_now;
  if (rank_ == 0 && log) {
    const double now = steady_now_s();
    // The window's sums, in the order its steps were reported.
    double loss_sum = 0.0, correct = 0.0, samples = 0.0, counted = 0.0;
    for (const WindowStep& w : window_.steps) {
      loss_sum += w.loss_sum;
      correct += w.correct;
      samples += w.samples;
      counted += w.counted;
    }
    window_.last = metrics(loss_sum, correct, counted, samples, now - window_.last_report_s, now);
    window_.last_report_s = now;
    add_window_times(window_.last);
    if (global_ == 0 && run_.metrics) run_.metrics->write(window_.last);
    if (global_ == 0 && run_.callbacks.step) run_.callbacks.step(window_.last);
  }
  if (log) window_.steps.clear();
}

// Note [Window across a shrink] in recovery.hpp: the failed group's window, in the order its
// steps were reported (so a line sums them as a run without the loss would), then the unagreed
// step, the state this loop starts from (pos_), reported now.
void WorkerLoop::carry_window(const CarriedWindow& w) {
  if (w.agreed.empty() && !w.unagreed) return;
  window_.last_report_s = w.start_s;
  window_.steps.insert(window_.steps.end(), w.agreed.begin(), w.agreed.end());
  if (!w.unagreed) return;
  const WindowStep& u = *w.unagreed;
  const StepTotals totals{.loss_sum = u.loss_sum,
                          .correct = u.correct,
                          .samples = u.samples,
                          .counted = u.counted,
                          .stop = 0.0};
  const Config& cfg = run_.cfg;
  const UpdateResult update{
      .loss = u.counted > 0.0 ? u.loss_sum / u.counted : 0.0,
      .lr = learning_rate(cfg.optimizer, cfg.schedule, u.step - 1, run_.total_steps),
      .grad_norm = u.grad_norm};
  if (u.step != pos_.step)
    throw std::logic_error(fmt::format("carry_window: the unagreed step {} is not step {}, where "
                                       "the survivors start", u.step, pos_.step));
  report(totals, update, /*stop_now=*/false, /*carried=*/true);
}

// This worker's all-reduce and data-wait times since the last report, into `m`.
void WorkerLoop::add_window_times(StepMetrics& m) {
  res_.reducer->collect_timings();
  const double comm_s = res_.reducer->comm_seconds(), exposed_s = res_.reducer->exposed_seconds(),
               wait_s = res_.batches->data_wait_s();
  const double comm = comm_s - window_.comm_s, exposed = exposed_s - window_.exposed_s;
  m.comm_hidden_fraction = comm > 0.0 ? std::clamp(1.0 - exposed / comm, 0.0, 1.0) : 0.0;
  m.data_wait_s = wait_s - window_.data_wait_s;
  window_.comm_s = comm_s;
  window_.exposed_s = exposed_s;
  window_.data_wait_s = wait_s;
}

// Eval, replica check, barrier and checkpoint: what closes a step, in the same order everywhere.
void WorkerLoop::end_of_step(bool stop_now) {
  const TrainerConfig& tc = run_.cfg.trainer;
  const std::int64_t step = pos_.step;
  if (tc.eval_every > 0 && step % tc.eval_every == 0 && step != run_.total_steps && !stop_now) {
    enter(Phase::eval);
    TraceSpan span(track_, "eval", pos_.step);
    evaluate();
  }
  if (tc.check_replicas_every > 0 && step % tc.check_replicas_every == 0) {
    enter(Phase::replica_check);
    TraceSpan span(track_, "replica check", pos_.step);
    check_replicas();
  }
  // Note [Snapshots]: a snapshot step's barrier also makes the previous snapshot complete.
  const std::int64_t every = tc.snapshot_every;
  poll_snapshot(/*wait=*/snapshots() && step % every == 0);
  {
    enter(Phase::end_of_step);
    TraceSpan span(track_, "barrier", pos_.step);
    const double t0 = steady_now_s();
    comm_.barrier();
    times_.barrier_wait_s += steady_now_s() - t0;
  }
  checkpoint_if_due(stop_now);
  snapshot_if_due();
  run_.fault.at_end_of_step(global_, step);
}

// Global rank 0 writes after the step's barrier: every replica has taken the update. With
// ZeRO-1 every rank first takes part in gathering the optimiser state.
void WorkerLoop::checkpoint_if_due(bool stop_now) {
  const CheckpointConfig& cc = run_.cfg.trainer.checkpoint;
  const std::int64_t step = pos_.step;
  const bool due = !cc.dir.empty() && (stop_now || step == run_.total_steps ||
                                       (cc.every_steps > 0 && step % cc.every_steps == 0));
  if (!due || (!zero() && global_ != 0)) return;
  enter(Phase::checkpoint);
  TraceSpan span(track_, "checkpoint", pos_.step);
  std::vector<StateVector> state = gather_optimizer_state();
  if (global_ == 0 && run_.checkpoints) save_checkpoint(std::move(state));
}

// Note [Snapshots] in snapshot.hpp. Only where a recovery can use them: with shrink, in one
// process.
bool WorkerLoop::snapshots() const {
  const TrainerConfig& tc = run_.cfg.trainer;
  return tc.snapshot_every > 0 && tc.on_worker_failure == WorkerFailurePolicy::shrink &&
         comm_.size() == static_cast<int>(tc.devices.size());
}

// This worker's part of a snapshot: without ZeRO-1 an equal slice of the parameter buffer (in
// whole grains, so that each copy starts aligned), with it the shards its optimiser owns.
std::vector<SnapshotRange> WorkerLoop::snapshot_ranges() const {
  const std::size_t n = res_.replica->param_count();
  if (!zero()) {
    const ShardRange r = shard_range(n, comm_.size(), global_, kZeroGrain);
    if (r.size() == 0) return {};
    return {{.begin = r.begin, .end = r.end, .state_at = r.begin}};
  }
  std::vector<SnapshotRange> ranges;
  const std::vector<ShardRange>& owned = res_.optimizer->owned();
  for (std::size_t i = 0; i < owned.size(); ++i)
    if (owned[i].size() > 0)
      ranges.push_back(
          {.begin = owned[i].begin, .end = owned[i].end, .state_at = res_.optimizer->state_offset(i)});
  return ranges;
}

// After the step's barrier: this worker's copy of its part of the state, started and not
// waited for. Local worker 0 describes the snapshot.
void WorkerLoop::snapshot_if_due() {
  if (!snapshots() || pos_.step % run_.cfg.trainer.snapshot_every != 0) return;
  enter(Phase::checkpoint);
  TraceSpan span(track_, "snapshot", pos_.step);
  Device& dev = *res_.device;
  const std::vector<SnapshotRange> ranges = snapshot_ranges();
  const std::vector<const float*> state = res_.optimizer->state_data();
  std::optional<Checkpoint> skeleton;
  if (rank_ == 0) {
    skeleton = describe_state(pos_, res_.optimizer->steps_taken());
    for (const std::string& name : res_.optimizer->state_names())
      skeleton->optimizer_state.push_back({name, {}});
  }
  float* host = run_.snapshot.begin_part(
      rank_, pos_.step, ranges, state.size(),
      [&dev](std::size_t bytes) { return dev.allocate_host(bytes); }, std::move(skeleton));
  run_.heartbeats.alive(rank_);  // memory may have been allocated: pinned, it takes a while
  const std::size_t elements = SnapshotSlot::part_floats(ranges, 0);
  std::vector<Transfer> copies;
  std::size_t at = 0;
  for (const SnapshotRange& r : ranges) {
    const std::size_t bytes = r.size() * sizeof(float);
    copies.push_back({host + at, res_.replica->params() + r.begin, bytes});
    for (std::size_t k = 0; k < state.size(); ++k)
      copies.push_back({host + (1 + k) * elements + at, state[k] + r.state_at, bytes});
    at += r.size();
  }
  res_.download->start(copies);
  snapshot_pending_ = pos_.step;
  snapshot_fence_ = true;
  poll_snapshot(/*wait=*/false);  // a device that copied in start() (the CPU) is done already
}

// Tells the slot once this worker's copy has landed: polled each step, waited for in a step
// that takes the next snapshot.
void WorkerLoop::poll_snapshot(bool wait) {
  if (snapshot_pending_ < 0) return;
  if (wait) res_.download->wait();
  if (!res_.download->done()) return;
  run_.snapshot.part_done(rank_, snapshot_pending_);
  snapshot_pending_ = -1;
}

// Before the first write of the copied memory, the optimiser's update: on the device, after the
// copy; the step's forward and backward have run beside it.
void WorkerLoop::fence_snapshot() {
  if (!snapshot_fence_) return;
  res_.download->fence();
  snapshot_fence_ = false;
}

// The optimiser state of the whole parameter buffer. With ZeRO-1 each rank holds its shards
// only: every rank places them in a buffer of the whole size and the buckets are all-gathered
// (the shard rule is per bucket), so the checkpoint holds the full tensors and resumes with any
// device count and either trainer.zero (Note [ZeRO-1]). That costs one whole-size buffer on
// each rank while it is written, the price of a checkpoint that does not depend on the sharding.
std::vector<StateVector> WorkerLoop::gather_optimizer_state() {
  std::vector<StateVector> state = res_.optimizer->state();
  if (!zero()) return state;
  const std::size_t n = res_.replica->param_count();
  DeviceArray<float> whole(*res_.device, n);
  std::vector<float> host(n, 0.0f);
  for (StateVector& v : state) {
    auto next = v.values.begin();
    for (const ShardRange& r : res_.optimizer->owned()) {
      std::copy_n(next, r.size(), host.begin() + static_cast<std::ptrdiff_t>(r.begin));
      next += static_cast<std::ptrdiff_t>(r.size());
    }
    whole.upload(host);
    run_.heartbeats.alive(rank_);
    for (const Bucket& b : res_.reducer->buckets())
      comm_.all_gather(whole.data() + b.begin, b.end - b.begin, kZeroGrain);
    v.values = whole.download();
  }
  return state;
}

EvalMetrics WorkerLoop::evaluate() {
  // Global rank r evaluates samples r, r + n, ...: every sample exactly once, no padding.
  LossTotals mine;
  if (run_.eval)
    mine = loss_totals(*res_.replica, *run_.eval, static_cast<std::size_t>(global_),
                       static_cast<std::size_t>(comm_.size()), run_.cfg.data.batch_size,
                       [this] { run_.heartbeats.alive(rank_); });
  const EvalMetrics m =
      eval_metrics(all_reduce_fields(comm_, mine), pos_.step);
  if (global_ == 0 && m.samples > 0) {
    if (run_.metrics) run_.metrics->write(m);
    if (run_.report) run_.report->eval(m);
    if (run_.callbacks.eval) run_.callbacks.eval(m);
  }
  return m;
}

void WorkerLoop::check_replicas() {
  Replica& replica = *res_.replica;
  const std::uint64_t mine = replica.device().hash(replica.params(), replica.param_count());
  const std::vector<std::uint64_t> all = comm_.all_gather_host(mine);
  for (int r = 1; r < comm_.size(); ++r) {
    if (all[r] != all[0])
      throw std::runtime_error(fmt::format(
          "replicas diverged at step {}: rank 0 parameter hash {:016x}, rank {} {:016x}",
          pos_.step, all[0], r, all[r]));
  }
  if (rank_ == 0) {
    ++run_.summary.replica_checks;
    run_.summary.param_hash = mine;
  }
}

Checkpoint WorkerLoop::describe_state(const Position& at, std::int64_t optimizer_steps) const {
  const Config& cfg = run_.cfg;
  Checkpoint ckpt;
  ckpt.tensors = run_.model.param_tensors();
  // What it takes to rebuild the model and prepare its inputs: `lockstep sample` and `eval`,
  // an export's reader.
  ckpt.metadata["lockstep.model"] = describe_model(cfg, *run_.train);
  if (!run_.base.empty()) {  // Note [LoRA] in src/model/lora.cpp
    ckpt.metadata["lockstep.lora"] = describe_lora(cfg.model);
    ckpt.metadata["lockstep.lora_base"] = base_hash(run_.base);
    ckpt.metadata["lockstep.lora_base_source"] = std::string(run_.base_source);
  }
  if (cfg.model.type == "gpt")
    ckpt.metadata["lockstep.tokenizer"] = cfg.data.dataset == DatasetKind::text ? "bytes" : "ids";
  for (const auto& [key, value] : run_.tokenizer_record) ckpt.metadata[key] = value;  // "bpe"
  if (!run_.train->feature_mean().empty())
    record_standardization(ckpt.metadata, run_.train->feature_mean(), run_.train->feature_std());
  const std::int64_t samples_before = run_.resume ? run_.resume->state.samples : 0;
  ckpt.state = {.step = at.step,
                .epoch = at.epoch,
                .batch_in_epoch = at.batch_in_epoch,
                .epoch_start = at.epoch_start,
                .samples = samples_before + at.samples,
                .config_hash = config_hash(cfg),
                .workers = comm_.size(),
                .optimizer = cfg.optimizer.type,
                .optimizer_steps = optimizer_steps,
                .seed = cfg.trainer.seed,
                .config = config_values(cfg)};
  return ckpt;
}

Checkpoint WorkerLoop::make_checkpoint(const Position& at, std::int64_t optimizer_steps,
                                       std::vector<StateVector> optimizer_state) const {
  Checkpoint ckpt = describe_state(at, optimizer_steps);
  ckpt.params = res_.replica->parameters();
  ckpt.optimizer_state = std::move(optimizer_state);
  return ckpt;
}

void WorkerLoop::save_checkpoint(std::vector<StateVector> optimizer_state) {
  Checkpoint ckpt =
      make_checkpoint(pos_, res_.optimizer->steps_taken(), std::move(optimizer_state));
  // Note [Watchdog]: a slow save is alive between its stages.
  const auto stage_done = [this] {
    run_.fault.during_save(global_, pos_.step);
    run_.heartbeats.alive(rank_);
  };
  // Trainer::saving_step(): a second SIGINT now leaves this step's checkpoint incomplete.
  struct Saving {
    std::atomic<std::int64_t>& step;
    ~Saving() { step.store(-1); }
  } saving{run_.saving_step};
  saving.step.store(pos_.step);
  run_.summary.last_checkpoint = run_.checkpoints->save(ckpt, stage_done).weights.string();
  if (run_.callbacks.checkpoint) run_.callbacks.checkpoint(pos_.step, run_.summary.last_checkpoint);
}

// Note [Survivor reads]
//   progress() and recovery_state() read the device (the parameters' hash, a deferred step
//   record whose read the abort cut short, the state's bytes) after the teardown meeting, when
//   the group is aborted: every wait_until of the device would throw CommAborted at once (Note
//   [Abortable waits] in lockstep/device.hpp), so a survivor on a GPU could report nothing and
//   the run stop (the H200, 2026-12-04: "worker 0 could not report its state", then "had not
//   read the record of step 19"; a CPU device never waits). By then its queue ends: drain() emptied the
//   comm stream, and the compute stream waits only on events of collectives that every rank
//   joined (the peer group's, Note [Peer all-reduce]) or on an aborted NCCL communicator's
//   kernels. So these reads wait, for trainer.stop_grace_s at most (a survivor whose queue
//   does not end within it reports nothing, and the run stops), and the group's abort is
//   back in force after them.
class WorkerLoop::SurvivorReads {
 public:
  SurvivorReads(Device& device, double grace_s) : device_(device) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(grace_s));
    device_.set_abort_check([deadline] { return std::chrono::steady_clock::now() > deadline; });
  }
  ~SurvivorReads() {
    device_.set_abort_check([] { return true; });  // the group stays aborted
  }
  SurvivorReads(const SurvivorReads&) = delete;
  SurvivorReads& operator=(const SurvivorReads&) = delete;

 private:
  Device& device_;
};

// Note [Shrink] in recovery.hpp, step 2. A step whose update is whole and whose record is
// read, but whose totals were never agreed (Note [Deferred step read]), counts as done where
// that record is finite and its update not skipped: the same on every replica.
SurvivorProgress WorkerLoop::progress() const {
  const SurvivorReads reads(*res_.device, run_.cfg.trainer.stop_grace_s);
  Replica& replica = *res_.replica;
  SurvivorProgress p{.updated = pos_.step,
                     .param_hash = replica.device().hash(replica.params(), replica.param_count()),
                     .lacks = {}};
  p.window = window_.steps;
  p.window_start_s = window_.last_report_s;
  if (pending_) {
    // A read that the abort cut short (a GPU's: its wait threw CommAborted) ends here; one that
    // cannot throws, and the survivor reports nothing.
    const StepRecord::Host read = pending_->read ? *pending_->read : pending_->record->read();
    p.updated = pending_->end.step;
    if (read.control.skip || !std::isfinite(read.control.grad_norm) ||
        read.loss.label_error != 0 || !std::isfinite(read.loss.loss_sum))
      p.lacks = fmt::format("had a non-finite or skipped update at step {}", p.updated);
    else  // Note [Window across a shrink] in recovery.hpp
      p.unagreed = WindowStep{.step = p.updated,
                              .loss_sum = read.loss.loss_sum,
                              .correct = static_cast<double>(read.loss.correct),
                              .samples = pending_->mine.samples,
                              .counted = pending_->mine.counted,
                              .grad_norm = read.control.grad_norm};
  } else if (!step_start_) {
    p.lacks = "had begun no step";
  } else {
    p.updated = step_start_->pos.step;
    if (step_start_->updating)
      p.lacks = fmt::format("had begun the update of step {}, so the state after step {} is gone",
                            p.updated + 1, p.updated);
  }
  return p;
}

// The parameters are those after progress().updated; so is the optimiser's state. A step
// closed or not: its position, with the group's samples of an unagreed one counted (every
// worker's batch has the same size), and its step count as the optimiser holds it; else the
// count recorded as the next step began (begin_step() of the optimiser may have counted it).
Checkpoint WorkerLoop::recovery_state() const {
  const SurvivorReads reads(*res_.device, run_.cfg.trainer.stop_grace_s);
  if (!pending_)
    return make_checkpoint(step_start_->pos, step_start_->optimizer_steps, res_.optimizer->state());
  Position end = pending_->end;
  end.samples += static_cast<std::int64_t>(pending_->mine.samples) * comm_.size();
  return make_checkpoint(end, res_.optimizer->steps_taken(), res_.optimizer->state());
}

// ---- Finish -------------------------------------------------------------------------------------

void WorkerLoop::finish() {
  // A stopped run ends now: the eval of a large model can take longer than the step did, and
  // whoever stopped it is waiting (Trainer::request_stop). Every rank agreed on stopped_.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EvalMetrics final_eval{.step = pos_.step, .loss = nan, .accuracy = nan, .samples = 0};
  if (!stopped_) {
    enter(Phase::eval);
    TraceSpan span(track_, "eval", pos_.step);
    final_eval = evaluate();
  }
  // Everything the run allocated is still held (Note [Device memory measured]).
  run_.device_memory.sample(run_.cfg.trainer.devices[static_cast<std::size_t>(rank_)]);
  {
    enter(Phase::replica_check);
    TraceSpan span(track_, "replica check", pos_.step);
    check_replicas();
  }
  // Where the time went: every worker fills its own row.
  res_.reducer->collect_timings();
  const LinearCounts linear = res_.device->linear_counts();
  const TimeRow mine{.loop_s = steady_now_s() - times_.loop_start_s,
                     .comm_exposed_s = res_.reducer->exposed_seconds(),
                     .data_wait_s = res_.batches->data_wait_s(),
                     .barrier_wait_s = times_.barrier_wait_s,
                     .comm_s = res_.reducer->comm_seconds(),
                     .optimizer_state_bytes = static_cast<double>(res_.optimizer->state_bytes()),
                     .gradient_bytes = static_cast<double>(
                         res_.replica->grads() ? res_.replica->param_count() * sizeof(float)
                                               : res_.reducer->gradient_bytes()),
                     .host_syncs_per_step = static_cast<double>(syncs_.per_step()),
                     .linear_fused = static_cast<double>(linear.fused),
                     .linear_partial = static_cast<double>(linear.partial),
                     .linear_composed = static_cast<double>(linear.composed),
                     .device_busy = busy_.median().value_or(-1.0)};
  std::vector<double> rows(static_cast<std::size_t>(comm_.size()) * TimeRow::kFields, 0.0);
  const auto fields = mine.fields();
  std::copy(fields.begin(), fields.end(),
            rows.begin() + static_cast<std::ptrdiff_t>(global_ * TimeRow::kFields));
  comm_.all_reduce_host(rows);
  if (rank_ == 0) fill_summary(rows, final_eval);
}

// Local worker 0's share of the summary: the run's totals, and the time accounting per worker
// and averaged over workers.
void WorkerLoop::fill_summary(std::span<const double> time_rows, const EvalMetrics& final_eval) {
  Summary& summary = run_.summary;
  const int world = comm_.size();
  summary.steps = pos_.step;
  summary.samples = pos_.samples;
  summary.masked = run_.train->masks_targets();
  summary.loss_tokens = pos_.loss_tokens;
  summary.final_train_loss = window_.last.loss;
  summary.final_train_accuracy = window_.last.accuracy;
  // The steady step: the steps after the first two (all of three or fewer), worker 0's rates.
  std::vector<double> rates = window_.step_rates;
  if (rates.size() > 3) rates.erase(rates.begin(), rates.begin() + 2);
  summary.step_tokens_per_s = rates.empty() ? 0.0 : upper_median(std::move(rates));
  summary.eval_loss = final_eval.loss;
  summary.eval_accuracy = final_eval.accuracy;
  summary.replicas_identical = true;
  TimeRow sum;
  summary.worker_times.clear();
  summary.fused_linear = {};
  summary.graphs = res_.graphs->summary();
  for (int r = 0; r < world; ++r) {
    const TimeRow row = TimeRow::from(time_rows.subspan(r * TimeRow::kFields, TimeRow::kFields));
    sum.data_wait_s += row.data_wait_s;
    sum.barrier_wait_s += row.barrier_wait_s;
    sum.comm_s += row.comm_s;
    sum.comm_exposed_s += row.comm_exposed_s;
    summary.worker_times.push_back(
        {.total_s = row.loop_s,
         .compute_s = std::max(0.0, row.loop_s - row.comm_exposed_s - row.data_wait_s -
                                        row.barrier_wait_s),
         .comm_exposed_s = row.comm_exposed_s,
         .data_wait_s = row.data_wait_s,
         .barrier_wait_s = row.barrier_wait_s,
         .optimizer_state_bytes = static_cast<std::size_t>(row.optimizer_state_bytes),
         .gradient_bytes = static_cast<std::size_t>(row.gradient_bytes)});
    summary.optimizer_state_bytes =
        std::max(summary.optimizer_state_bytes, summary.worker_times.back().optimizer_state_bytes);
    summary.host_syncs_per_step = std::max(summary.host_syncs_per_step,
                                           static_cast<std::uint64_t>(row.host_syncs_per_step));
    summary.fused_linear += {static_cast<std::uint64_t>(row.linear_fused),
                             static_cast<std::uint64_t>(row.linear_partial),
                             static_cast<std::uint64_t>(row.linear_composed)};
    if (row.device_busy >= 0.0)
      summary.device_busy = std::min(summary.device_busy.value_or(1.0), row.device_busy);
  }
  summary.data_wait_s = sum.data_wait_s / world;
  summary.barrier_wait_s = sum.barrier_wait_s / world;
  summary.comm_s = sum.comm_s / world;
  summary.comm_exposed_s = sum.comm_exposed_s / world;
  summary.comm_hidden_fraction =
      sum.comm_s > 0.0 ? std::clamp(1.0 - sum.comm_exposed_s / sum.comm_s, 0.0, 1.0) : 0.0;
  run_.final_params = res_.replica->parameters();
}

}  // namespace lockstep::detail
