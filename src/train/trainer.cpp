// The data-parallel trainer: one std::thread per device, one step in lockstep. Each thread runs a
// WorkerLoop (worker_loop.hpp: Note [One step], Note [Failure]); this file sets up the run, starts
// the threads and the watchdog (watchdog.hpp), and reports the first failure (failures.hpp).
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
#include <atomic>
#include <exception>
#include <latch>
#include <optional>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "lockstep/checkpoint.hpp"
#include "common/fnv1a.hpp"
#include "io/dir_lock.hpp"
#include "io/output_path.hpp"
#include "lockstep/comm.hpp"
#include "train/evaluation.hpp"
#include "train/failures.hpp"
#include "train/fault_injection.hpp"
#include "train/memory_plan.hpp"
#include "train/trace.hpp"
#include "train/watchdog.hpp"
#include "train/worker_loop.hpp"

namespace lockstep {
namespace {

using detail::steady_now_s;

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
       std::shared_ptr<ProcessGroup> procs, std::shared_ptr<Backend> b)
      : cfg(std::move(c)),
        train(std::move(tr)),
        eval(std::move(ev)),
        processes(procs && procs->size() > 1 ? std::move(procs) : nullptr),
        backend(std::move(b)),
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

  Summary begin_summary(const Backend& backend) const;
  std::string check_memory(const Backend& backend) const;
  void run_workers(const detail::RunContext& run, Backend& backend,
                   std::vector<std::unique_ptr<Communicator>>& comms, detail::FailureLog& failures);
  void check_processes_agree() const;

  Config cfg;
  std::shared_ptr<const Dataset> train, eval;
  std::shared_ptr<ProcessGroup> processes;  // null: this process alone
  std::shared_ptr<Backend> backend;         // null: make_backend(trainer.backend) at each run
  Model model;
  detail::TrainerCallbacks callbacks;
  std::int64_t total_steps = 0;
  std::optional<Checkpoint> resume;
  std::atomic<bool> stop_requested{false};
  // The last run's results (local worker 0 writes them).
  Summary summary;
  std::vector<float> final_params;
};

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
  return detail::eval_metrics(detail::loss_totals(replica, data, 0, 1, batch), 0, data.targets());
}

Trainer::Trainer(Config config, std::shared_ptr<const Dataset> train,
                 std::shared_ptr<const Dataset> eval, std::shared_ptr<ProcessGroup> processes,
                 std::shared_ptr<Backend> backend)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(train), std::move(eval),
                                   std::move(processes), std::move(backend))) {
  impl_->total_steps = impl_->compute_total_steps();
}

Trainer::~Trainer() = default;

void Trainer::on_step(std::function<void(const StepMetrics&)> callback) {
  impl_->callbacks.step = std::move(callback);
}
void Trainer::on_progress(std::function<void(const StepMetrics&)> callback) {
  impl_->callbacks.progress = std::move(callback);
}
void Trainer::on_eval(std::function<void(const EvalMetrics&)> callback) {
  impl_->callbacks.eval = std::move(callback);
}
void Trainer::set_hooks(TrainerHooks hooks) { impl_->callbacks.hooks = std::move(hooks); }
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

// Note [Memory plan]: the host's bytes against its limit; a GPU worker's against its device.
std::string Trainer::Impl::check_memory(const Backend& b) const {
  const bool on_host = b.name() == "cpu";
  const detail::MemoryPlan plan =
      detail::plan_memory(cfg, model, *train, eval.get(), on_host);
  const detail::MemoryLimit limit = detail::host_memory_limit();
  detail::check_memory_plan(plan, limit, cfg);
  if (!on_host)
    for (const DeviceInfo& d : b.devices())
      if (d.memory_bytes > 0 && plan.per_worker() > static_cast<double>(d.memory_bytes) &&
          std::find(cfg.trainer.devices.begin(), cfg.trainer.devices.end(), d.id) !=
              cfg.trainer.devices.end())
        throw InputError(fmt::format("{}: {} needs {} per worker; {}:{} has {}", cfg.source,
                                     plan.driver, detail::format_bytes(plan.per_worker()),
                                     d.backend, d.id,
                                     detail::format_bytes(static_cast<double>(d.memory_bytes))));
  return detail::describe(plan, limit);
}

std::string Trainer::memory_plan() const {
  const TrainerConfig& tc = impl_->cfg.trainer;
  const std::shared_ptr<Backend> backend =
      impl_->backend ? impl_->backend
                     : make_backend(tc.backend, tc.devices, {.comm = tc.comm, .tf32 = tc.tf32});
  return impl_->check_memory(*backend);
}

Summary Trainer::Impl::begin_summary(const Backend& b) const {
  Summary s;
  s.backend = std::string(b.name());
  s.devices = cfg.trainer.devices;
  s.processes = processes ? processes->size() : 1;
  s.parameters = model.param_count();
  s.flops_per_token = cfg.model.type == "gpt" ? gpt_flops_per_token(gpt_spec(cfg, *train)) : 0.0;
  s.accumulate_steps = cfg.trainer.accumulate_steps;
  s.overlap = cfg.trainer.overlap;
  s.resumed_from_step = resume ? resume->state.step : 0;
  return s;
}

// One thread per local worker, and the watchdog while they run. See Note [Failure] in
// worker_loop.hpp.
void Trainer::Impl::run_workers(const detail::RunContext& run, Backend& b,
                                std::vector<std::unique_ptr<Communicator>>& comms,
                                detail::FailureLog& failures) {
  const int n = static_cast<int>(comms.size());
  // Failures are reported by global rank; `rank` below is the local one.
  const auto record = [&](int rank, std::exception_ptr error) {
    failures.record(global_rank(rank), std::move(error),
                    std::string(b.name()) + ":" + std::to_string(cfg.trainer.devices[rank]));
  };
  std::latch teardown(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      Communicator& comm = *comms[rank];
      detail::WorkerLoop loop(run, rank, comm);
      try {
        loop.run(b);
      } catch (...) {
        record(rank, std::current_exception());
        comm.abort();
      }
      // See Note [Failure]: nothing of ours may be freed while a peer can still touch it.
      loop.drain();
      teardown.arrive_and_wait();
    });
  }
  const detail::Watchdog watchdog(
      run.heartbeats, cfg.trainer.step_timeout_s, *comms[0],
      [&](int rank, const std::string& message) {
        record(rank, std::make_exception_ptr(std::runtime_error(message)));
      });
  for (std::thread& t : threads) t.join();
}

Summary Trainer::run() {
  Impl& im = *impl_;
  const TrainerConfig& tc = im.cfg.trainer;
  const detail::Fault fault = detail::fault_from_environment();
  im.check_processes_agree();
  if (im.process_rank() == 0) {  // Note [Checking an output]
    if (!tc.trace.empty()) detail::check_output_file(tc.trace, "trainer.trace");
    detail::check_output_dir(tc.checkpoint.dir, "trainer.checkpoint.dir");
  }
  const std::shared_ptr<Backend> backend =
      im.backend ? im.backend : make_backend(tc.backend, tc.devices, {.comm = tc.comm, .tf32 = tc.tf32});
  const std::string memory_plan = im.check_memory(*backend);
  std::vector<std::unique_ptr<Communicator>> comms =
      backend->create_communicators(tc.devices, im.processes);
  const int n = static_cast<int>(comms.size());
  const bool writer = im.process_rank() == 0;  // Note [Processes]
  fault.check_reached(comms[0]->size(), im.resume ? im.resume->state.step : 0, im.total_steps);

  im.summary = im.begin_summary(*backend);
  im.summary.memory_plan = memory_plan;
  im.final_params.clear();
  const double peak_flops = job_peak_flops(*backend, tc.devices, tc.tf32) * im.summary.processes;
  detail::Trace trace(n, !tc.trace.empty());
  // Note [One writer per checkpoint directory]: held until the run ends.
  std::optional<detail::DirLock> dir_lock;
  if (!tc.checkpoint.dir.empty() && writer) dir_lock.emplace(tc.checkpoint.dir);
  const std::unique_ptr<CheckpointManager> checkpoints =
      tc.checkpoint.dir.empty() || !writer
          ? nullptr
          : std::make_unique<CheckpointManager>(tc.checkpoint.dir, tc.checkpoint.keep_last);
  const std::vector<float> initial = im.resume ? std::vector<float>{} : im.model.initial_parameters(tc.seed);
  const double start_s = steady_now_s();
  detail::Heartbeats heartbeats(n, start_s);
  detail::FailureLog failures;
  const detail::RunContext run{.cfg = im.cfg,
                               .model = im.model,
                               .train = im.train,
                               .eval = im.eval,
                               .callbacks = im.callbacks,
                               .resume = im.resume ? &*im.resume : nullptr,
                               .initial = initial,
                               .total_steps = im.total_steps,
                               .start_s = start_s,
                               .peak_flops = peak_flops,
                               .fault = fault,
                               .stop_requested = im.stop_requested,
                               .trace = trace,
                               .heartbeats = heartbeats,
                               .checkpoints = checkpoints.get(),
                               .summary = im.summary,
                               .final_params = im.final_params};
  im.run_workers(run, *backend, comms, failures);
  im.summary.wall_s = steady_now_s() - start_s;
  if (trace.enabled() && writer) trace.write_json(tc.trace, start_s);

  failures.rethrow_first();
  im.summary.samples_per_s = im.summary.samples / std::max(1e-9, im.summary.wall_s);
  im.summary.tokens_per_s = im.summary.samples_per_s * im.train->targets();
  im.summary.mfu = run.mfu(im.summary.tokens_per_s);
  return im.summary;
}

}  // namespace lockstep
