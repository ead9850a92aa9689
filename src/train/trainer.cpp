// The data-parallel trainer: one std::thread per device, one step in lockstep.
//
// Note [One step]
//   worker r, for each of accumulate_steps micro-batches:
//              next batch from its shard loader (assembled ahead on the loader's thread)
//              -> upload -> forward -> loss -> backward
//   During the last micro-batch's backward the reducer all-reduces (avg) each gradient bucket as
//   soon as backward has filled it (see Note [Buckets] in reducer.hpp); every replica then holds
//   the average over the global batch.
//              -> optimiser step, bucket by bucket as the all-reduces finish (whole buffer at
//                 once when clipping: the global norm needs every bucket first)
//              -> all_reduce_host(loss, correct, count)  metrics for the log
//              -> barrier
//   The norm of the averaged gradient is identical on every replica, so clipping and the
//   non-finite check agree everywhere. Every `check_replicas_every` steps, and at the end, the
//   ranks all-gather a hash of their parameters; any difference stops the run.
//
// Note [Failure]
//   A worker that throws records its error and aborts the group: every rank blocked in (or
//   later entering) a collective throws CommAborted and leaves its loop too. Before anything a
//   worker owns is freed, it drains its in-flight all-reduces and meets the others at a
//   teardown latch, because a peer's communication thread may still be reading its gradient
//   buffer. So each worker's resources live in a WorkerContext that outlives the try block.
//   run() joins all threads, then rethrows the first error that was not CommAborted.
//
// Note [Processes]
//   With a ProcessGroup of P > 1 processes (mpirun, srun), each process runs this trainer on its
//   own devices and the communicators span the job (Backend::create_communicators). Worker r of
//   process p is global rank p x workers + r; the world is P x workers. The global rank picks the
//   data shard, the eval samples and LOCKSTEP_FAULT's worker; global rank 0 alone calls the
//   callbacks (logs) and writes checkpoints and the trace. Each process's local worker 0 fills
//   that process's Summary. Before anything else, run() all-gathers what every process must agree
//   on (config hash, parameter count, ...) and refuses to start when they differ.
#include "lockstep/trainer.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <latch>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <cstdlib>

#include <fmt/format.h>

#include "lockstep/checkpoint.hpp"
#include "common/fnv1a.hpp"
#include "lockstep/comm.hpp"
#include "train/optimizer.hpp"
#include "train/reducer.hpp"
#include "train/trace.hpp"

namespace lockstep {
namespace {

using detail::steady_now_s;
using detail::TraceSpan;

struct WorkerFailure {
  std::uint64_t order = 0;  // when it was caught, across all workers
  int rank = 0;
  std::exception_ptr error;
  std::string device;
};

// LOCKSTEP_FAULT=RANK:STEP:KIND (see TrainerHooks in trainer.hpp).
struct Fault {
  enum class Kind { none, forward, loader, nan, stall };
  int rank = -1;
  std::int64_t step = 0;
  Kind kind = Kind::none;
  bool at(int r, std::int64_t s, Kind k) const { return kind == k && rank == r && step == s; }
};

Fault fault_from_environment() {
  const char* spec = std::getenv("LOCKSTEP_FAULT");
  if (!spec || !*spec) return {};
  Fault f;
  char kind[16] = {};
  long long step = 0;
  const auto bad = [&] {
    return InputError(fmt::format(
        "LOCKSTEP_FAULT: expected RANK:STEP:KIND with KIND one of forward, loader, nan, stall, "
        "got '{}'", spec));
  };
  if (std::sscanf(spec, "%d:%lld:%15s", &f.rank, &step, kind) != 3 || f.rank < 0 || step < 1)
    throw bad();
  f.step = step;
  const std::string k = kind;
  if (k == "forward") f.kind = Fault::Kind::forward;
  else if (k == "loader") f.kind = Fault::Kind::loader;
  else if (k == "nan") f.kind = Fault::Kind::nan;
  else if (k == "stall") f.kind = Fault::Kind::stall;
  else throw bad();
  return f;
}

// A dataset whose get() fails once the loader thread reaches the `fail_at`-th sample it reads:
// the loader fault of LOCKSTEP_FAULT.
class FailingDataset final : public Dataset {
 public:
  FailingDataset(std::shared_ptr<const Dataset> inner, std::size_t fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}
  std::size_t size() const noexcept override { return inner_->size(); }
  int features() const noexcept override { return inner_->features(); }
  int classes() const noexcept override { return inner_->classes(); }
  int targets() const noexcept override { return inner_->targets(); }
  void get(std::size_t i, float* x, std::int32_t* y) const override {
    if (reads_.fetch_add(1) >= fail_at_)
      throw std::runtime_error(fmt::format("injected fault: the loader failed reading sample {}", i));
    inner_->get(i, x, y);
  }

 private:
  std::shared_ptr<const Dataset> inner_;
  std::size_t fail_at_;
  mutable std::atomic<std::size_t> reads_{0};
};

// Everything one worker owns, destroyed on its own thread after the teardown latch.
// Members are declared in dependency order: later ones use earlier ones.
struct WorkerContext {
  std::unique_ptr<Device> device;
  std::unique_ptr<Replica> replica;
  std::unique_ptr<detail::Optimizer> optimizer;
  std::unique_ptr<detail::Reducer> reducer;
  std::unique_ptr<ShardLoader> loader;
  // Time accounting, seconds.
  double data_wait_s = 0.0;
  double barrier_wait_s = 0.0;
};

// Loss sum, correct count and prediction count (samples x targets) of `replica` over samples
// first, first + stride, ... of `data`, in batches of at most `batch` (the replica's capacity).
std::array<double, 3> loss_totals(Replica& replica, const Dataset& data, std::size_t first,
                                  std::size_t stride, int batch) {
  Device& dev = replica.device();
  const int features = replica.model().inputs(), targets = data.targets();
  const int classes = replica.model().outputs() / targets;
  std::vector<float> x(static_cast<std::size_t>(batch) * features);
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch) * targets);
  DeviceArray<float> xd(dev, x.size());
  DeviceArray<std::int32_t> yd(dev, y.size());
  std::array<double, 3> totals{};
  for (std::size_t i = first; i < data.size();) {
    int rows = 0;
    for (; rows < batch && i < data.size(); ++rows, i += stride)
      data.get(i, x.data() + static_cast<std::size_t>(rows) * features,
               y.data() + static_cast<std::size_t>(rows) * targets);
    xd.upload(std::span<const float>(x.data(), static_cast<std::size_t>(rows) * features));
    yd.upload(std::span<const std::int32_t>(y.data(), static_cast<std::size_t>(rows) * targets));
    const LossStats s = dev.softmax_cross_entropy(replica.forward(xd.data(), rows), yd.data(),
                                                  rows * targets, classes, nullptr, 0.0f);
    totals[0] += s.loss_sum;
    totals[1] += static_cast<double>(s.correct);
    totals[2] += static_cast<double>(rows) * targets;
  }
  return totals;
}

// Loss and accuracy are per prediction: per sample, or per token for a language model.
EvalMetrics eval_metrics(const std::array<double, 3>& totals, std::int64_t step, int targets) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EvalMetrics m;
  m.step = step;
  m.samples = static_cast<std::size_t>(totals[2]) / static_cast<std::size_t>(targets);
  m.loss = totals[2] > 0 ? totals[0] / totals[2] : nan;
  m.accuracy = totals[2] > 0 ? totals[1] / totals[2] : nan;
  return m;
}

// The peak FLOP/s of this process's devices together, from the backend's device names; 0 when
// any of them is not in the table (every CPU).
double job_peak_flops(const Backend& backend, std::span<const int> ids, bool tf32) {
  const std::vector<DeviceInfo> infos = backend.devices();
  double total = 0.0;
  for (int id : ids) {
    const auto info = std::find_if(infos.begin(), infos.end(), [&](const DeviceInfo& d) { return d.id == id; });
    const std::optional<double> peak = info == infos.end() ? std::nullopt : peak_flops(info->name, tf32);
    if (!peak) return 0.0;
    total += *peak;
  }
  return total;
}

}  // namespace

struct Trainer::Impl {
  Impl(Config c, std::shared_ptr<const Dataset> tr, std::shared_ptr<const Dataset> ev,
       std::shared_ptr<ProcessGroup> procs)
      : cfg(std::move(c)),
        train(std::move(tr)),
        eval(std::move(ev)),
        processes(procs && procs->size() > 1 ? std::move(procs) : nullptr),
        model(build_model()) {}

  Model build_model() {
    cfg.validate();
    if (!train || train->size() == 0)
      throw InputError(fmt::format("{}: data: the train split is empty", cfg.source));
    if (eval && eval->size() > 0 &&
        (eval->features() != train->features() || eval->classes() > train->classes()))
      throw InputError(fmt::format("{}: data: the eval split has {} features and {} classes, the "
                                   "train split {} and {}",
                                   cfg.source, eval->features(), eval->classes(),
                                   train->features(), train->classes()));
    return make_model(cfg, *train);
  }

  // Model FLOPs utilisation at `tokens_per_s` over the job: 0 without a known peak or FLOP count.
  double mfu(double tokens_per_s) const {
    return peak_flops > 0.0 ? summary.flops_per_token * tokens_per_s / peak_flops : 0.0;
  }

  int workers() const { return static_cast<int>(cfg.trainer.devices.size()); }
  // Note [Processes]
  int process_rank() const { return processes ? processes->rank() : 0; }
  int world() const { return workers() * (processes ? processes->size() : 1); }
  int global_rank(int local) const { return process_rank() * workers() + local; }

  // Optimiser steps in the run.
  std::int64_t compute_total_steps() const {
    if (cfg.trainer.steps > 0) return cfg.trainer.steps;
    const DistributedSampler sampler(train->size(), world(), 0, cfg.data.shuffle,
                                     cfg.trainer.seed, cfg.data.drop_last);
    const std::size_t per_epoch =
        batches_in(sampler.num_samples(), cfg.data.batch_size, cfg.data.drop_last);
    if (per_epoch == 0)
      throw InputError(fmt::format(
          "{}: data.batch_size: the train split has {} samples, {} per worker, fewer than one "
          "batch of {} with drop_last",
          cfg.source, train->size(), sampler.num_samples(), cfg.data.batch_size));
    const std::int64_t batches = cfg.trainer.epochs * static_cast<std::int64_t>(per_epoch);
    const std::int64_t k = cfg.trainer.accumulate_steps;
    return (batches + k - 1) / k;
  }

  void worker(int rank, Backend& backend, Communicator& comm, WorkerContext& ctx);
  void save_checkpoint(Replica& replica, const detail::Optimizer& optimizer, std::int64_t step,
                       std::uint64_t epoch, std::uint64_t batch_in_epoch, std::int64_t samples);
  [[noreturn]] void report_nonfinite(Replica& replica, std::int64_t step, double loss,
                                     double grad_norm) const;
  void record_failure(int rank, std::exception_ptr error, const std::string& device);
  EvalMetrics evaluate(int rank, Replica& replica, Communicator& comm, std::int64_t step);
  void check_replicas(int rank, Replica& replica, Communicator& comm, std::int64_t step);
  void check_processes_agree() const;

  Config cfg;
  std::shared_ptr<const Dataset> train, eval;
  std::shared_ptr<ProcessGroup> processes;  // null: this process alone
  Model model;
  std::vector<float> initial;
  std::function<void(const StepMetrics&)> step_callback;
  std::function<void(const StepMetrics&)> progress_callback;
  std::function<void(const EvalMetrics&)> eval_callback;
  TrainerHooks hooks;

  // Per-run state. Written by local rank 0 only, or under failure_mutex.
  std::int64_t total_steps = 0;
  double start_s = 0.0;
  double peak_flops = 0.0;  // of every worker of the job together; 0 when unknown (see mfu())
  Summary summary;
  std::vector<float> final_params;
  std::unique_ptr<detail::Trace> trace;
  std::optional<Checkpoint> resume;
  std::unique_ptr<CheckpointManager> checkpoints;
  std::atomic<bool> stop_requested{false};
  Fault fault;
  // Per rank, for the step timeout: when it last showed progress, how many progress points it
  // has passed (every rank passes the same points in the same order), and its step.
  std::unique_ptr<std::atomic<double>[]> heartbeat;
  std::unique_ptr<std::atomic<std::int64_t>[]> progress;
  std::unique_ptr<std::atomic<std::int64_t>[]> heartbeat_step;
  std::mutex failure_mutex;
  std::vector<WorkerFailure> failures;
  std::atomic<std::uint64_t> failure_order{0};
};

EvalMetrics Trainer::Impl::evaluate(int rank, Replica& replica, Communicator& comm,
                                    std::int64_t step) {
  // Global rank r evaluates samples r, r + n, ...: every sample exactly once, no padding.
  std::array<double, 3> totals{};
  if (eval)
    totals = loss_totals(replica, *eval, static_cast<std::size_t>(rank),
                         static_cast<std::size_t>(comm.size()), cfg.data.batch_size);
  comm.all_reduce_host(totals);
  const EvalMetrics m = eval_metrics(totals, step, train->targets());
  if (rank == 0 && eval_callback && m.samples > 0) eval_callback(m);
  return m;
}

void Trainer::Impl::check_replicas(int rank, Replica& replica, Communicator& comm,
                                   std::int64_t step) {
  const std::uint64_t mine = replica.device().hash(replica.params(), replica.param_count());
  const std::vector<std::uint64_t> all = comm.all_gather_host(mine);
  for (int r = 1; r < comm.size(); ++r) {
    if (all[r] != all[0])
      throw std::runtime_error(fmt::format(
          "replicas diverged at step {}: rank 0 parameter hash {:016x}, rank {} {:016x}", step,
          all[0], r, all[r]));
  }
  if (rank == 0) {
    ++summary.replica_checks;
    summary.param_hash = mine;
  }
}

void Trainer::Impl::save_checkpoint(Replica& replica, const detail::Optimizer& optimizer,
                                    std::int64_t step, std::uint64_t epoch,
                                    std::uint64_t batch_in_epoch, std::int64_t samples) {
  Checkpoint ckpt;
  ckpt.tensors = model.param_tensors();
  ckpt.params = replica.parameters();
  // What `lockstep sample` needs to rebuild the model and read a prompt.
  if (cfg.model.type == "gpt") {
    ckpt.metadata["lockstep.model"] = to_string(gpt_spec(cfg, *train));
    ckpt.metadata["lockstep.tokenizer"] = cfg.data.dataset == DatasetKind::text ? "bytes" : "ids";
  }
  ckpt.state = {.step = step,
                .epoch = epoch,
                .batch_in_epoch = batch_in_epoch,
                .samples = samples,
                .config_hash = config_hash(cfg),
                .workers = world(),
                .optimizer = cfg.optimizer.type,
                .optimizer_steps = optimizer.steps_taken(),
                .seed = cfg.trainer.seed};
  ckpt.optimizer_state = optimizer.state();
  summary.last_checkpoint = checkpoints->save(ckpt).weights.string();
}

void Trainer::Impl::report_nonfinite(Replica& replica, std::int64_t step, double loss,
                                     double grad_norm) const {
  if (!std::isfinite(loss))
    throw std::runtime_error(fmt::format("non-finite loss ({}) at step {} (trainer.on_nonfinite: {})",
                                         loss, step, to_string(cfg.trainer.on_nonfinite)));
  // Name the first tensor, in forward order, whose averaged gradient is not finite.
  const std::vector<float> grads = replica.gradients();
  std::string where = "?";
  for (const ParamTensor& t : model.param_tensors()) {
    const auto begin = grads.begin() + static_cast<std::ptrdiff_t>(t.offset);
    if (std::any_of(begin, begin + static_cast<std::ptrdiff_t>(t.numel()),
                    [](float g) { return !std::isfinite(g); })) {
      where = t.name;
      break;
    }
  }
  throw std::runtime_error(fmt::format(
      "non-finite gradient at step {}: global norm {}, first in {} (trainer.on_nonfinite: {})",
      step, grad_norm, where, to_string(cfg.trainer.on_nonfinite)));
}

// `rank` is the local worker index (device, trace track, heartbeat); `global` its rank in the
// whole job (Note [Processes]).
void Trainer::Impl::worker(int rank, Backend& backend, Communicator& comm, WorkerContext& ctx) {
  const int n = workers(), global = comm.rank(), world = comm.size();
  const TrainerConfig& tc = cfg.trainer;
  const int batch = cfg.data.batch_size, k = tc.accumulate_steps;
  const int features = train->features(), classes = train->classes(), targets = train->targets();
  std::vector<detail::TraceEvent>* track = trace->worker(rank);
  std::int64_t step = resume ? resume->state.step : 0;
  const auto beat = [&] {
    heartbeat_step[rank].store(step);
    progress[rank].fetch_add(1);
    heartbeat[rank].store(steady_now_s());
  };

  ctx.device = backend.create_device(tc.devices[rank], n, tc.threads_per_device);
  Device& dev = *ctx.device;
  comm.attach(dev);
  ctx.replica = std::make_unique<Replica>(dev, model, batch);
  Replica& replica = *ctx.replica;
  replica.load_parameters(resume ? std::span<const float>(resume->params) : std::span<const float>(initial));
  // The replicas start from the same host copy; the broadcast makes rank 0 the authority anyway,
  // as any later backend (several processes) needs.
  comm.broadcast(replica.params(), replica.param_count(), 0);

  const std::size_t params = replica.param_count();
  ctx.optimizer = std::make_unique<detail::Optimizer>(dev, cfg.optimizer, params);
  detail::Optimizer& optimizer = *ctx.optimizer;
  if (resume)
    optimizer.load_state(resume->optimizer_state, resume->state.optimizer_steps,
                         resume->weights_file.string());
  ctx.reducer = std::make_unique<detail::Reducer>(
      model, comm, replica.grads(), detail::plan_buckets(model, tc.bucket_cap_mb), tc.overlap,
      trace->comm(rank));
  detail::Reducer& reducer = *ctx.reducer;
  if (rank == 0) summary.buckets = reducer.buckets().size();

  // The sampler position: a resumed run continues inside the epoch it stopped in. With another
  // device count, the samples consumed so far in that epoch are rounded down to whole batches.
  DistributedSampler sampler(train->size(), world, global, cfg.data.shuffle, tc.seed,
                             cfg.data.drop_last);
  std::uint64_t epoch = 0, batch_in_epoch = 0;
  if (resume) {
    epoch = resume->state.epoch;
    batch_in_epoch = std::min<std::uint64_t>(
        resume->state.batch_in_epoch * static_cast<std::uint64_t>(resume->state.workers) /
            static_cast<std::uint64_t>(world),
        batches_in(sampler.num_samples(), batch, cfg.data.drop_last));
  }
  sampler.set_epoch(epoch);
  std::shared_ptr<const Dataset> shard_data = train;
  if (fault.kind == Fault::Kind::loader && fault.rank == global && fault.step > step)
    shard_data = std::make_shared<FailingDataset>(
        train, static_cast<std::size_t>(fault.step - step - 1) * static_cast<std::size_t>(k * batch));
  ctx.loader = std::make_unique<ShardLoader>(shard_data, sampler, batch, cfg.data.drop_last,
                                             cfg.data.prefetch, batch_in_epoch);
  const std::uint64_t batches_per_epoch = ctx.loader->batches_per_epoch();

  DeviceArray<float> dlogits(dev, static_cast<std::size_t>(batch) * targets * classes);
  // Double buffering: while the device computes on one batch, the next is already on its way
  // (see Device::stage_to_device). Staging slots 2i and 2i + 1 carry buffer i's x and y.
  struct Staged {
    DeviceArray<float> x;
    DeviceArray<std::int32_t> y;
    Batch batch;  // its host copy: size, epoch and position
  };
  const auto staged_x = static_cast<std::size_t>(batch) * features;
  const auto staged_y = static_cast<std::size_t>(batch) * targets;
  Staged staged[2] = {{DeviceArray<float>(dev, staged_x), DeviceArray<std::int32_t>(dev, staged_y), {}},
                      {DeviceArray<float>(dev, staged_x), DeviceArray<std::int32_t>(dev, staged_y), {}}};
  std::int64_t batches_left = (total_steps - step) * k;
  const auto stage = [&](int i) {
    Staged& s = staged[i];
    {
      TraceSpan span(track, "data wait");
      const double t0 = steady_now_s();
      s.batch = ctx.loader->next();
      ctx.data_wait_s += steady_now_s() - t0;
    }
    dev.stage_to_device(s.x.data(), s.batch.x.data(), s.batch.x.size() * sizeof(float), 2 * i);
    dev.stage_to_device(s.y.data(), s.batch.y.data(), s.batch.y.size() * sizeof(std::int32_t), 2 * i + 1);
    --batches_left;
  };
  int current = 0;
  if (batches_left > 0) stage(current);

  // Backward reports each layer; the reducer starts a bucket's all-reduce once it is full.
  double layer_start_s = 0.0;
  bool inject_nan = false;
  const auto grads_ready = [&](std::size_t layer) {
    if (track) {
      const double now = steady_now_s();
      track->push_back({fmt::format("backward layers.{}", layer), layer_start_s, now, {}});
      layer_start_s = now;
    }
    if (inject_nan) {
      dev.fill(replica.grads() + model.param_offset(layer), std::numeric_limits<float>::quiet_NaN(), 1);
      inject_nan = false;
    }
    reducer.layer_ready(layer);
  };
  const bool clipping = cfg.optimizer.clip_grad_norm > 0.0;
  // Updating each bucket as soon as it lands is only possible when nothing must be decided
  // about the whole gradient first: no clipping, and no update to drop on a non-finite norm.
  const bool update_per_bucket = !clipping && tc.on_nonfinite == NonfinitePolicy::stop;
  const std::int64_t samples_before = resume ? resume->state.samples : 0;
  std::int64_t samples_seen = 0;  // over all workers, this run
  int skips_in_row = 0;

  const double loop_start_s = steady_now_s();
  double last_report_s = loop_start_s;
  double window[3] = {0.0, 0.0, 0.0};  // loss sum, correct, samples since the last report
  StepMetrics last{};
  while (step < total_steps) {
    ++step;
    beat();
    replica.zero_grads();
    reducer.reset();
    LossStats stats;
    double step_samples = 0.0;
    for (int micro = 0; micro < k; ++micro) {
      Staged& in = staged[current];
      dev.wait_staged(2 * current);
      dev.wait_staged(2 * current + 1);
      current = 1 - current;
      if (batches_left > 0) stage(current);  // the next batch travels while this one computes
      const Batch& b = in.batch;
      // Where the next batch comes from, for checkpoints.
      epoch = b.epoch;
      batch_in_epoch = b.index_in_epoch + 1;
      if (batch_in_epoch == batches_per_epoch) {
        ++epoch;
        batch_in_epoch = 0;
      }
      if (hooks.before_forward) hooks.before_forward(global, step);
      if (fault.at(global, step, Fault::Kind::forward))
        throw std::runtime_error(fmt::format("injected fault: throw in forward at step {}", step));
      if (fault.at(global, step, Fault::Kind::stall)) {
        // A worker that stops making progress, until the step timeout aborts the run.
        while (!comm.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        throw CommAborted();
      }
      const float* logits;
      {
        TraceSpan span(track, "forward");
        logits = replica.forward(in.x.data(), b.size);
      }
      // Each worker averages over its own k micro-batches; the all-reduce then averages over
      // workers: the mean over the global batch, since every shard has the same batch size.
      // A language model predicts `targets` tokens per sample; the loss is their mean.
      const int predictions = b.size * targets;
      const LossStats s = dev.softmax_cross_entropy(logits, in.y.data(), predictions, classes,
                                                    dlogits.data(),
                                                    1.0f / static_cast<float>(predictions * k));
      stats.loss_sum += s.loss_sum;
      stats.correct += s.correct;
      step_samples += b.size;
      // Gradients accumulate over the micro-batches; only the last one is reduced (no_sync).
      const bool last_micro = micro == k - 1;
      inject_nan = last_micro && fault.at(global, step, Fault::Kind::nan);
      layer_start_s = steady_now_s();
      TraceSpan span(track, "backward");
      replica.backward(in.x.data(), dlogits.data(), b.size,
                       last_micro ? std::function<void(std::size_t)>(grads_ready) : nullptr);
    }
    reducer.launch_remaining();
    beat();

    // Metrics and the stop decision, agreed by every rank while the buckets are in flight.
    double totals[4] = {stats.loss_sum, static_cast<double>(stats.correct), step_samples,
                        stop_requested.load() ? 1.0 : 0.0};
    comm.all_reduce_host(totals);
    samples_seen += static_cast<std::int64_t>(totals[2]);
    const double predictions = totals[2] * targets;
    const double loss = totals[0] / predictions;
    const bool stop_now = totals[3] > 0.0;

    double sum_squares = 0.0;
    const double lr = detail::learning_rate(cfg.optimizer, cfg.schedule, step - 1, total_steps);
    {
      TraceSpan span(track, "optimizer");
      const auto& buckets = reducer.buckets();
      if (update_per_bucket) optimizer.begin_step();
      for (std::size_t i = 0; i < buckets.size(); ++i) {
        reducer.wait(i);
        if (!update_per_bucket) continue;
        sum_squares += dev.sum_squares(replica.grads() + buckets[i].begin,
                                       buckets[i].end - buckets[i].begin);
        optimizer.apply(replica.params(), replica.grads(), lr, buckets[i].begin, buckets[i].end);
      }
      if (!update_per_bucket) sum_squares = dev.sum_squares(replica.grads(), params);
    }
    beat();
    const double grad_norm = std::sqrt(sum_squares);
    // The loss and the norm are the same on every rank, so every rank decides the same.
    const bool finite = std::isfinite(grad_norm) && std::isfinite(loss);
    if (!finite && tc.on_nonfinite == NonfinitePolicy::stop) report_nonfinite(replica, step, loss, grad_norm);
    if (!finite) {
      ++skips_in_row;
      if (rank == 0) ++summary.nonfinite_skips;
      if (skips_in_row >= tc.max_nonfinite_skips)
        throw std::runtime_error(fmt::format(
            "{} steps in a row had a non-finite loss or gradient (the last at step {}); stopping "
            "(trainer.max_nonfinite_skips: {})",
            skips_in_row, step, tc.max_nonfinite_skips));
    } else if (!update_per_bucket) {
      skips_in_row = 0;
      TraceSpan span(track, "optimizer");
      if (clipping && grad_norm > cfg.optimizer.clip_grad_norm)
        dev.scale(replica.grads(), static_cast<float>(cfg.optimizer.clip_grad_norm / (grad_norm + 1e-6)),
                  params);
      optimizer.begin_step();
      optimizer.apply(replica.params(), replica.grads(), lr, 0, params);
    }
    if (hooks.after_update) hooks.after_update(global, step, replica);

    for (int i = 0; i < 3; ++i) window[i] += totals[i];
    if (global == 0 && progress_callback) {
      const double elapsed = steady_now_s() - start_s;
      progress_callback({.step = step,
                         .total_steps = total_steps,
                         .epoch = epoch,
                         .loss = loss,
                         .accuracy = totals[1] / predictions,
                         .lr = lr,
                         .grad_norm = grad_norm,
                         .samples_per_s = samples_seen / std::max(1e-9, elapsed),
                         .tokens_per_s = samples_seen * targets / std::max(1e-9, elapsed),
                         .mfu = mfu(samples_seen * targets / std::max(1e-9, elapsed)),
                         .elapsed_s = elapsed});
    }
    const bool report = step % tc.log_every == 0 || step == total_steps || stop_now;
    if (rank == 0 && report) {
      const double now = steady_now_s();
      last = {.step = step,
              .total_steps = total_steps,
              .epoch = epoch,
              .loss = window[0] / (window[2] * targets),
              .accuracy = window[1] / (window[2] * targets),
              .lr = lr,
              .grad_norm = grad_norm,
              .samples_per_s = window[2] / std::max(1e-9, now - last_report_s),
              .tokens_per_s = window[2] * targets / std::max(1e-9, now - last_report_s),
              .mfu = mfu(window[2] * targets / std::max(1e-9, now - last_report_s)),
              .elapsed_s = now - start_s};
      last_report_s = now;
      if (global == 0 && step_callback) step_callback(last);
    }
    if (report) std::fill(std::begin(window), std::end(window), 0.0);

    if (tc.eval_every > 0 && step % tc.eval_every == 0 && step != total_steps && !stop_now) {
      TraceSpan span(track, "eval");
      evaluate(global, replica, comm, step);
    }
    if (tc.check_replicas_every > 0 && step % tc.check_replicas_every == 0) {
      TraceSpan span(track, "replica check");
      check_replicas(rank, replica, comm, step);
    }
    {
      TraceSpan span(track, "barrier");
      const double t0 = steady_now_s();
      comm.barrier();
      ctx.barrier_wait_s += steady_now_s() - t0;
    }
    // Global rank 0 writes after the step's barrier: every replica has taken the update.
    const bool save = checkpoints && (stop_now || step == total_steps ||
                                      (tc.checkpoint.every_steps > 0 && step % tc.checkpoint.every_steps == 0));
    if (global == 0 && save) {
      TraceSpan span(track, "checkpoint");
      save_checkpoint(replica, optimizer, step, epoch, batch_in_epoch, samples_before + samples_seen);
    }
    if (stop_now) {
      if (rank == 0) summary.stopped_early = step < total_steps;
      break;
    }
  }
  beat();

  const EvalMetrics final_eval = evaluate(global, replica, comm, step);
  check_replicas(rank, replica, comm, step);

  // Where the time went: per worker (each fills its own row), and averaged over workers.
  const double loop_s = steady_now_s() - loop_start_s;
  constexpr int kColumns = 5;
  std::vector<double> rows(static_cast<std::size_t>(world) * kColumns, 0.0);
  double* mine = rows.data() + static_cast<std::size_t>(global) * kColumns;
  mine[0] = loop_s;
  mine[1] = reducer.exposed_seconds();
  mine[2] = ctx.data_wait_s;
  mine[3] = ctx.barrier_wait_s;
  mine[4] = reducer.comm_seconds();
  comm.all_reduce_host(rows);
  double times[4] = {0.0, 0.0, 0.0, 0.0};  // data wait, barrier wait, comm, exposed comm
  for (int r = 0; r < world; ++r) {
    const double* row = rows.data() + static_cast<std::size_t>(r) * kColumns;
    times[0] += row[2];
    times[1] += row[3];
    times[2] += row[4];
    times[3] += row[1];
  }
  if (rank == 0) {
    summary.steps = step;
    summary.samples = samples_seen;
    summary.final_train_loss = last.loss;
    summary.final_train_accuracy = last.accuracy;
    summary.eval_loss = final_eval.loss;
    summary.eval_accuracy = final_eval.accuracy;
    summary.replicas_identical = true;
    summary.data_wait_s = times[0] / world;
    summary.barrier_wait_s = times[1] / world;
    summary.comm_s = times[2] / world;
    summary.comm_exposed_s = times[3] / world;
    summary.comm_hidden_fraction =
        times[2] > 0.0 ? std::clamp(1.0 - times[3] / times[2], 0.0, 1.0) : 0.0;
    summary.worker_times.clear();
    for (int r = 0; r < world; ++r) {
      const double* row = rows.data() + static_cast<std::size_t>(r) * kColumns;
      summary.worker_times.push_back({.total_s = row[0],
                                      .compute_s = std::max(0.0, row[0] - row[1] - row[2] - row[3]),
                                      .comm_exposed_s = row[1],
                                      .data_wait_s = row[2],
                                      .barrier_wait_s = row[3]});
    }
    final_params = replica.parameters();
  }
}

GptSpec gpt_spec(const Config& config, const Dataset& train) {
  const ModelConfig& m = config.model;
  const GptSpec spec{.vocab_size = m.vocab_size > 0 ? m.vocab_size : train.classes(),
                     .context = m.context,
                     .n_layer = m.n_layer,
                     .n_head = m.n_head,
                     .d_model = m.d_model};
  if (train.features() != spec.context || train.targets() != spec.context)
    throw InputError(fmt::format(
        "{}: model.context is {}, but the data has samples of {} tokens with {} targets (a GPT "
        "trains on token windows: data.dataset tokens or text)",
        config.source, spec.context, train.features(), train.targets()));
  if (train.classes() > spec.vocab_size)
    throw InputError(fmt::format("{}: model.vocab_size is {}, but the data's tokens go up to {}",
                                 config.source, spec.vocab_size, train.classes() - 1));
  return spec;
}

Model make_model(const Config& config, const Dataset& train) {
  if (config.model.type == "gpt") return Model::gpt(gpt_spec(config, train));
  if (train.targets() != 1)
    throw InputError(fmt::format("{}: model.type mlp classifies samples, but the data has {} "
                                 "targets per sample (token windows need model.type gpt)",
                                 config.source, train.targets()));
  return Model::mlp({.inputs = train.features(),
                     .hidden = config.model.hidden,
                     .classes = train.classes(),
                     .activation = config.model.activation});
}

EvalMetrics evaluate(const Config& config, const Model& model, std::span<const float> params,
                     const Dataset& data) {
  const int device_id = config.trainer.devices.at(0);
  std::unique_ptr<Backend> backend = make_backend(config.trainer.backend, std::span(&device_id, 1),
                   {.comm = config.trainer.comm, .tf32 = config.trainer.tf32});
  std::unique_ptr<Device> device = backend->create_device(device_id, 1, config.trainer.threads_per_device);
  const int batch = config.data.batch_size, features = model.inputs();
  if (data.features() != features)
    throw InputError(fmt::format("{}: the data has {} features, the model takes {}", config.source,
                                 data.features(), features));
  Replica replica(*device, model, batch);
  replica.load_parameters(params);
  return eval_metrics(loss_totals(replica, data, 0, 1, batch), 0, data.targets());
}

Trainer::Trainer(Config config, std::shared_ptr<const Dataset> train,
                 std::shared_ptr<const Dataset> eval, std::shared_ptr<ProcessGroup> processes)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(train), std::move(eval),
                                   std::move(processes))) {
  impl_->total_steps = impl_->compute_total_steps();
}

Trainer::~Trainer() = default;

void Trainer::on_step(std::function<void(const StepMetrics&)> callback) {
  impl_->step_callback = std::move(callback);
}
void Trainer::on_progress(std::function<void(const StepMetrics&)> callback) {
  impl_->progress_callback = std::move(callback);
}
void Trainer::on_eval(std::function<void(const EvalMetrics&)> callback) {
  impl_->eval_callback = std::move(callback);
}
void Trainer::set_hooks(TrainerHooks hooks) { impl_->hooks = std::move(hooks); }
const Model& Trainer::model() const noexcept { return impl_->model; }
std::int64_t Trainer::total_steps() const noexcept { return impl_->total_steps; }
const std::vector<float>& Trainer::final_parameters() const noexcept { return impl_->final_params; }

// Note [Processes]: what differs between processes would make their collectives disagree (a
// different count or order: a hang) or their replicas diverge. Every process sees every value,
// so every process refuses, with the same message.
void Trainer::Impl::check_processes_agree() const {
  if (!processes) return;
  const TrainerConfig& tc = cfg.trainer;
  // The trainer keys that shape the collectives, which config_hash() leaves out.
  const std::string collectives = fmt::format(
      "{} {} {} {} {} {} {} {}", to_string(tc.backend), to_string(tc.comm), tc.accumulate_steps,
      tc.bucket_cap_mb, tc.eval_every, tc.check_replicas_every, to_string(tc.on_nonfinite),
      tc.max_nonfinite_skips);
  const std::uint64_t mine[] = {
      config_hash(cfg), model.param_count(), static_cast<std::uint64_t>(workers()),
      static_cast<std::uint64_t>(total_steps),
      static_cast<std::uint64_t>(resume ? resume->state.step : 0),
      detail::fnv1a64(collectives.data(), collectives.size())};
  constexpr std::string_view kWhat[] = {
      "config hash (model, data, optimizer, schedule, trainer.seed)",
      "parameter count",
      "trainer.devices count",
      "total steps (trainer.steps or trainer.epochs)",
      "resumed step (--resume)",
      "hash of trainer.backend, comm, accumulate_steps, bucket_cap_mb, eval_every, "
      "check_replicas_every, on_nonfinite and max_nonfinite_skips"};
  constexpr std::size_t kFields = std::size(mine);
  const std::vector<std::uint64_t> all = processes->all_gather(mine);
  for (int p = 1; p < processes->size(); ++p)
    for (std::size_t f = 0; f < kFields; ++f) {
      const std::uint64_t theirs = all[p * kFields + f], first = all[f];
      if (theirs != first)
        throw InputError(fmt::format(
            "{}: process {} of {} differs from process 0 in the {}: {:#x} there, {:#x} in process "
            "0; every process must run the same config",
            cfg.source, p, processes->size(), kWhat[f], theirs, first));
    }
}

void Trainer::Impl::record_failure(int rank, std::exception_ptr error, const std::string& device) {
  WorkerFailure f{failure_order.fetch_add(1), rank, std::move(error), device};
  std::lock_guard lock(failure_mutex);
  failures.push_back(std::move(f));
}

void Trainer::resume_from(Checkpoint checkpoint) {
  Impl& im = *impl_;
  const std::string source = checkpoint.weights_file.string();
  check_layout(checkpoint, im.model.param_tensors());
  const std::uint64_t expected = config_hash(im.cfg);
  if (checkpoint.state.config_hash != expected)
    throw InputError(fmt::format(
        "{}: written by a different configuration (config hash {:016x}, this config {:016x}); "
        "model, data, optimizer, schedule and trainer.seed must match to resume",
        source, checkpoint.state.config_hash, expected));
  im.resume = std::move(checkpoint);
}

void Trainer::request_stop() noexcept { impl_->stop_requested.store(true); }

Summary Trainer::run() {
  Impl& im = *impl_;
  const TrainerConfig& tc = im.cfg.trainer;
  im.fault = fault_from_environment();
  im.check_processes_agree();
  std::unique_ptr<Backend> backend = make_backend(tc.backend, tc.devices, {.comm = tc.comm, .tf32 = tc.tf32});
  std::vector<std::unique_ptr<Communicator>> comms =
      backend->create_communicators(tc.devices, im.processes);
  const int n = static_cast<int>(comms.size());
  const bool writer = im.process_rank() == 0;  // Note [Processes]

  im.summary = Summary{};
  im.summary.backend = std::string(backend->name());
  im.summary.devices = tc.devices;
  im.summary.processes = im.processes ? im.processes->size() : 1;
  im.summary.parameters = im.model.param_count();
  im.summary.flops_per_token = im.cfg.model.type == "gpt" ? gpt_flops_per_token(gpt_spec(im.cfg, *im.train)) : 0.0;
  im.peak_flops = job_peak_flops(*backend, tc.devices, tc.tf32) * im.summary.processes;
  im.summary.accumulate_steps = tc.accumulate_steps;
  im.summary.overlap = tc.overlap;
  im.summary.resumed_from_step = im.resume ? im.resume->state.step : 0;
  im.failures.clear();
  im.final_params.clear();
  im.trace = std::make_unique<detail::Trace>(n, !tc.trace.empty());
  im.checkpoints = tc.checkpoint.dir.empty() || !writer
                       ? nullptr
                       : std::make_unique<CheckpointManager>(tc.checkpoint.dir, tc.checkpoint.keep_last);
  if (!im.resume) im.initial = im.model.initial_parameters(tc.seed);
  im.start_s = steady_now_s();
  im.heartbeat = std::make_unique<std::atomic<double>[]>(n);
  im.progress = std::make_unique<std::atomic<std::int64_t>[]>(n);
  im.heartbeat_step = std::make_unique<std::atomic<std::int64_t>[]>(n);
  for (int r = 0; r < n; ++r) {
    im.heartbeat[r].store(im.start_s);
    im.progress[r].store(0);
    im.heartbeat_step[r].store(0);
  }
  // Failures are reported by global rank; `rank` below is the local one.
  const auto device_name = [&](int rank) {
    return std::string(backend->name()) + ":" + std::to_string(tc.devices[rank]);
  };

  std::latch teardown(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&im, &backend, &comms, &teardown, &device_name, rank] {
      Communicator& comm = *comms[rank];
      WorkerContext ctx;
      try {
        im.worker(rank, *backend, comm, ctx);
      } catch (...) {
        im.record_failure(im.global_rank(rank), std::current_exception(), device_name(rank));
        comm.abort();
      }
      // See Note [Failure]: nothing of ours may be freed while a peer can still touch it.
      if (ctx.reducer) ctx.reducer->drain();
      teardown.arrive_and_wait();
    });
  }

  // The step timeout. One stalled worker soon leaves the others waiting for it in a collective,
  // so the whole group goes quiet; when no worker has made progress for step_timeout_s, the one
  // furthest behind is the culprit, and the run is aborted in its name.
  std::atomic<bool> finished{false};
  std::thread watchdog;
  if (tc.step_timeout_s > 0.0) {
    watchdog = std::thread([&] {
      const auto poll = std::chrono::duration<double>(std::min(0.1, tc.step_timeout_s / 4));
      while (!finished.load() && !comms[0]->aborted()) {
        std::this_thread::sleep_for(poll);
        int behind = 0;
        double latest = im.heartbeat[0].load();
        for (int r = 1; r < n; ++r) {
          if (im.progress[r].load() < im.progress[behind].load()) behind = r;
          latest = std::max(latest, im.heartbeat[r].load());
        }
        const double silent = steady_now_s() - latest;
        if (silent > tc.step_timeout_s && !finished.load()) {
          im.record_failure(im.global_rank(behind),
                            std::make_exception_ptr(std::runtime_error(fmt::format(
                                "no progress for {:.1f} s at step {}; the other workers wait for "
                                "it (trainer.step_timeout_s: {})",
                                silent, im.heartbeat_step[behind].load(), tc.step_timeout_s))),
                            device_name(behind));
          comms[0]->abort();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  finished.store(true);
  if (watchdog.joinable()) watchdog.join();
  im.summary.wall_s = steady_now_s() - im.start_s;
  if (im.trace->enabled() && writer) im.trace->write_json(tc.trace, im.start_s);

  if (!im.failures.empty()) {
    // Report the first failure that caused the abort, not the CommAborted it triggered.
    std::sort(im.failures.begin(), im.failures.end(),
              [](const WorkerFailure& a, const WorkerFailure& b) { return a.order < b.order; });
    const WorkerFailure* first = &im.failures.front();
    for (const WorkerFailure& f : im.failures) {
      try {
        std::rethrow_exception(f.error);
      } catch (const CommAborted&) {
        continue;
      } catch (...) {
        first = &f;
        break;
      }
    }
    try {
      std::rethrow_exception(first->error);
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      throw WorkerError(first->rank, first->device, e.what());
    }
  }
  im.summary.samples_per_s = im.summary.samples / std::max(1e-9, im.summary.wall_s);
  im.summary.tokens_per_s = im.summary.samples_per_s * im.train->targets();
  im.summary.mfu = im.mfu(im.summary.tokens_per_s);
  return im.summary;
}

}  // namespace lockstep
