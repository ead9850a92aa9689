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
#include <chrono>
#include <ctime>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/checkpoint.hpp"
#include "common/fnv1a.hpp"
#include "common/start_thread.hpp"
#include "io/dir_lock.hpp"
#include "io/durable_file.hpp"
#include "io/output_path.hpp"
#include "lockstep/comm.hpp"
#include "model/lora_targets.hpp"
#include "train/evaluation.hpp"
#include "train/failures.hpp"
#include "train/device_memory.hpp"
#include "train/fault_injection.hpp"
#include "train/metrics_log.hpp"
#include "train/recovery.hpp"
#include "train/report.hpp"
#include "train/resume_changes.hpp"
#include "train/run_files.hpp"
#include "train/settings_effect.hpp"
#include "train/memory_plan.hpp"
#include "train/trace.hpp"
#include "train/watchdog.hpp"
#include "text/data_tokenizer.hpp"
#include "train/worker_loop.hpp"

namespace lockstep {
namespace {

using detail::steady_now_s;

// The peak FLOP/s of this process's devices together, from the backend's device names; 0 when
// any of them is not in the table (every CPU).
double job_peak_flops(const Backend& backend, std::span<const int> ids, Precision precision) {
  const std::vector<DeviceInfo> infos = backend.devices();
  double total = 0.0;
  for (int id : ids) {
    const auto info = std::find_if(infos.begin(), infos.end(), [&](const DeviceInfo& d) { return d.id == id; });
    const std::optional<double> peak = info == infos.end() ? std::nullopt : peak_flops(info->name, precision);
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
        model(build_model()),
        tokenizer_record(record_data_tokenizer()) {}

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
    return make_model(cfg, *train, backend ? backend->name() : std::string_view{});
  }

  // What checkpoints record of data.tokenizer (read once here, as the data loader read it).
  std::map<std::string, std::string> record_data_tokenizer() const {
    std::map<std::string, std::string> record;
    if (!cfg.data.tokenizer.empty())
      record_tokenizer(record, detail::load_data_tokenizer(cfg, cfg.data.tokenizer));
    return record;
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
  detail::MemoryPlan check_memory(const Backend& backend) const { return check_memory(backend, cfg); }
  // The same for `c`: this run's config with other trainer keys (memory_plans_by_zero).
  detail::MemoryPlan check_memory(const Backend& backend, const Config& c) const;
  struct RunResources;
  std::unique_ptr<RunResources> prepare_run();
  std::vector<int> run_workers(RunResources& r);
  void work(RunResources& r, int rank);
  std::vector<int> supervise(RunResources& r);
  void record(RunResources& r, int rank, std::exception_ptr error) const;
  void make_context(RunResources& r, const Checkpoint* from, double start_s);
  void note_survivor(RunResources& r, int rank, detail::WorkerLoop& loop) const;
  // Note [Shrink] in recovery.hpp: the state the survivors go on from, and what it costs.
  struct Recovery {
    Checkpoint from;
    std::int64_t failed_step = 0;  // the step the lost worker was in
    std::int64_t redone = 0;       // steps whose update had been applied, taken again
    std::string state;             // what `from` is, for the log line
  };
  std::optional<Recovery> recovery_point(RunResources& r) const;
  void shrink(RunResources& r, Recovery recovery);
  WorkerError left_behind(const RunResources& r, const std::vector<int>& ranks) const;
  void check_resume_base(std::span<const float> base_weights) const;
  std::optional<std::string> lost_left_behind(const RunResources& r,
                                              const std::vector<int>& ranks) const;
  void check_processes_agree() const;

  // Note [A setting that cannot take effect]: InputError, or warnings on process 0's stderr.
  void warn_settings_without_effect() const {
    const std::string backend_used(
        backend ? backend->name() : backend_name(cfg.trainer.backend, cfg.trainer.devices));
    for (const std::string& warning : detail::settings_without_effect(cfg, backend_used, world()))
      if (process_rank() == 0) fmt::print(stderr, "lockstep: warning: {}\n", warning);
  }

  Config cfg;
  std::shared_ptr<const Dataset> train, eval;
  std::shared_ptr<ProcessGroup> processes;  // null: this process alone
  std::shared_ptr<Backend> backend;         // null: make_backend(trainer.backend) at each run
  Model model;
  // For checkpoints' metadata: data.tokenizer's record (empty: none), and the model's bos and
  // eos ids when the weights it started from record them (keep_token_ids).
  std::map<std::string, std::string> tokenizer_record;
  detail::TrainerCallbacks callbacks;
  std::int64_t total_steps = 0;
  std::optional<Checkpoint> resume;
  std::vector<float> init;  // init_from()'s weights; empty: drawn from trainer.seed
  // LoRA: the frozen base (Note [Frozen parameters] in src/model/lora.cpp) init_from() gave;
  // empty: drawn from trainer.seed. base_source: the weights file it came from.
  std::vector<float> base;
  std::string base_source;
  std::vector<ConfigChange> resume_changes;  // accepted by resume_from()
  std::atomic<bool> stop_requested{false};
  std::atomic<std::int64_t> saving_step{-1};  // Trainer::saving_step()
  // The last run's results (local worker 0 writes them).
  Summary summary;
  std::vector<float> final_params;
  bool abandoned = false;  // a run left a worker behind: Note [Bounded stop]
};

GptSpec gpt_spec(const ModelConfig& m, int vocab_size) {
  const RopeScalingConfig& r = m.rope_scaling;
  std::optional<Llama3Scaling> scaling;
  if (m.positions == PositionKind::rope && r.type == RopeScalingKind::llama3)
    scaling = Llama3Scaling{r.factor, r.low_freq_factor, r.high_freq_factor,
                            double(r.original_max_position_embeddings)};
  const bool rope = m.positions == PositionKind::rope;
  return {.vocab_size = vocab_size,
          .context = m.context,
          .n_layer = m.n_layer,
          .n_head = m.n_head,
          .d_model = m.d_model,
          .norm = m.norm,
          .norm_eps = m.norm == NormKind::rmsnorm ? m.norm_eps : 1e-5,
          .positions = m.positions,
          .rope_theta = rope ? m.rope_theta : GptSpec{}.rope_theta,
          .rope_scaling = scaling,
          .mlp = m.mlp,
          .intermediate_size = m.mlp == MlpKind::gelu ? 0 : m.intermediate_size,
          .n_kv_head = m.n_kv_head == m.n_head ? 0 : m.n_kv_head,
          .head_dim = m.head_dim > 0 && m.head_dim * m.n_head == m.d_model ? 0 : m.head_dim,
          .qkv_bias = m.qkv_bias,
          .proj_bias = m.proj_bias,
          .tie_embeddings = m.tie_embeddings};
}

GptSpec gpt_spec(const Config& config, const Dataset& train) {
  const ModelConfig& m = config.model;
  const GptSpec spec = gpt_spec(m, m.vocab_size > 0 ? m.vocab_size : train.classes());
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

namespace {

// Every setting of a decoder's spec as text, by its name in the config (model.NAME).
std::vector<std::pair<std::string, std::string>> spec_settings(const GptSpec& s) {
  const auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  const std::string scaling =
      s.rope_scaling ? fmt::format("llama3 (factor {}, low_freq_factor {}, high_freq_factor {}, "
                                   "original_max_position_embeddings {})",
                                   s.rope_scaling->factor, s.rope_scaling->low_freq_factor,
                                   s.rope_scaling->high_freq_factor,
                                   s.rope_scaling->original_max_position_embeddings)
                     : "none";
  return {{"vocab_size", std::to_string(s.vocab_size)},
          {"context", std::to_string(s.context)},
          {"n_layer", std::to_string(s.n_layer)},
          {"n_head", std::to_string(s.n_head)},
          {"d_model", std::to_string(s.d_model)},
          {"norm", std::string(to_string(s.norm))},
          {"norm_eps", fmt::format("{}", s.norm_eps)},
          {"positions", std::string(to_string(s.positions))},
          {"rope_theta", fmt::format("{}", s.rope_theta)},
          {"rope_scaling", scaling},
          {"mlp", std::string(to_string(s.mlp))},
          {"intermediate_size", std::to_string(s.hidden_size())},
          {"n_kv_head", std::to_string(s.kv_heads())},
          {"head_dim", std::to_string(s.head_size())},
          {"qkv_bias", flag(s.qkv_bias)},
          {"proj_bias", flag(s.proj_bias)},
          {"tie_embeddings", flag(s.tie_embeddings)}};
}

// The first setting where two specs differ, as (name, a's value); empty when none does.
std::pair<std::string, std::string> first_difference(const GptSpec& a, const GptSpec& b) {
  const auto as = spec_settings(a), bs = spec_settings(b);
  for (std::size_t i = 0; i < as.size(); ++i)
    if (as[i].second != bs[i].second) return as[i];
  return {};
}

std::string spec_value(const GptSpec& spec, const std::string& name) {
  for (const auto& [key, value] : spec_settings(spec))
    if (key == name) return value;
  return {};
}

MlpSpec mlp_spec(const Config& config, const Dataset& train) {
  if (train.targets() != 1)
    throw InputError(fmt::format("{}: model.type mlp classifies samples, but the data has {} "
                                 "targets per sample (token windows need model.type gpt)",
                                 config.source, train.targets()));
  return {.inputs = train.features(),
          .hidden = config.model.hidden,
          .classes = train.classes(),
          .activation = config.model.activation};
}

}  // namespace

AttentionChoice attention_choice(const Config& config, std::string_view backend) {
  const TrainerConfig& tc = config.trainer;
  const std::string_view name = backend.empty() ? backend_name(tc.backend, tc.devices) : backend;
  // Packed windows (data.pack) choose as unpacked ones: on cuda the fused path takes their mask
  // as a score bias (Note [cuDNN packed mask] in src/cuda/cudnn_attention.hpp), checked against
  // the CPU on an H200 (bench/GPU.md, 2026-12-04).
  return choose_attention(config.model.attention, name, tc.precision, config.model.context,
                          config.model.n_head > 0 ? gpt_spec(config.model, 1).head_size() : 0);
}

namespace {
// model.lora.targets as names: GPT-2's (LayerNorm blocks) or the Llama family's.
std::vector<std::string> lora_targets(const ModelConfig& m) {
  return detail::parse_lora_targets(m.lora.targets, m.norm != NormKind::rmsnorm);
}
}  // namespace

LoraSpec lora_spec(const ModelConfig& m) {
  if (m.lora.rank == 0) return {};
  return {.rank = m.lora.rank, .alpha = m.lora.alpha, .targets = lora_targets(m),
          .dropout = m.lora.dropout};
}

std::string describe_lora(const ModelConfig& m) {
  std::string out = fmt::format("rank={} alpha={} targets={}", m.lora.rank, m.lora.alpha,
                                fmt::join(lora_targets(m), ","));
  if (m.lora.dropout != 0.0) out += fmt::format(" dropout={}", m.lora.dropout);
  return out;
}

LoraSpec parse_lora_record(std::string_view text) {
  LoraSpec spec;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find(' ', start), text.size());
    const std::string_view word = text.substr(start, end - start);
    const std::size_t eq = word.find('=');
    const std::string_view key = word.substr(0, eq), value = word.substr(eq + 1);
    try {
      if (eq == std::string_view::npos)
        throw std::invalid_argument("no '='");
      else if (key == "rank")
        spec.rank = std::stoi(std::string(value));
      else if (key == "alpha")
        spec.alpha = std::stod(std::string(value));
      else if (key == "targets")
        spec.targets = parse_lora_targets(value);
      else if (key == "dropout")
        spec.dropout = std::stod(std::string(value));
      else
        throw std::invalid_argument("unknown key");
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("LoRA record '{}': cannot read '{}' ({})", text,
                                              word, e.what()));
    }
    start = end + 1;
  }
  if (spec.rank < 1 || spec.targets.empty())
    throw std::invalid_argument(fmt::format("LoRA record '{}': needs rank >= 1 and targets", text));
  return spec;
}

std::string base_hash(std::span<const float> base) {
  return fmt::format("{:016x}", detail::fnv1a64(base.data(), base.size_bytes()));
}

Model make_model(const Config& config, const Dataset& train, std::string_view backend) {
  if (config.model.type == "gpt")
    return Model::gpt(gpt_spec(config, train), attention_choice(config, backend).path,
                      lora_spec(config.model));
  return Model::mlp(mlp_spec(config, train));
}

std::string describe_model(const Config& config, const Dataset& train) {
  return config.model.type == "gpt" ? to_string(gpt_spec(config, train))
                                    : to_string(mlp_spec(config, train));
}

EvalMetrics evaluate(const Config& config, const Model& model, std::span<const float> params,
                     const Dataset& data) {
  if (model.frozen_count() > 0)
    throw InputError(fmt::format(
        "{}: model.lora: evaluating adapters needs their base: merge_lora_checkpoint (what "
        "`lockstep eval` does) makes a LoRA checkpoint the merged model's, to evaluate",
        config.source));
  const int device_id = config.trainer.devices.at(0);
  std::unique_ptr<Backend> backend = make_backend(config.trainer.backend, std::span(&device_id, 1),
                   {.comm = config.trainer.comm, .precision = config.trainer.precision});
  std::unique_ptr<Device> device = backend->create_device(device_id, 1, config.trainer.threads_per_device);
  const int batch = config.data.batch_size, features = model.inputs();
  if (data.features() != features)
    throw InputError(fmt::format("{}: the data has {} features, the model takes {}", config.source,
                                 data.features(), features));
  Replica replica(*device, model, batch, config.trainer.precision);
  replica.load_parameters(params);
  return detail::eval_metrics(detail::loss_totals(replica, data, 0, 1, batch), 0);
}

Trainer::Trainer(Config config, std::shared_ptr<const Dataset> train,
                 std::shared_ptr<const Dataset> eval, std::shared_ptr<ProcessGroup> processes,
                 std::shared_ptr<Backend> backend)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(train), std::move(eval),
                                   std::move(processes), std::move(backend))) {
  impl_->total_steps = impl_->compute_total_steps();
  impl_->warn_settings_without_effect();
}

Trainer::~Trainer() {
  // Note [Bounded stop]: a worker left behind still refers to the model, data and config.
  if (impl_ && impl_->abandoned) (void)impl_.release();
}

void Trainer::on_step(std::function<void(const StepMetrics&)> callback) {
  impl_->callbacks.step = std::move(callback);
}
void Trainer::on_progress(std::function<void(const StepMetrics&)> callback) {
  impl_->callbacks.progress = std::move(callback);
}
void Trainer::on_eval(std::function<void(const EvalMetrics&)> callback) {
  impl_->callbacks.eval = std::move(callback);
}
void Trainer::on_checkpoint(
    std::function<void(std::int64_t step, const std::string& weights_file)> callback) {
  impl_->callbacks.checkpoint = std::move(callback);
}
void Trainer::set_hooks(TrainerHooks hooks) { impl_->callbacks.hooks = std::move(hooks); }
const Model& Trainer::model() const noexcept { return impl_->model; }
std::int64_t Trainer::total_steps() const noexcept { return impl_->total_steps; }
std::int64_t Trainer::resumed_step() const noexcept {
  return impl_->resume ? impl_->resume->state.step : 0;
}
const std::vector<float>& Trainer::final_parameters() const noexcept { return impl_->final_params; }

// Note [Processes]: what differs between processes would make their collectives disagree (a
// different count or order: a hang) or their replicas diverge. Every process sees every value,
// so every process refuses, with the same message.
void Trainer::Impl::check_processes_agree() const {
  if (!processes) return;
  const TrainerConfig& tc = cfg.trainer;
  // The trainer keys that shape the collectives, which config_hash() leaves out.
  const std::string collectives = fmt::format(
      "{} {} {} {} {} {} {} {} {}", to_string(tc.backend), to_string(tc.comm), tc.accumulate_steps,
      tc.bucket_cap_mb, tc.eval_every, tc.check_replicas_every, to_string(tc.on_nonfinite),
      tc.max_nonfinite_skips, tc.zero);
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
      "check_replicas_every, on_nonfinite, max_nonfinite_skips and zero"};
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

namespace {

// The model's bos and eos ids that the weights record (a Hugging Face config.json's, as
// load_weights gives them, or a checkpoint's), kept for the run's checkpoints: what sampling
// stops at and `export --format hf` writes back.
void keep_token_ids(const std::map<std::string, std::string>& from,
                    std::map<std::string, std::string>& record) {
  for (const char* key : {"lockstep.bos_token_ids", "lockstep.eos_token_ids"})
    if (const auto it = from.find(key); it != from.end()) record.insert_or_assign(key, it->second);
}

}  // namespace

void Trainer::resume_from(Checkpoint checkpoint) {
  Impl& im = *impl_;
  keep_token_ids(checkpoint.metadata, im.tokenizer_record);
  const std::string source = checkpoint.weights_file.string();
  const std::uint64_t expected = config_hash(im.cfg);
  const bool hashes_differ = checkpoint.state.config_hash != expected;
  // The changed keys first, by name: they explain a layout that differs too.
  std::vector<ConfigChange> changes;
  if (!checkpoint.state.config.empty())
    changes = detail::check_resume_changes(source, checkpoint.state.config,
                                           config_values(im.cfg), hashes_differ);
  check_layout(checkpoint, im.model.param_tensors());
  // A state file before version 3 names its config by the hash alone.
  if (checkpoint.state.config.empty() && hashes_differ)
    throw InputError(fmt::format(
        "{}: written by a different configuration (config hash {:016x}, this config {:016x}; "
        "the checkpoint is older than the record of its keys, so the changed ones cannot be "
        "named); model, data, optimizer, schedule and trainer.seed must match to resume",
        source, checkpoint.state.config_hash, expected));
  im.resume_changes = std::move(changes);
  im.resume = std::move(checkpoint);
}

const std::vector<ConfigChange>& Trainer::resume_changes() const noexcept {
  return impl_->resume_changes;
}

// The architecture a file records beyond its tensors' shapes (a GPT's n_head) must be the
// config's too: the same shapes with other heads would train another model.
void Trainer::init_from(Weights weights) {
  Impl& im = *impl_;
  // A LoRA model starts from a base (Note [Frozen parameters]): the weights are its frozen
  // parameters, and the adapters are drawn from trainer.seed (or set by init_adapters()).
  const bool base = im.model.frozen_count() > 0;
  if (base && weights.params.size() != im.model.frozen_count())
    throw std::invalid_argument(fmt::format("init_from: {} base weights, the model has {}",
                                            weights.params.size(), im.model.frozen_count()));
  if (!base && weights.params.size() != im.model.param_count())
    throw std::invalid_argument(fmt::format("init_from: {} parameters, the model has {}",
                                            weights.params.size(), im.model.param_count()));
  const auto recorded = weights.metadata.find("lockstep.model");
  if (im.cfg.model.type == "gpt" && recorded != weights.metadata.end()) {
    GptSpec file;
    try {
      file = parse_gpt_spec(recorded->second);
    } catch (const std::invalid_argument& e) {
      throw InputError(fmt::format("{}: {}", weights.file.string(), e.what()));
    }
    const GptSpec mine = gpt_spec(im.cfg, *im.train);
    const std::pair<std::string, std::string> differs = first_difference(file, mine);
    if (!differs.first.empty())
      throw InputError(fmt::format("{}: the file's model has {} {}, the config's model.{} is {}",
                                   weights.file.string(), differs.first, differs.second,
                                   differs.first, spec_value(mine, differs.first)));
  }
  // A base's eos ids too: the adapters' run samples and exports the same model's.
  keep_token_ids(weights.metadata, im.tokenizer_record);
  if (base) {  // a resume keeps its adapters, and needs the base again
    im.base = std::move(weights.params);
    im.base_source = std::filesystem::absolute(weights.file).lexically_normal().string();
    return;
  }
  im.resume.reset();
  im.resume_changes.clear();
  im.init = std::move(weights.params);
}

void Trainer::init_adapters(std::vector<float> adapters) {
  Impl& im = *impl_;
  if (adapters.size() != im.model.param_count() || im.model.frozen_count() == 0)
    throw std::invalid_argument(fmt::format("init_adapters: {} adapter values, the model has {}",
                                            adapters.size(), im.model.param_count()));
  im.resume.reset();
  im.resume_changes.clear();
  im.init = std::move(adapters);
}

// A checkpoint's adapters were trained on one base: resuming them on another would train a
// different model without a word.
void Trainer::Impl::check_resume_base(std::span<const float> base_weights) const {
  if (!resume) return;
  const auto it = resume->metadata.find("lockstep.lora_base");
  const std::string mine = base_hash(base_weights);
  if (it == resume->metadata.end() || it->second != mine)
    throw InputError(fmt::format(
        "{}: the adapters were trained on a base with content hash {}, this run's base has {}: "
        "resume with the same base (--init-from the directory the run started from)",
        resume->weights_file.string(),
        it == resume->metadata.end() ? std::string("(none recorded)") : it->second, mine));
}

void Trainer::request_stop() noexcept { impl_->stop_requested.store(true); }
std::int64_t Trainer::saving_step() const noexcept { return impl_->saving_step.load(); }

// Note [Memory plan]: the host's bytes against its limit; a GPU worker's against its device.
detail::MemoryPlan Trainer::Impl::check_memory(const Backend& b, const Config& cfg) const {
  const bool on_host = b.name() == "cpu";
  // Note [cuDNN attention memory]: its backward's workspace is the device's, not a layer's.
  const bool cudnn_attention = b.name() == "cuda" && cfg.model.type == "gpt" &&
                               attention_choice(cfg, b.name()).path == AttentionKind::fused;
  const detail::MemoryPlan plan =
      detail::plan_memory(cfg, model, *train, eval.get(), on_host, world(), cudnn_attention);
  const detail::MemoryLimit limit = detail::host_memory_limit();
  detail::check_memory_plan(plan, limit, cfg);
  if (!on_host)
    for (const DeviceInfo& d : b.devices())
      if (d.memory_bytes > 0 && plan.per_worker() > static_cast<double>(d.memory_bytes) &&
          std::find(cfg.trainer.devices.begin(), cfg.trainer.devices.end(), d.id) !=
              cfg.trainer.devices.end())
        throw InputError(fmt::format("{}: {} needs {} per worker; {}:{} has {}{}", cfg.source,
                                     plan.driver, detail::format_bytes(plan.per_worker()),
                                     d.backend, d.id,
                                     detail::format_bytes(static_cast<double>(d.memory_bytes)),
                                     detail::memory_suggestion(plan)));
  return plan;
}

std::string Trainer::memory_plan() const {
  const TrainerConfig& tc = impl_->cfg.trainer;
  const std::shared_ptr<Backend> backend =
      impl_->backend ? impl_->backend
                     : make_backend(tc.backend, tc.devices, {.comm = tc.comm, .precision = tc.precision});
  return detail::describe(impl_->check_memory(*backend), detail::host_memory_limit());
}

std::string Trainer::memory_plans_by_zero() const {
  const TrainerConfig& tc = impl_->cfg.trainer;
  const std::shared_ptr<Backend> backend =
      impl_->backend ? impl_->backend
                     : make_backend(tc.backend, tc.devices, {.comm = tc.comm, .precision = tc.precision});
  std::string out;
  for (int zero = 0; zero <= 2; ++zero) {
    Config cfg = impl_->cfg;  // the same run at another trainer.zero
    cfg.trainer.zero = zero;
    std::string line;
    try {
      line = detail::describe(impl_->check_memory(*backend, cfg), detail::host_memory_limit());
    } catch (const InputError& e) {
      line = fmt::format("does not fit: {}", e.what());
    }
    out += fmt::format("zero {}: {}\n", zero, line);
  }
  return out;
}

Summary Trainer::Impl::begin_summary(const Backend& b) const {
  Summary s;
  s.backend = std::string(b.name());
  s.devices = cfg.trainer.devices;
  const std::vector<DeviceInfo> infos = b.devices();
  const auto first = std::find_if(infos.begin(), infos.end(), [&](const DeviceInfo& d) {
    return d.id == s.devices.front() || d.backend == "cpu";  // any id names the host CPU
  });
  if (first != infos.end()) s.matmul = first->matmul;
  if (b.name() == "cuda") s.cudnn = cuda_support().cudnn;
  s.precision = to_string(cfg.trainer.precision);
  if (cfg.model.type == "gpt") {
    const AttentionChoice attention = attention_choice(cfg, b.name());
    s.attention = to_string(attention.path);
    s.attention_detail = attention.detail;
  }
  s.processes = processes ? processes->size() : 1;
  s.parameters = model.param_count();
  s.flops_per_token = cfg.model.type == "gpt" ? gpt_flops_per_token(gpt_spec(cfg, *train)) : 0.0;
  s.accumulate_steps = cfg.trainer.accumulate_steps;
  s.overlap = cfg.trainer.overlap;
  s.zero = cfg.trainer.zero;
  s.resumed_from_step = resume ? resume->state.step : 0;
  return s;
}

// Note [Bounded stop]
//   Every stop ends in bounded time, even when a worker is blocked where no abort reaches it (a
//   checkpoint write to a hung file system, a BLAS call retrying an allocation). run() does not
//   join blindly: it watches the workers (supervise). Once the run is aborted (a failure, the
//   watchdog), it waits trainer.stop_grace_s for every worker to return; once a stop is
//   requested (a signal), it waits that long for the workers to agree on it at the end of a
//   step, and then aborts the run and waits once more. A worker still out after that is
//   reported by rank, phase and step (Heartbeats::enter), left running (detached), and run()
//   throws WorkerError. Nothing such a worker can touch is ever freed: the run's own state
//   (RunResources, which also keeps the WorkerLoops of the workers that did return) is leaked,
//   and so is the Trainer's state when the Trainer is destroyed; all of it stays reachable from
//   the worker left behind, so a leak checker does not count it. The process should then exit,
//   which a CLI does at once.
//   Threads are started one by one; one that cannot be (the thread limit, ulimit -u) is
//   recorded as the run's failure and the run is aborted, so that no started thread waits for
//   it and none is left joinable (std::terminate).

// What the workers of one run share with run(): kept alive past run() when one is left behind.
struct Trainer::Impl::RunResources {
  // Note [Failure]'s teardown meeting; released for the workers left behind, so that the others
  // return, and so that a late arrival does not wait at all.
  class Teardown {
   public:
    explicit Teardown(int n) : waiting_(n) {}
    void arrive_and_wait() {
      std::unique_lock lock(mutex_);
      if (--waiting_ <= 0) cv_.notify_all();
      cv_.wait(lock, [&] { return waiting_ <= 0 || released_; });
    }
    void release() {
      std::lock_guard lock(mutex_);
      released_ = true;
      cv_.notify_all();
    }

   private:
    std::mutex mutex_;
    std::condition_variable cv_;
    int waiting_;
    bool released_ = false;
  };

  detail::Fault fault;
  double peak_flops = 0.0;
  std::shared_ptr<Backend> backend;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::optional<detail::DirLock> dir_lock;  // Note [One writer per checkpoint directory]
  std::unique_ptr<CheckpointManager> checkpoints;
  std::unique_ptr<detail::MetricsLog> metrics;
  std::unique_ptr<detail::RunReport> report;
  std::vector<float> initial;
  std::vector<float> base;  // the model's frozen parameters; empty without
  std::string base_source;  // Note [LoRA exports] in src/io/lora_checkpoint.cpp
  std::optional<detail::Trace> trace;
  detail::DeviceMemoryRecord device_memory;  // Note [Device memory measured]
  // Per group (the first, then the survivors' after each shrink); on the heap, so that a group's
  // worker left behind keeps them where it found them (abandoned_groups).
  std::unique_ptr<detail::Heartbeats> heartbeats;
  std::unique_ptr<detail::RunContext> context;
  detail::FailureLog failures;
  std::unique_ptr<Teardown> teardown;
  // Per local worker: running, waiting at the teardown meeting, or returned.
  enum Stage : int { running, at_teardown, returned };
  std::unique_ptr<std::atomic<int>[]> stage;
  std::atomic<bool> abandoning{false};            // some worker is being left behind
  std::mutex kept_mutex;
  std::vector<std::unique_ptr<detail::WorkerLoop>> kept_loops;  // of the workers that returned
  // Note [Shrink], step 1: a group whose lost worker was left behind, as that worker may still
  // touch it; and what the survivors' log line says of it.
  struct Group {
    std::vector<std::unique_ptr<Communicator>> comms;
    std::unique_ptr<detail::Heartbeats> heartbeats;
    std::unique_ptr<detail::RunContext> context;
    std::unique_ptr<Teardown> teardown;
    std::unique_ptr<std::atomic<int>[]> stage;
  };
  std::vector<Group> abandoned_groups;
  std::string left_running;
  // Note [Shrink]: per local worker, where a survivor stood; the first survivor's state (after
  // the step it reports); the state the survivors' run resumed from (null before a shrink);
  // when the run was aborted; the samples trained before that state.
  std::vector<std::optional<detail::SurvivorProgress>> stopped;
  std::optional<Checkpoint> recovery;
  std::optional<Checkpoint> recovered_from;
  detail::SnapshotSlot snapshot;  // trainer.snapshot_every
  detail::CarriedWindow carried;  // the survivors' context points here (Note [Window across a shrink])
  std::atomic<double> aborted_s{-1.0};
  std::int64_t samples_before = 0;
};

void Trainer::Impl::record(RunResources& r, int rank, std::exception_ptr error) const {
  r.failures.record(global_rank(rank), std::move(error),
                    std::string(r.backend->name()) + ":" + std::to_string(cfg.trainer.devices[rank]));
}

// The body of worker `rank`'s thread. See Note [Failure] in worker_loop.hpp.
void Trainer::Impl::work(RunResources& r, int rank) {
  // Read once: after a shrink the host thread rewrites the config and moves the group's state
  // (still alive) while a worker left behind (Note [Bounded stop]) may be on its way out.
  const int global = global_rank(rank);
  const detail::Fault& fault = r.context->fault;
  Communicator& comm = *r.comms[rank];
  auto loop = std::make_unique<detail::WorkerLoop>(*r.context, rank, comm);
  try {
    loop->run(*r.backend);
  } catch (...) {
    record(r, rank, std::current_exception());
    double never = -1.0;  // Note [Shrink]: the recovery's seconds count from the first abort
    r.aborted_s.compare_exchange_strong(never, steady_now_s());
    comm.abort();
    fault.after_loss(global, std::current_exception());
  }
  // See Note [Failure]: nothing of ours may be freed while a peer can still touch it.
  loop->drain();
  r.stage[rank].store(RunResources::at_teardown);
  r.teardown->arrive_and_wait();
  note_survivor(r, rank, *loop);
  if (r.abandoning.load()) {  // Note [Bounded stop]: kept, and reachable, for those left behind
    std::lock_guard lock(r.kept_mutex);
    r.kept_loops.push_back(std::move(loop));
  }
  r.stage[rank].store(RunResources::returned);
}

// Note [Shrink], step 2: on the worker's thread, after the teardown meeting (every failure is
// recorded, every peer drained). Nothing a failure here would change: the slot stays empty, and
// the rule does without it.
void Trainer::Impl::note_survivor(RunResources& r, int rank, detail::WorkerLoop& loop) const {
  if (cfg.trainer.on_worker_failure != WorkerFailurePolicy::shrink) return;
  const std::vector<int> lost = r.failures.lost_ranks();
  if (lost.empty() || std::find(lost.begin(), lost.end(), global_rank(rank)) != lost.end()) return;
  int first = 0;
  while (std::find(lost.begin(), lost.end(), global_rank(first)) != lost.end()) ++first;
  try {
    const detail::SurvivorProgress at = loop.progress();
    if (rank == first && at.lacks.empty() && cfg.trainer.zero == 0)
      r.recovery = loop.recovery_state();
    r.stopped[rank] = at;
  } catch (const std::exception&) {
  }
}

// Note [Shrink], step 3: the state the survivors go on from; nullopt when no worker was lost
// (or trainer.on_worker_failure is stop, or another failure is fatal), so that the run's
// failure is reported as always. Rethrows the loss, with why, when the run cannot go on.
std::optional<Trainer::Impl::Recovery> Trainer::Impl::recovery_point(RunResources& r) const {
  const TrainerConfig& tc = cfg.trainer;
  if (tc.on_worker_failure != WorkerFailurePolicy::shrink) return std::nullopt;
  const std::vector<int> lost = r.failures.lost_ranks();
  if (lost.empty() || !r.failures.only_losses()) return std::nullopt;
  const Checkpoint* start = r.recovered_from ? &*r.recovered_from : resume ? &*resume : nullptr;
  const auto step_of = [](const std::optional<Checkpoint>& c) {
    return c ? std::optional(c->state.step) : std::nullopt;
  };
  // The lost worker's step; a failure before the group's first step fails that step.
  detail::RecoveryInput in{.failed_step = (start ? start->state.step : 0) + 1,
                           .survivors = {},
                           .workers = static_cast<int>(r.comms.size()),
                           .min_workers = tc.min_workers,
                           .processes = processes ? processes->size() : 1,
                           .zero = tc.zero,
                           .stored = {}};
  for (int rank = 0; rank < in.workers; ++rank) {
    if (std::find(lost.begin(), lost.end(), global_rank(rank)) != lost.end())
      in.failed_step = std::max(in.failed_step, r.heartbeats->step(rank));
    else
      in.survivors.push_back({.rank = rank, .progress = r.stopped[rank]});
  }
  std::optional<Checkpoint> snapshot = r.snapshot.newest(), saved;
  // The checkpoint on disk is read only where the survivors hold no common state.
  if (!tc.checkpoint.dir.empty() && !detail::common_state(in.survivors, in.zero).step) {
    try {
      saved = CheckpointManager(tc.checkpoint.dir, 0).load_latest();
    } catch (const std::exception&) {  // none valid, or unreadable: as if there were none
    }
  }
  in.stored = {.group_start = start ? std::optional(start->state.step) : std::nullopt,
               .snapshot = step_of(snapshot),
               .checkpoint = step_of(saved)};
  const detail::RecoveryChoice choice = detail::choose_recovery(in);
  const char* start_is = r.recovered_from ? "the last recovery's state" : "the resumed checkpoint";
  Recovery out{.from = {}, .failed_step = in.failed_step, .redone = choice.redone, .state = {}};
  const std::string why = choice.why.empty() ? "" : fmt::format(" ({})", choice.why);
  switch (choice.source) {
    case detail::RecoverySource::none:
      r.failures.rethrow_first(
          fmt::format("; trainer.on_worker_failure: shrink cannot go on: {}", choice.why));
      return std::nullopt;  // not reached: rethrow_first throws
    case detail::RecoverySource::survivors:
      if (!r.recovery) {  // the first survivor could not copy it: the run stops as it would
        r.failures.rethrow_first("; trainer.on_worker_failure: shrink cannot go on: the first "
                                 "survivor could not copy its state");
        return std::nullopt;
      }
      out.from = std::move(*r.recovery);
      out.state = fmt::format("the start of step {} (parameter hash {:016x})", choice.step + 1,
                              r.stopped[in.survivors.front().rank]->param_hash);
      break;
    case detail::RecoverySource::group_start:
      out.from = *start;
      out.state = choice.why.empty()
                      ? fmt::format("the start of step {} ({})", choice.step + 1, start_is)
                      : fmt::format("{} of step {}{}", start_is, choice.step, why);
      break;
    case detail::RecoverySource::snapshot:
      out.from = std::move(*snapshot);
      out.state = fmt::format("the snapshot of step {}{}", choice.step, why);
      break;
    case detail::RecoverySource::checkpoint:
      out.from = std::move(*saved);
      out.state = fmt::format("the checkpoint on disk in {} of step {}{}", tc.checkpoint.dir,
                              choice.step, why);
      break;
  }
  return out;
}

// Note [Shrink], step 4: the survivors' group, on their devices, from `from`. Between groups,
// when no worker thread runs; cfg.trainer.devices and total_steps become the survivors' (run()
// puts them back).
void Trainer::Impl::shrink(RunResources& r, Recovery recovery) {
  Checkpoint& from = recovery.from;
  const std::vector<int> lost = r.failures.lost_ranks();
  std::vector<int> survivors;
  std::vector<std::string> lost_devices;
  for (int rank = 0; rank < static_cast<int>(r.comms.size()); ++rank)
    if (std::find(lost.begin(), lost.end(), global_rank(rank)) == lost.end())
      survivors.push_back(cfg.trainer.devices[rank]);
    else
      lost_devices.push_back(fmt::format("{}:{}", r.backend->name(), cfg.trainer.devices[rank]));
  // Every lost worker's error: two may be lost in one step.
  const std::string error = fmt::format("{}", fmt::join(r.failures.losses(), "; "));
  const std::int64_t failed_step = recovery.failed_step;
  // A fault at or before the failed step has struck, or will never strike now.
  if (r.fault.step <= failed_step) r.fault = {};
  const detail::SurvivorsBatch batch = detail::survivors_batch(
      static_cast<int>(cfg.trainer.devices.size()), static_cast<int>(survivors.size()),
      cfg.trainer.accumulate_steps, cfg.data.batch_size, cfg.trainer.keep_global_batch);
  cfg.trainer.accumulate_steps = summary.accumulate_steps = batch.accumulate_steps;
  cfg.trainer.devices = survivors;
  total_steps = compute_total_steps();
  r.samples_before += from.state.samples - (r.recovered_from ? r.recovered_from->state.samples
                                            : resume                ? resume->state.samples
                                                                    : 0);
  // Note [Window across a shrink] in recovery.hpp, before make_context() forgets where the
  // survivors stood.
  std::vector<std::optional<detail::SurvivorProgress>> standing;
  for (int rank = 0; rank < static_cast<int>(r.comms.size()); ++rank)
    if (std::find(lost.begin(), lost.end(), global_rank(rank)) == lost.end())
      standing.push_back(r.stopped[rank]);
  r.carried = detail::carried_window(standing, from.state.step);
  const double start_s = r.context->start_s;
  if (r.abandoning.load())  // step 1: what the worker left behind may touch stays where it is
    r.abandoned_groups.push_back({.comms = std::move(r.comms),
                                  .heartbeats = std::move(r.heartbeats),
                                  .context = std::move(r.context),
                                  .teardown = std::move(r.teardown),
                                  .stage = std::move(r.stage)});
  r.comms.clear();
  r.comms = r.backend->create_communicators(cfg.trainer.devices, processes);
  summary.communicator = r.comms.front()->describe();
  r.failures.clear();
  r.recovery.reset();
  r.recovered_from = std::move(recovery.from);
  const double seconds = steady_now_s() - r.aborted_s.load();
  r.aborted_s.store(-1.0);
  make_context(r, &*r.recovered_from, start_s);
  r.context->carried_window = &r.carried;
  summary.devices = cfg.trainer.devices;
  summary.workers_lost += static_cast<int>(lost.size());
  summary.recoveries += 1;
  summary.steps_redone += recovery.redone;
  summary.recovery_s += seconds;
  if (r.metrics)
    r.metrics->write(detail::Recovery{.step = failed_step,
                                      .lost = fmt::format("{}", fmt::join(lost_devices, ",")),
                                      .workers = static_cast<int>(survivors.size()),
                                      .steps_redone = recovery.redone,
                                      .recovery_s = seconds});
  fmt::print(stderr,
             "note: {}; {}going on with {} worker{} ({}:{}, {}) from {}, {} steps redone, {:.2f} s "
             "after the abort (trainer.on_worker_failure: shrink)\n",
             error, std::exchange(r.left_running, {}), survivors.size(),
             survivors.size() == 1 ? "" : "s", r.backend->name(), fmt::join(survivors, ","), batch.words,
             recovery.state, recovery.redone, seconds);
}

// Waits for the workers as Note [Bounded stop] says. Returns the local ranks left behind.
std::vector<int> Trainer::Impl::supervise(RunResources& r) {
  const int n = static_cast<int>(r.comms.size());
  const double grace = cfg.trainer.stop_grace_s;
  double stop_s = -1, abort_s = -1;
  const auto out = [&](int stage) {
    std::vector<int> ranks;
    for (int rank = 0; rank < n; ++rank)
      if (r.stage[rank].load() < stage) ranks.push_back(rank);
    return ranks;
  };
  while (true) {
    if (out(RunResources::returned).empty()) return {};
    const double now = steady_now_s();
    if (stop_s < 0 && stop_requested.load()) stop_s = now;
    if (abort_s < 0 && r.comms[0]->aborted()) abort_s = now;
    if (abort_s < 0 && stop_s >= 0 && now - stop_s > grace) {
      const int behind = r.heartbeats->quiet(now).behind;
      record(r, behind, std::make_exception_ptr(std::runtime_error(fmt::format(
                            "a stop was requested {:.1f} s ago (trainer.stop_grace_s: {}), and "
                            "this worker has not reached the end of its step: it is in {} at "
                            "step {}; the run is aborted",
                            now - stop_s, grace, r.heartbeats->phase(behind),
                            r.heartbeats->step(behind)))));
      r.comms[0]->abort();
    }
    if (abort_s >= 0 && now - abort_s > grace) {
      // Those waiting at the teardown meeting return once it is released: only the others
      // are left behind.
      r.abandoning.store(true);
      const std::vector<int> behind = out(RunResources::at_teardown);
      r.teardown->release();
      return behind;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// One thread per local worker, and the watchdog while they run. Returns the local ranks left
// behind (Note [Bounded stop]); empty when every worker returned.
std::vector<int> Trainer::Impl::run_workers(RunResources& r) {
  const int n = static_cast<int>(r.comms.size());
  r.teardown = std::make_unique<RunResources::Teardown>(n);
  r.stage = std::make_unique<std::atomic<int>[]>(n);
  for (int rank = 0; rank < n; ++rank) r.stage[rank].store(RunResources::running);
  r.snapshot.start_group(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int rank = 0; rank < n; ++rank) {
    try {
      threads.push_back(detail::start_thread(fmt::format("the thread of worker {}", rank),
                                             [this, &r, rank] { work(r, rank); }));
    } catch (const std::exception&) {
      // The ranks that never started stand aside: the started ones must not wait for them.
      record(r, rank, std::current_exception());
      r.comms[0]->abort();
      for (int missing = rank; missing < n; ++missing)
        r.stage[missing].store(RunResources::returned);
      r.teardown->release();
      break;
    }
  }
  std::vector<int> behind;
  {
    std::optional<detail::Watchdog> watchdog;
    try {
      watchdog.emplace(*r.heartbeats, cfg.trainer.step_timeout_s, global_rank(0), *r.comms[0],
                       [&](int rank, const std::string& message) {
                         record(r, rank, std::make_exception_ptr(std::runtime_error(message)));
                       });
    } catch (const std::exception&) {
      record(r, 0, std::current_exception());
      r.comms[0]->abort();
    }
    behind = supervise(r);
  }
  for (std::size_t rank = 0; rank < threads.size(); ++rank) {
    const bool left = std::find(behind.begin(), behind.end(), rank) != behind.end();
    if (left) threads[rank].detach();
    else threads[rank].join();
  }
  return behind;
}

// The error for workers left behind (Note [Bounded stop]), with the failure that stopped the run.
WorkerError Trainer::Impl::left_behind(const RunResources& r, const std::vector<int>& ranks) const {
  std::string cause;
  try {
    r.failures.rethrow_first();
  } catch (const std::exception& e) {
    cause = fmt::format("; the run had stopped for: {}", e.what());
  }
  std::vector<std::string> who;
  for (const int rank : ranks)
    who.push_back(fmt::format("worker {} ({}:{}) in {} at step {}", global_rank(rank),
                              r.backend->name(), cfg.trainer.devices[rank],
                              r.heartbeats->phase(rank), r.heartbeats->step(rank)));
  return WorkerError(global_rank(ranks.front()),
                     fmt::format("{}:{}", r.backend->name(), cfg.trainer.devices[ranks.front()]),
                     fmt::format("did not return within trainer.stop_grace_s = {} s of the stop, "
                                 "and is left running: {}{}",
                                 cfg.trainer.stop_grace_s, fmt::join(who, "; "), cause));
}

// Note [Shrink], step 1: where every worker left behind is one whose device was lost, and the
// run may shrink, the survivors go on without it, and this says so; nullopt otherwise.
std::optional<std::string> Trainer::Impl::lost_left_behind(const RunResources& r,
                                                           const std::vector<int>& ranks) const {
  if (cfg.trainer.on_worker_failure != WorkerFailurePolicy::shrink || !r.failures.only_losses())
    return std::nullopt;
  const std::vector<int> lost = r.failures.lost_ranks();
  std::vector<std::string> who;
  for (const int rank : ranks) {
    if (std::find(lost.begin(), lost.end(), global_rank(rank)) == lost.end()) return std::nullopt;
    who.push_back(fmt::format("worker {}'s thread ({} at step {})", global_rank(rank),
                              r.heartbeats->phase(rank), r.heartbeats->step(rank)));
  }
  return fmt::format("{} did not return within trainer.stop_grace_s = {} s and is left running; ",
                     fmt::join(who, ", "), cfg.trainer.stop_grace_s);
}

// Everything a run needs before its threads start.
std::unique_ptr<Trainer::Impl::RunResources> Trainer::Impl::prepare_run() {
  const TrainerConfig& tc = cfg.trainer;
  auto r = std::make_unique<RunResources>();
  r->fault = detail::fault_from_environment();
  check_processes_agree();
  if (process_rank() == 0) {  // Note [Checking an output]
    detail::run_files(cfg).check();  // Note [An output is never an input]
    if (!resume) detail::check_checkpoint_dir_for_new_run(cfg);
    if (!tc.trace.empty()) detail::prepare_output_file(tc.trace, "trainer.trace");
    if (!tc.metrics.empty()) detail::prepare_output_file(tc.metrics, "trainer.metrics");
    if (!tc.report.empty()) detail::prepare_output_file(tc.report, "trainer.report");
    detail::check_output_dir(tc.checkpoint.dir, "trainer.checkpoint.dir");
  }
  r->backend = backend ? backend
                       : make_backend(tc.backend, tc.devices, {.comm = tc.comm, .precision = tc.precision});
  const detail::MemoryPlan memory_plan = check_memory(*r->backend);
  if (tc.on_worker_failure == WorkerFailurePolicy::shrink &&
      !r->backend->rebuilds_communicators(tc.devices))
    throw InputError(fmt::format(
        "{}: trainer.on_worker_failure: shrink needs communicators that can be rebuilt over the "
        "surviving devices, which the {} backend cannot do yet for these devices (the CUDA "
        "backend can for replicas of one GPU, trainer.comm peer); use stop",
        cfg.source, r->backend->name()));
  // Before the communicators' buffers and the workers' arenas (Note [Device memory measured]).
  r->device_memory.take_baseline(r->backend->name(), tc.devices);
  r->comms = r->backend->create_communicators(tc.devices, processes);
  const int n = static_cast<int>(r->comms.size());
  const bool writer = process_rank() == 0;  // Note [Processes]
  r->fault.check_reached(r->comms[0]->size(), resume ? resume->state.step : 0, total_steps);

  summary = begin_summary(*r->backend);
  summary.communicator = r->comms[0]->describe();
  summary.memory_plan = detail::describe(memory_plan, detail::host_memory_limit());
  summary.param_bytes = static_cast<std::size_t>(memory_plan.parameters);
  summary.grad_bytes = static_cast<std::size_t>(memory_plan.gradients);
  summary.activation_bytes = static_cast<std::size_t>(memory_plan.activations);
  summary.planned_worker_bytes = static_cast<std::size_t>(memory_plan.per_worker());
  const auto cost = [](const detail::MemoryPlan& plan, const Model& m) {
    return Summary::TrainingCost{m.param_count(), m.frozen_count(),
                                 static_cast<std::size_t>(plan.gradient_wire),
                                 static_cast<std::size_t>(plan.optimizer)};
  };
  summary.training = cost(memory_plan, model);
  if (model.frozen_count() > 0) {  // LoRA: against a full fine-tune of the same model
    Config full_cfg = cfg;
    full_cfg.model.lora.rank = 0;
    const Model full = make_model(full_cfg, *train, r->backend->name());
    summary.full_finetune = cost(detail::plan_memory(full_cfg, full, *train, eval.get(),
                                                     r->backend->name() == "cpu", world()),
                                 full);
  }
  final_params.clear();
  const double peak = job_peak_flops(*r->backend, tc.devices, tc.precision) * summary.processes;
  r->trace.emplace(n, !tc.trace.empty());
  if (!tc.checkpoint.dir.empty() && writer) {
    r->dir_lock.emplace(tc.checkpoint.dir);
    detail::remove_stale_temp_files(tc.checkpoint.dir);  // what a killed save left
    // Starting over, as asked: none of another run's checkpoints is left to pass for this one's.
    if (!resume && tc.checkpoint.overwrite) CheckpointManager(tc.checkpoint.dir, 0).remove_all();
  }
  if (!tc.checkpoint.dir.empty() && writer)
    r->checkpoints = std::make_unique<CheckpointManager>(tc.checkpoint.dir, tc.checkpoint.keep_last);
  if (!tc.metrics.empty() && writer) {
    r->metrics = std::make_unique<detail::MetricsLog>(tc.metrics);
    r->metrics->write(detail::RunStart{
        .start_time = std::time(nullptr),
        .config_hash = config_hash(cfg),
        .resumed_from_step = resume ? resume->state.step : 0,
        .resumed_from = resume ? resume->weights_file.string() : std::string(),
        .steps = total_steps,
        .workers = world()});
  }
  if (!tc.report.empty() && writer) r->report = std::make_unique<detail::RunReport>(tc.report);
  if (!resume) r->initial = !init.empty() ? init : model.initial_parameters(tc.seed);
  if (model.frozen_count() > 0) {
    r->base = !base.empty() ? base : model.initial_frozen(tc.seed);
    r->base_source = !base.empty() ? base_source : fmt::format("seed={}", tc.seed);
    check_resume_base(r->base);
  }
  r->peak_flops = peak;
  make_context(*r, resume ? &*resume : nullptr, steady_now_s());
  return r;
}

// What the workers of one group see: the run's context from `from` (null: a fresh run), with
// fresh heartbeats. Again for the survivors after a shrink, with the run's first start_s.
void Trainer::Impl::make_context(RunResources& r, const Checkpoint* from, double start_s) {
  r.heartbeats = std::make_unique<detail::Heartbeats>(static_cast<int>(r.comms.size()), steady_now_s());
  r.stopped.assign(r.comms.size(), std::nullopt);
  r.context = std::make_unique<detail::RunContext>(detail::RunContext{.cfg = cfg,
                                       .model = model,
                                       .train = train,
                                       .eval = eval,
                                       .callbacks = callbacks,
                                       .resume = from,
                                       .initial = r.initial,
                                       .base = r.base,
                                       .base_source = r.base_source,
                                       .total_steps = total_steps,
                                       .start_s = start_s,
                                       .peak_flops = r.peak_flops,
                                       .fault = r.fault,
                                       .stop_requested = stop_requested,
                                       .saving_step = saving_step,
                                       .trace = *r.trace,
                                       .heartbeats = *r.heartbeats,
                                       .checkpoints = r.checkpoints.get(),
                                       .metrics = r.metrics.get(),
                                       .report = r.report.get(),
                                       .snapshot = r.snapshot,
                                       .summary = summary,
                                       .device_memory = r.device_memory,
                                       .final_params = final_params,
                                       .tokenizer_record = tokenizer_record});
}

Summary Trainer::run() {
  Impl& im = *impl_;
  const TrainerConfig& tc = im.cfg.trainer;
  std::unique_ptr<Impl::RunResources> r = im.prepare_run();
  // Note [Shrink]: the survivors' devices, accumulation and step count hold for this run only.
  struct Restore {
    Impl& im;
    TrainerConfig trainer;
    std::int64_t total_steps;
    ~Restore() {
      if (im.abandoned) return;  // Note [Bounded stop]: a worker left behind may read them
      im.cfg.trainer = std::move(trainer);
      im.total_steps = total_steps;
    }
  } restore{im, tc, im.total_steps};
  // Note [Bounded stop]: a worker left behind may still use the run's resources.
  struct Leak {
    Impl& im;
    std::unique_ptr<Impl::RunResources>& r;
    ~Leak() {
      if (im.abandoned) (void)r.release();
    }
  } leak{im, r};
  while (true) {
    const std::vector<int> behind = im.run_workers(*r);
    if (!behind.empty()) {
      im.abandoned = true;
      std::optional<std::string> lost = im.lost_left_behind(*r, behind);
      if (!lost) throw im.left_behind(*r, behind);
      r->left_running = std::move(*lost);
    }
    std::optional<Impl::Recovery> recovery = im.recovery_point(*r);
    if (!recovery) break;
    im.shrink(*r, std::move(*recovery));
  }
  im.summary.samples += r->samples_before;
  const double start_s = r->context->start_s;
  im.summary.wall_s = steady_now_s() - start_s;
  if (r->trace->enabled() && im.process_rank() == 0) r->trace->write_json(tc.trace, start_s);

  r->failures.rethrow_first();
  im.summary.samples_per_s = im.summary.samples / std::max(1e-9, im.summary.wall_s);
  im.summary.tokens_per_s = im.summary.samples_per_s * im.train->targets();
  im.summary.loss_tokens_per_s =
      static_cast<double>(im.summary.loss_tokens) / std::max(1e-9, im.summary.wall_s);
  if (const auto* chat = dynamic_cast<const ChatDataset*>(im.train.get()))
    im.summary.skipped_records = static_cast<std::int64_t>(chat->skipped());
  im.summary.mfu = r->context->mfu(im.summary.tokens_per_s);
  im.summary.step_mfu = r->context->mfu(im.summary.step_tokens_per_s);
  im.summary.peak_rss_bytes = detail::peak_resident_bytes();
  im.summary.device_memory = r->device_memory.figures();
  if (r->report) r->report->write(im.cfg, im.summary);
  return im.summary;
}

}  // namespace lockstep
