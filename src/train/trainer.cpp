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
#include "lockstep/trainer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <latch>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

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

}  // namespace

struct Trainer::Impl {
  Impl(Config c, std::shared_ptr<const Dataset> tr, std::shared_ptr<const Dataset> ev)
      : cfg(std::move(c)), train(std::move(tr)), eval(std::move(ev)), model(build_model()) {}

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
    return Model::mlp({.inputs = train->features(),
                       .hidden = cfg.model.hidden,
                       .classes = train->classes(),
                       .activation = cfg.model.activation});
  }

  int workers() const { return static_cast<int>(cfg.trainer.devices.size()); }

  // Optimiser steps in the run.
  std::int64_t compute_total_steps() const {
    if (cfg.trainer.steps > 0) return cfg.trainer.steps;
    const DistributedSampler sampler(train->size(), workers(), 0, cfg.data.shuffle,
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
  EvalMetrics evaluate(int rank, Replica& replica, Communicator& comm, std::int64_t step);
  void check_replicas(Replica& replica, Communicator& comm, std::int64_t step);

  Config cfg;
  std::shared_ptr<const Dataset> train, eval;
  Model model;
  std::vector<float> initial;
  std::function<void(const StepMetrics&)> step_callback;
  std::function<void(const StepMetrics&)> progress_callback;
  std::function<void(const EvalMetrics&)> eval_callback;
  TrainerHooks hooks;

  // Per-run state. Written by rank 0 only, or under failure_mutex.
  std::int64_t total_steps = 0;
  double start_s = 0.0;
  Summary summary;
  std::vector<float> final_params;
  std::unique_ptr<detail::Trace> trace;
  std::mutex failure_mutex;
  std::vector<WorkerFailure> failures;
  std::atomic<std::uint64_t> failure_order{0};
};

EvalMetrics Trainer::Impl::evaluate(int rank, Replica& replica, Communicator& comm,
                                    std::int64_t step) {
  Device& dev = replica.device();
  const int n = comm.size(), batch = cfg.data.batch_size;
  const int features = train->features(), classes = train->classes();
  const std::size_t size = eval ? eval->size() : 0;
  // Rank r evaluates samples r, r + n, ...: every sample exactly once, no padding.
  std::vector<float> x(static_cast<std::size_t>(batch) * features);
  std::vector<std::int32_t> y(batch);
  DeviceArray<float> xd(dev, x.size());
  DeviceArray<std::int32_t> yd(dev, y.size());
  double totals[3] = {0.0, 0.0, 0.0};  // loss sum, correct, samples
  std::size_t i = static_cast<std::size_t>(rank);
  while (i < size) {
    int rows = 0;
    for (; rows < batch && i < size; ++rows, i += static_cast<std::size_t>(n))
      y[rows] = eval->get(i, x.data() + static_cast<std::size_t>(rows) * features);
    xd.upload(std::span<const float>(x.data(), static_cast<std::size_t>(rows) * features));
    yd.upload(std::span<const std::int32_t>(y.data(), rows));
    const float* logits = replica.forward(xd.data(), rows);
    const LossStats s = dev.softmax_cross_entropy(logits, yd.data(), rows, classes, nullptr, 0.0f);
    totals[0] += s.loss_sum;
    totals[1] += static_cast<double>(s.correct);
    totals[2] += rows;
  }
  comm.all_reduce_host(totals);
  EvalMetrics m;
  m.step = step;
  m.samples = static_cast<std::size_t>(totals[2]);
  m.loss = totals[2] > 0 ? totals[0] / totals[2] : std::numeric_limits<double>::quiet_NaN();
  m.accuracy = totals[2] > 0 ? totals[1] / totals[2] : std::numeric_limits<double>::quiet_NaN();
  if (rank == 0 && eval_callback && m.samples > 0) eval_callback(m);
  return m;
}

void Trainer::Impl::check_replicas(Replica& replica, Communicator& comm, std::int64_t step) {
  const std::uint64_t mine = replica.device().hash(replica.params(), replica.param_count());
  const std::vector<std::uint64_t> all = comm.all_gather_host(mine);
  for (int r = 1; r < comm.size(); ++r) {
    if (all[r] != all[0])
      throw std::runtime_error(fmt::format(
          "replicas diverged at step {}: rank 0 parameter hash {:016x}, rank {} {:016x}", step,
          all[0], r, all[r]));
  }
  if (comm.rank() == 0) {
    ++summary.replica_checks;
    summary.param_hash = mine;
  }
}

void Trainer::Impl::worker(int rank, Backend& backend, Communicator& comm, WorkerContext& ctx) {
  const int n = workers();
  const TrainerConfig& tc = cfg.trainer;
  const int batch = cfg.data.batch_size, k = tc.accumulate_steps;
  const int features = train->features(), classes = train->classes();
  std::vector<detail::TraceEvent>* track = trace->worker(rank);

  ctx.device = backend.create_device(tc.devices[rank], n, tc.threads_per_device);
  Device& dev = *ctx.device;
  comm.attach(dev);
  ctx.replica = std::make_unique<Replica>(dev, model, batch);
  Replica& replica = *ctx.replica;
  replica.load_parameters(initial);
  // The replicas start from the same host copy; the broadcast makes rank 0 the authority anyway,
  // as any later backend (several processes) needs.
  comm.broadcast(replica.params(), replica.param_count(), 0);

  const std::size_t params = replica.param_count();
  ctx.optimizer = std::make_unique<detail::Optimizer>(dev, cfg.optimizer, params);
  ctx.reducer = std::make_unique<detail::Reducer>(
      model, comm, replica.grads(), detail::plan_buckets(model, tc.bucket_cap_mb), tc.overlap,
      trace->comm(rank));
  detail::Optimizer& optimizer = *ctx.optimizer;
  detail::Reducer& reducer = *ctx.reducer;
  if (rank == 0) summary.buckets = reducer.buckets().size();
  ctx.loader = std::make_unique<ShardLoader>(
      train, DistributedSampler(train->size(), n, rank, cfg.data.shuffle, tc.seed, cfg.data.drop_last),
      batch, cfg.data.drop_last, cfg.data.prefetch);

  DeviceArray<float> x(dev, static_cast<std::size_t>(batch) * features);
  DeviceArray<std::int32_t> y(dev, batch);
  DeviceArray<float> dlogits(dev, static_cast<std::size_t>(batch) * classes);

  // Backward reports each layer; the reducer starts a bucket's all-reduce once it is full.
  double layer_start_s = 0.0;
  const auto grads_ready = [&](std::size_t layer) {
    if (track) {
      const double now = steady_now_s();
      track->push_back({fmt::format("backward layers.{}", layer), layer_start_s, now, {}});
      layer_start_s = now;
    }
    reducer.layer_ready(layer);
  };
  const bool clipping = cfg.optimizer.clip_grad_norm > 0.0;

  double last_report_s = steady_now_s();
  double window[3] = {0.0, 0.0, 0.0};  // loss sum, correct, samples since the last report
  StepMetrics last{};
  std::uint64_t epoch = 0;
  for (std::int64_t step = 1; step <= total_steps; ++step) {
    replica.zero_grads();
    reducer.reset();
    LossStats stats;
    double step_samples = 0.0;
    for (int micro = 0; micro < k; ++micro) {
      Batch b;
      {
        TraceSpan span(track, "data wait");
        const double t0 = steady_now_s();
        b = ctx.loader->next();
        ctx.data_wait_s += steady_now_s() - t0;
      }
      epoch = b.epoch;
      if (hooks.before_forward) hooks.before_forward(rank, step);
      x.upload(b.x);
      y.upload(b.y);
      const float* logits;
      {
        TraceSpan span(track, "forward");
        logits = replica.forward(x.data(), b.size);
      }
      // Each worker averages over its own k micro-batches; the all-reduce then averages over
      // workers: the mean over the global batch, since every shard has the same batch size.
      const LossStats s = dev.softmax_cross_entropy(logits, y.data(), b.size, classes,
                                                    dlogits.data(),
                                                    1.0f / static_cast<float>(b.size * k));
      stats.loss_sum += s.loss_sum;
      stats.correct += s.correct;
      step_samples += b.size;
      // Gradients accumulate over the micro-batches; only the last one is reduced (no_sync).
      const bool last_micro = micro == k - 1;
      layer_start_s = steady_now_s();
      TraceSpan span(track, "backward");
      replica.backward(x.data(), dlogits.data(), b.size,
                       last_micro ? std::function<void(std::size_t)>(grads_ready) : nullptr);
    }
    reducer.launch_remaining();

    // Optimiser: bucket by bucket as each all-reduce lands, unless clipping needs the global
    // norm of every bucket first.
    double sum_squares = 0.0;
    const double lr = detail::learning_rate(cfg.optimizer, cfg.schedule, step - 1, total_steps);
    {
      TraceSpan span(track, "optimizer");
      optimizer.begin_step();
      const auto& buckets = reducer.buckets();
      for (std::size_t i = 0; i < buckets.size(); ++i) {
        reducer.wait(i);
        if (clipping) continue;
        sum_squares += dev.sum_squares(replica.grads() + buckets[i].begin,
                                       buckets[i].end - buckets[i].begin);
        optimizer.apply(replica.params(), replica.grads(), lr, buckets[i].begin, buckets[i].end);
      }
      if (clipping) sum_squares = dev.sum_squares(replica.grads(), params);
    }
    const double grad_norm = std::sqrt(sum_squares);
    if (!std::isfinite(grad_norm))
      throw std::runtime_error(fmt::format("non-finite gradient norm ({}) at step {}", grad_norm, step));
    if (clipping) {
      TraceSpan span(track, "optimizer");
      if (grad_norm > cfg.optimizer.clip_grad_norm)
        dev.scale(replica.grads(), static_cast<float>(cfg.optimizer.clip_grad_norm / (grad_norm + 1e-6)),
                  params);
      optimizer.apply(replica.params(), replica.grads(), lr, 0, params);
    }
    if (hooks.after_update) hooks.after_update(rank, step, replica);

    double totals[3] = {stats.loss_sum, static_cast<double>(stats.correct), step_samples};
    comm.all_reduce_host(totals);
    for (int i = 0; i < 3; ++i) window[i] += totals[i];

    if (rank == 0 && progress_callback) {
      const double elapsed = steady_now_s() - start_s;
      progress_callback({.step = step,
                         .total_steps = total_steps,
                         .epoch = epoch,
                         .loss = totals[0] / totals[2],
                         .accuracy = totals[1] / totals[2],
                         .lr = lr,
                         .grad_norm = grad_norm,
                         .samples_per_s = (summary.samples + window[2]) / std::max(1e-9, elapsed),
                         .elapsed_s = elapsed});
    }
    const bool report = step % tc.log_every == 0 || step == total_steps;
    if (rank == 0 && report) {
      const double now = steady_now_s();
      last = {.step = step,
              .total_steps = total_steps,
              .epoch = epoch,
              .loss = window[0] / window[2],
              .accuracy = window[1] / window[2],
              .lr = lr,
              .grad_norm = grad_norm,
              .samples_per_s = window[2] / std::max(1e-9, now - last_report_s),
              .elapsed_s = now - start_s};
      last_report_s = now;
      summary.samples += static_cast<std::int64_t>(window[2]);
      if (step_callback) step_callback(last);
    }
    if (report) std::fill(std::begin(window), std::end(window), 0.0);

    if (tc.eval_every > 0 && step % tc.eval_every == 0 && step != total_steps) {
      TraceSpan span(track, "eval");
      evaluate(rank, replica, comm, step);
    }
    if (tc.check_replicas_every > 0 && step % tc.check_replicas_every == 0) {
      TraceSpan span(track, "replica check");
      check_replicas(replica, comm, step);
    }
    TraceSpan span(track, "barrier");
    const double t0 = steady_now_s();
    comm.barrier();
    ctx.barrier_wait_s += steady_now_s() - t0;
  }

  const EvalMetrics final_eval = evaluate(rank, replica, comm, total_steps);
  check_replicas(replica, comm, total_steps);

  // Where the time went, averaged over workers.
  double times[4] = {ctx.data_wait_s, ctx.barrier_wait_s, reducer.comm_seconds(),
                     reducer.exposed_seconds()};
  comm.all_reduce_host(times);
  if (rank == 0) {
    summary.final_train_loss = last.loss;
    summary.final_train_accuracy = last.accuracy;
    summary.eval_loss = final_eval.loss;
    summary.eval_accuracy = final_eval.accuracy;
    summary.replicas_identical = true;
    summary.data_wait_s = times[0] / n;
    summary.barrier_wait_s = times[1] / n;
    summary.comm_s = times[2] / n;
    summary.comm_exposed_s = times[3] / n;
    summary.comm_hidden_fraction =
        times[2] > 0.0 ? std::clamp(1.0 - times[3] / times[2], 0.0, 1.0) : 0.0;
    final_params = replica.parameters();
  }
}

Trainer::Trainer(Config config, std::shared_ptr<const Dataset> train,
                 std::shared_ptr<const Dataset> eval)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(train), std::move(eval))) {
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

Summary Trainer::run() {
  Impl& im = *impl_;
  const TrainerConfig& tc = im.cfg.trainer;
  std::unique_ptr<Backend> backend = make_backend(tc.backend, tc.devices);
  std::vector<std::unique_ptr<Communicator>> comms = backend->create_communicators(tc.devices);
  const int n = static_cast<int>(comms.size());

  im.summary = Summary{};
  im.summary.backend = std::string(backend->name());
  im.summary.devices = tc.devices;
  im.summary.steps = im.total_steps;
  im.summary.parameters = im.model.param_count();
  im.summary.accumulate_steps = tc.accumulate_steps;
  im.summary.overlap = tc.overlap;
  im.failures.clear();
  im.final_params.clear();
  im.trace = std::make_unique<detail::Trace>(n, !tc.trace.empty());
  im.initial = im.model.initial_parameters(tc.seed);
  im.start_s = steady_now_s();

  std::latch teardown(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&im, &backend, &comms, &teardown, rank] {
      Communicator& comm = *comms[rank];
      WorkerContext ctx;
      try {
        im.worker(rank, *backend, comm, ctx);
      } catch (...) {
        WorkerFailure f{im.failure_order.fetch_add(1), rank, std::current_exception(),
                        std::string(backend->name()) + ":" + std::to_string(im.cfg.trainer.devices[rank])};
        {
          std::lock_guard lock(im.failure_mutex);
          im.failures.push_back(std::move(f));
        }
        comm.abort();
      }
      // See Note [Failure]: nothing of ours may be freed while a peer can still touch it.
      if (ctx.reducer) ctx.reducer->drain();
      teardown.arrive_and_wait();
    });
  }
  for (std::thread& t : threads) t.join();
  im.summary.wall_s = steady_now_s() - im.start_s;
  if (im.trace->enabled()) im.trace->write_json(tc.trace, im.start_s);

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
  return im.summary;
}

}  // namespace lockstep
