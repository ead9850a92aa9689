// The data-parallel trainer: one std::thread per device, one step in lockstep.
//
// Note [One step]
//   worker r:  next batch from its shard loader (assembled ahead on the loader's thread)
//              -> upload -> zero grads -> forward -> loss -> backward
//              -> all_reduce(grads, avg)                 every replica now holds the same gradient
//              -> global norm of the averaged gradient   identical everywhere, so clipping and
//                                                        the non-finite check agree on every rank
//              -> optimiser step                         identical update on every replica
//              -> all_reduce_host(loss, correct, count)  metrics for the log
//              -> barrier
//   Every `check_replicas_every` steps, and at the end, all ranks all-gather a hash of their
//   parameters; any difference stops the run.
//
// Note [Failure]
//   A worker that throws records its error, then aborts the group. Every other rank blocked in
//   (or later entering) a collective throws CommAborted, records nothing of note, and leaves.
//   Replicas, devices and loaders are owned by each worker's frame, but the communicators are
//   owned here and outlive every thread, so a rank reading a failed peer's buffer never reads
//   freed memory. run() joins all threads, then rethrows the first error that was not
//   CommAborted.
#include "lockstep/trainer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "lockstep/comm.hpp"
#include "train/optimizer.hpp"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct WorkerFailure {
  std::uint64_t order = 0;  // when it was caught, across all workers
  int rank = 0;
  std::exception_ptr error;
  std::string device;
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
    return cfg.trainer.epochs * static_cast<std::int64_t>(per_epoch);
  }

  void worker(int rank, Backend& backend, Communicator& comm);
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
  Clock::time_point start;
  Summary summary;
  std::vector<float> final_params;
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

void Trainer::Impl::worker(int rank, Backend& backend, Communicator& comm) {
  const int n = workers();
  const TrainerConfig& tc = cfg.trainer;
  const int batch = cfg.data.batch_size;
  const int features = train->features(), classes = train->classes();

  std::unique_ptr<Device> device = backend.create_device(tc.devices[rank], n, tc.threads_per_device);
  Device& dev = *device;
  comm.attach(dev);
  Replica replica(dev, model, batch);
  replica.load_parameters(initial);
  // The replicas start from the same host copy; the broadcast makes rank 0 the authority anyway,
  // as any later backend (several processes) needs.
  comm.broadcast(replica.params(), replica.param_count(), 0);

  detail::Optimizer optimizer(dev, cfg.optimizer, replica.param_count());
  DistributedSampler sampler(train->size(), n, rank, cfg.data.shuffle, tc.seed, cfg.data.drop_last);
  ShardLoader loader(train, sampler, batch, cfg.data.drop_last, cfg.data.prefetch);

  DeviceArray<float> x(dev, static_cast<std::size_t>(batch) * features);
  DeviceArray<std::int32_t> y(dev, batch);
  DeviceArray<float> dlogits(dev, static_cast<std::size_t>(batch) * classes);
  const std::size_t params = replica.param_count();

  Clock::time_point last_report = Clock::now();
  double window[3] = {0.0, 0.0, 0.0};  // loss sum, correct, samples since the last report
  StepMetrics last{};
  for (std::int64_t step = 1; step <= total_steps; ++step) {
    Batch b = loader.next();
    if (hooks.before_forward) hooks.before_forward(rank, step);
    x.upload(b.x);
    y.upload(b.y);

    replica.zero_grads();
    const float* logits = replica.forward(x.data(), b.size);
    // Each worker averages over its own batch; the all-reduce then averages over workers,
    // which is the mean over the global batch because every shard has the same batch size.
    const LossStats stats = dev.softmax_cross_entropy(logits, y.data(), b.size, classes,
                                                      dlogits.data(), 1.0f / static_cast<float>(b.size));
    replica.backward(x.data(), dlogits.data(), b.size);
    comm.all_reduce(replica.grads(), params, ReduceOp::avg);

    const double grad_norm = std::sqrt(dev.sum_squares(replica.grads(), params));
    if (!std::isfinite(grad_norm))
      throw std::runtime_error(fmt::format("non-finite gradient norm ({}) at step {}", grad_norm, step));
    if (cfg.optimizer.clip_grad_norm > 0.0 && grad_norm > cfg.optimizer.clip_grad_norm)
      dev.scale(replica.grads(), static_cast<float>(cfg.optimizer.clip_grad_norm / (grad_norm + 1e-6)),
                params);
    const double lr = detail::learning_rate(cfg.optimizer, cfg.schedule, step - 1, total_steps);
    optimizer.step(replica.params(), replica.grads(), lr);
    if (hooks.after_update) hooks.after_update(rank, step, replica);

    double totals[3] = {stats.loss_sum, static_cast<double>(stats.correct),
                        static_cast<double>(b.size)};
    comm.all_reduce_host(totals);
    for (int k = 0; k < 3; ++k) window[k] += totals[k];

    if (rank == 0 && progress_callback) {
      const double elapsed = seconds_since(start);
      progress_callback({.step = step,
                         .total_steps = total_steps,
                         .epoch = b.epoch,
                         .loss = totals[0] / totals[2],
                         .accuracy = totals[1] / totals[2],
                         .lr = lr,
                         .grad_norm = grad_norm,
                         .samples_per_s = (summary.samples + window[2]) / std::max(1e-9, elapsed),
                         .elapsed_s = elapsed});
    }
    const bool report = step % tc.log_every == 0 || step == total_steps;
    if (rank == 0 && report) {
      const double dt = std::max(1e-9, seconds_since(last_report));
      last_report = Clock::now();
      last = {.step = step,
              .total_steps = total_steps,
              .epoch = b.epoch,
              .loss = window[0] / window[2],
              .accuracy = window[1] / window[2],
              .lr = lr,
              .grad_norm = grad_norm,
              .samples_per_s = window[2] / dt,
              .elapsed_s = seconds_since(start)};
      summary.samples += static_cast<std::int64_t>(window[2]);
      if (step_callback) step_callback(last);
    }
    if (report) std::fill(std::begin(window), std::end(window), 0.0);

    if (tc.eval_every > 0 && step % tc.eval_every == 0 && step != total_steps)
      evaluate(rank, replica, comm, step);
    if (tc.check_replicas_every > 0 && step % tc.check_replicas_every == 0)
      check_replicas(replica, comm, step);
    comm.barrier();
  }

  const EvalMetrics final_eval = evaluate(rank, replica, comm, total_steps);
  check_replicas(replica, comm, total_steps);
  if (rank == 0) {
    summary.final_train_loss = last.loss;
    summary.final_train_accuracy = last.accuracy;
    summary.eval_loss = final_eval.loss;
    summary.eval_accuracy = final_eval.accuracy;
    summary.replicas_identical = true;
    final_params = replica.parameters();
  }
  loader.stop();
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

  im.summary = Summary{};
  im.summary.backend = std::string(backend->name());
  im.summary.devices = tc.devices;
  im.summary.steps = im.total_steps;
  im.summary.parameters = im.model.param_count();
  im.failures.clear();
  im.final_params.clear();
  im.initial = im.model.initial_parameters(tc.seed);
  im.start = Clock::now();

  std::vector<std::thread> threads;
  threads.reserve(comms.size());
  for (int rank = 0; rank < static_cast<int>(comms.size()); ++rank) {
    threads.emplace_back([&im, &backend, &comms, rank] {
      Communicator& comm = *comms[rank];
      try {
        im.worker(rank, *backend, comm);
      } catch (...) {
        WorkerFailure f{im.failure_order.fetch_add(1), rank, std::current_exception(),
                        std::string(backend->name()) + ":" + std::to_string(im.cfg.trainer.devices[rank])};
        {
          std::lock_guard lock(im.failure_mutex);
          im.failures.push_back(std::move(f));
        }
        comm.abort();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  im.summary.wall_s = seconds_since(im.start);

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
