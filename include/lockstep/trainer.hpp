// The data-parallel trainer.
//
//   lockstep::Config cfg = lockstep::load_config("configs/quickstart.yaml");
//   auto split = lockstep::load_dataset(cfg);
//   lockstep::Trainer trainer(cfg, split.train, split.eval);
//   trainer.on_step([](const lockstep::StepMetrics& m) { std::printf("%lld %f\n", m.step, m.loss); });
//   lockstep::Summary s = trainer.run();
//
// run() starts one std::thread per configured device. Each worker owns a replica of the model
// (copied from parameters initialised once on the host), its own data shard and its own
// communicator. Each step: forward, backward, all-reduce (average) of the gradients, optimiser
// step, barrier. Every replica applies the same update, and the trainer proves they stay
// identical by comparing parameter hashes. If any worker throws, every worker stops and run()
// rethrows that error as a WorkerError (InputError passes through unchanged).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/checkpoint.hpp"
#include "lockstep/config.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/export.hpp"
#include "lockstep/model.hpp"

namespace lockstep {

class Backend;
class ProcessGroup;

// Averaged over every worker's batch. Delivered on rank 0's thread every log_every steps,
// and for the final step.
struct LOCKSTEP_API StepMetrics {
  std::int64_t step = 0;        // 1-based, after the update
  std::int64_t total_steps = 0;
  std::uint64_t epoch = 0;
  double loss = 0.0;
  double accuracy = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;       // of the averaged gradient, before clipping
  double samples_per_s = 0.0;   // global, since the previous report
  double tokens_per_s = 0.0;    // predictions per second: samples/s x targets per sample
  double mfu = 0.0;             // model FLOPs utilisation (see Summary::mfu)
  double elapsed_s = 0.0;
  // Global rank 0's, over the log window (on_step; 0 in on_progress): the share of all-reduce
  // time hidden behind backward, and the time spent waiting for data.
  double comm_hidden_fraction = 0.0;
  double data_wait_s = 0.0;
};

struct LOCKSTEP_API EvalMetrics {
  std::int64_t step = 0;
  double loss = 0.0;
  double accuracy = 0.0;
  std::size_t samples = 0;
};

// Where one worker's time went over the run, in seconds.
struct LOCKSTEP_API WorkerTimes {
  double total_s = 0.0;           // the training loop, first step to last
  double compute_s = 0.0;         // the rest: forward, backward, optimiser, eval
  double comm_exposed_s = 0.0;    // blocked waiting for gradient all-reduces
  double data_wait_s = 0.0;
  double barrier_wait_s = 0.0;
  std::size_t optimizer_state_bytes = 0;  // held on this worker's device (1/N with trainer.zero)
  // Gradients held on this worker's device: the whole buffer, or with trainer.zero 2 its shards
  // and the buckets' buffers (Note [ZeRO-2] in src/train/reducer.hpp).
  std::size_t gradient_bytes = 0;
};

struct LOCKSTEP_API Summary {
  std::string backend;
  std::string matmul;           // the first device's DeviceInfo::matmul: the matrix-product path
  std::string precision = "fp32";  // trainer.precision, the arithmetic the run computed in
  // A GPT's attention as model.attention resolved on this backend: "fused" or "materialized"
  // (empty for an MLP), and what that is and why (AttentionChoice::detail).
  std::string attention;
  std::string attention_detail;
  // On cuda, what runs the fused attention (CudaSupport::cudnn); empty elsewhere.
  std::string cudnn;
  // What moves the gradients between workers (Communicator::describe; trainer.comm as it
  // resolved): the survivors' after a shrink.
  std::string communicator;
  std::vector<int> devices;     // this process's
  int processes = 1;            // of the job; workers = devices.size() x processes
  std::int64_t steps = 0;
  std::int64_t samples = 0;     // training samples consumed, over all workers
  double wall_s = 0.0;
  double samples_per_s = 0.0;
  // Language models: tokens/s is samples/s x context (one prediction per token). flops_per_token
  // is gpt_flops_per_token() (0 for an MLP); mfu = flops_per_token x tokens/s / the summed peak
  // FLOP/s of every worker's device (peak_flops() by name and trainer.precision), 0 when a peak
  // is unknown, as for the CPU.
  double tokens_per_s = 0.0;
  double flops_per_token = 0.0;
  // Data whose labels may not count (Dataset::masks_targets, a chat dataset): the labels that
  // counted toward the loss in this run, over all workers, and their rate; and the bad records
  // its loader left out (data.skip_bad_records).
  bool masked = false;
  std::int64_t loss_tokens = 0;
  double loss_tokens_per_s = 0.0;
  std::int64_t skipped_records = 0;
  double mfu = 0.0;
  // The steady step, for a language model: the (upper) median over the steps after the first two (the
  // first build the libraries' plans and warm the caches; every step of a run of three or fewer)
  // of each step's own rate, its tokens over the seconds since the step before it was reported
  // (worker 0's clock); 0 without a step; and its MFU. tokens_per_s and mfu above are the whole
  // run's, its start (the model built on the host and copied to every device), final eval and
  // replica check included: for a short run of a large model most of its wall time.
  double step_tokens_per_s = 0.0;
  double step_mfu = 0.0;
  double final_train_loss = 0.0;      // the mean over the last log window (StepMetrics)
  double final_train_accuracy = 0.0;
  double eval_loss = 0.0;       // NaN when there is no eval split, or the run was stopped
  double eval_accuracy = 0.0;
  bool replicas_identical = false;
  std::int64_t replica_checks = 0;
  std::uint64_t param_hash = 0;
  std::size_t parameters = 0;
  int accumulate_steps = 1;
  std::size_t buckets = 0;
  // Gradient bytes each worker hands to its collectives per step: 4 per parameter, 2 with
  // trainer.grad_reduce_dtype bf16 (Note [bf16 gradient reduction] in src/train/reducer.hpp).
  std::size_t reduce_bytes_per_step = 0;
  std::string reduce_dtype = "fp32";
  bool overlap = true;
  // Where the collectives ran: "async" (the communication thread on the CPU, streams on a GPU)
  // or "inline" (the worker's own thread; see Note [Inline collectives] in src/train/reducer.hpp).
  std::string comm_mode = "async";
  // Where batches were assembled: "thread" (each worker's loader thread, data.prefetch ahead) or
  // "inline" (the worker's own thread; Note [Inline loader] in src/train/worker_loop.cpp).
  std::string loader = "thread";
  int zero = 0;                          // trainer.zero
  std::size_t optimizer_state_bytes = 0;  // the most any worker holds (see worker_times)
  // One worker's bytes by the memory plan (Note [Memory plan]): the parameters, the gradients
  // (with trainer.grad_reduce_dtype bf16 also the reducer's bf16 copy), and the activations,
  // saved tensors, scratch and activation gradients of one micro-batch.
  std::size_t param_bytes = 0, grad_bytes = 0, activation_bytes = 0;
  std::size_t planned_worker_bytes = 0;  // the plan's total per worker, these and the rest
  // What is trained (Note [Frozen parameters] in src/model/lora.cpp): the parameters with
  // gradients and optimiser state, the frozen ones (a LoRA model's base), the gradient bytes a
  // worker hands to its collectives per step, and the plan's optimiser-state bytes per worker.
  struct TrainingCost {
    std::size_t trainable_parameters = 0, frozen_parameters = 0, gradient_bytes_per_step = 0,
                optimizer_state_bytes = 0;
  };
  TrainingCost training;
  // With model.lora: the same for a full fine-tune of the same model (every weight trained),
  // from its memory plan, for comparison.
  std::optional<TrainingCost> full_finetune;
  // Waits of the host for a device (Note [Host syncs] in device.hpp) in one step, the most of
  // any worker and any step after the first (eval, replica checks and checkpoints excluded).
  std::uint64_t host_syncs_per_step = 0;
  // The share of a step's time its device was busy with it (Note [Device step time] in
  // device.hpp): the median over the steps after the first of the device's time for the step
  // over the host's, the least of any worker. nullopt on the CPU, whose device is the host.
  std::optional<double> device_busy;
  // The linear maps' products over the run, every worker's together, by how they ran (Note
  // [Fused linear] in device.hpp): all composed on the CPU; on a GPU, any partial or composed
  // one is a cuBLASLt refusal, reported once on stderr with its shape and reason.
  LinearCounts fused_linear;
  // trainer.cuda_graphs (Note [Step graphs] in src/train/step_graphs.hpp): whether the
  // micro-batches ran as device graphs to the run's end, else why not; auto's medians of a
  // step's wall time without and with them (seconds; 0: not timed), every worker's together;
  // worker 0's graphs captured and parts launched as graphs.
  struct Graphs {
    bool used = false;
    std::string why_not;
    double eager_step_s = 0.0, graph_step_s = 0.0;
    std::uint64_t captured = 0, launched = 0;
    // Parts run as launched while graphs were on (worker 0): a new key's first run, and each
    // run of a key whose capture was refused; `refused` such keys, the first one's reason in
    // `refusal` (Note [Step graphs]).
    std::uint64_t eager = 0, refused = 0;
    std::string refusal;
  } graphs;

  // Where the time went, per worker, averaged over workers (seconds over the whole run).
  double data_wait_s = 0.0;       // waiting for the loader
  double barrier_wait_s = 0.0;    // waiting at the end-of-step barrier
  double comm_s = 0.0;            // gradient all-reduce, start to end
  double comm_exposed_s = 0.0;    // blocked waiting for the all-reduce
  double comm_hidden_fraction = 0.0;  // 1 - exposed / comm: the share hidden behind backward

  std::vector<WorkerTimes> worker_times;  // indexed by rank

  std::int64_t resumed_from_step = 0;  // 0 when the run started from scratch
  bool stopped_early = false;          // request_stop() ended the run before `steps`
  std::int64_t nonfinite_skips = 0;    // updates dropped by on_nonfinite: skip
  // trainer.on_worker_failure: shrink (Note [Shrink] in src/train/recovery.hpp): workers whose
  // device was lost, the times the run went on without them, the steps whose update had been
  // applied and that were taken again for it, and the seconds from the abort to the survivors' restart, over the run. devices,
  // worker_times and the time accounting are then the last survivors'.
  int workers_lost = 0;
  int recoveries = 0;
  std::int64_t steps_redone = 0;
  double recovery_s = 0.0;
  std::string last_checkpoint;         // the weights file of the last checkpoint written
  std::string memory_plan;             // Trainer::memory_plan(), as checked before step 1
  // Measured: the process's peak resident memory (ru_maxrss) at the run's end, bytes; and on
  // a GPU, per GPU of this process, the memory in use as its driver counts it, every process's
  // and context's (Note [Device memory measured] in src/train/device_memory.hpp): before the run
  // allocated, and the most after the workers' last step (the run's peak). Empty on the CPU.
  std::size_t peak_rss_bytes = 0;
  struct DeviceMemory {
    int device = 0;
    std::size_t total_bytes = 0, baseline_bytes = 0, peak_bytes = 0;
  };
  std::vector<DeviceMemory> device_memory;

  std::string to_json() const;
};

// "cpu (4 workers: 2 processes x devices 0,1)": the backend and every worker of the job.
LOCKSTEP_API std::string describe_backend(const Summary& s);
// "3538944 bytes per worker at most (ZeRO-1: sharded across workers)".
LOCKSTEP_API std::string describe_optimizer_state(const Summary& s);
// "parameters 19240 B, gradients 19240 B, optimizer state 19240 B, activations 34048 B": one
// worker's memory by part, for the summary.
LOCKSTEP_API std::string describe_worker_memory(const Summary& s);
// "1.6 M of 136.1 M parameters (frozen 134.5 M); gradients 6.3 MiB per step, 85x fewer than a
// full fine-tune's 513.1 MiB; optimiser state 12.6 MiB, 85x less than 1.0 GiB"; empty without
// a full_finetune to compare.
LOCKSTEP_API std::string describe_training_cost(const Summary& s);
// trainer.cuda_graphs as the run used them: "on (12 captured, 380 launches)", "off (why)".
LOCKSTEP_API std::string describe_graphs(const Summary::Graphs& g);
// "cuda:0 4.2 GiB at the peak, 512.0 MiB of it before the run (...), 3.7 GiB added by the
// run; 139.8 GiB on the GPU": one GPU's Summary::device_memory.
LOCKSTEP_API std::string describe_device_memory(const Summary::DeviceMemory& g);
// "1 (1 recovery, 0 steps redone, 0.02 s; ...)": the workers lost and what it took to go on.
LOCKSTEP_API std::string describe_recoveries(const Summary& s);

// Test hooks: called on each worker's thread with its global rank. A throw here behaves like a
// failure in that worker (fault injection). The environment variable LOCKSTEP_FAULT=RANK:STEP:KIND
// injects one fault without code, in the worker of global RANK (process RANK / devices, under
// mpirun): KIND is forward (throw before forward), loader (throw on the loader
// thread), nan (a NaN gradient), stall (the worker stops making progress until the run is
// aborted; set trainer.step_timeout_s), block (deaf to aborts at the end of STEP), hang (a
// device wait that only the abort ends), slowsave (a slow checkpoint save at STEP) or lost (the
// worker's device dies: DeviceLost, in the phase lost:forward, lost:backward, lost:all-reduce or
// lost:update names, and lost:...:stuck leaves its thread stuck); see
// src/train/fault_injection.hpp.
struct LOCKSTEP_API TrainerHooks {
  // As the worker's set-up has loaded the state it starts from, before the replicas' broadcast;
  // again for each survivor's set-up after a shrink.
  std::function<void(int rank)> restoring;
  std::function<void(int rank, std::int64_t step)> before_forward;
  // After the optimiser step, once the step's record is read (mostly during the next step, its
  // first forward queued: Note [Deferred step read]), before the step's barrier; the replica
  // holds the step's updated parameters.
  std::function<void(int rank, std::int64_t step, Replica& replica)> after_update;
  // false: no warm-up before step 1 (Replica::warm_up), so that a test can see what it saves.
  bool warm_up = true;
  // false: every step's record is read at the step's end, before the next step is queued, not
  // during the next step (Note [Deferred step read]), so that a test can compare the two.
  bool defer_read = true;
};

// The model a config describes for a dataset: an MLP from its features to its classes, or a GPT
// (model.type gpt) over its token windows, with vocab_size from the config or else the data.
// InputError when the data does not fit the model (a GPT needs windows of model.context).
// A GPT's blocks run model.attention as choose_attention resolves it on `backend` ("cpu",
// "cuda"; empty: the backend make_backend would make for trainer.backend and trainer.devices).
LOCKSTEP_API Model make_model(const Config& config, const Dataset& train,
                              std::string_view backend = {});
// model.attention resolved for `backend` (empty: as make_model resolves it); packed chat data
// (data.pack) on cuda takes the materialised path (Note [Packed attention] in
// src/model/attention.hpp).
LOCKSTEP_API AttentionChoice attention_choice(const Config& config, std::string_view backend = {});
// The GPT a config describes for a dataset (model.type gpt), as make_model builds it.
LOCKSTEP_API GptSpec gpt_spec(const Config& config, const Dataset& train);
// The decoder the model.* keys describe, with `vocab_size`; settings that change nothing are
// left at GptSpec's defaults (n_kv_head = n_head as 0, ...), so that one model has one
// description.
LOCKSTEP_API GptSpec gpt_spec(const ModelConfig& model, int vocab_size);
// The model a config describes for a dataset as text ("mlp inputs=64 hidden=64 ...", "gpt
// vocab_size=256 ..."): what checkpoints record as "lockstep.model".
LOCKSTEP_API std::string describe_model(const Config& config, const Dataset& train);
// model.lora as the model takes it (disabled at rank 0); the targets must parse (the config's
// checks ensure it).
LOCKSTEP_API LoraSpec lora_spec(const ModelConfig& model);
// model.lora as checkpoints record it ("lockstep.lora": "rank=8 alpha=16 targets=q_proj,v_proj"),
// and back; the parse throws std::invalid_argument naming what it could not read.
LOCKSTEP_API std::string describe_lora(const ModelConfig& model);
LOCKSTEP_API LoraSpec parse_lora_record(std::string_view text);
// The content hash of a LoRA model's frozen base (FNV-1a 64 of its fp32 bytes, in hex), which
// checkpoints record as "lockstep.lora_base".
LOCKSTEP_API std::string base_hash(std::span<const float> base);

// Loss and accuracy of `params` (in `model`'s layout) over all of `data`, on the first
// configured device of the config's backend.
LOCKSTEP_API EvalMetrics evaluate(const Config& config, const Model& model,
                                  std::span<const float> params, const Dataset& data);

// A key whose value a resumed run changed: its value in the checkpoint's config, and now.
struct LOCKSTEP_API ConfigChange {
  std::string key;  // "optimizer.lr"
  std::string checkpoint;
  std::string now;
};

class LOCKSTEP_API Trainer {
 public:
  // With `processes` (more than one: mpirun, srun), this trainer is one process of a job that
  // trains across all of them; null trains in this process alone. See make_mpi_processes().
  // With `backend`, every run makes its devices and communicators there (a test that wraps the
  // CPU backend, an embedder's own); null makes the one trainer.backend names at each run().
  Trainer(Config config, std::shared_ptr<const Dataset> train, std::shared_ptr<const Dataset> eval,
          std::shared_ptr<ProcessGroup> processes = nullptr,
          std::shared_ptr<Backend> backend = nullptr);
  ~Trainer();

  // Every log_every steps and at the last step, with metrics averaged over that window.
  void on_step(std::function<void(const StepMetrics&)> callback);
  // After every step, with that step's metrics, for live progress displays. Keep it cheap: it
  // runs on rank 0's thread inside the step.
  void on_progress(std::function<void(const StepMetrics&)> callback);
  void on_eval(std::function<void(const EvalMetrics&)> callback);
  // After each checkpoint is written (by global rank 0), with the step and its weights file.
  void on_checkpoint(std::function<void(std::int64_t step, const std::string& weights_file)> callback);
  void set_hooks(TrainerHooks hooks);

  const Model& model() const noexcept;
  std::int64_t total_steps() const noexcept;
  // The step resume_from() continues from; 0 for a fresh run.
  std::int64_t resumed_step() const noexcept;

  // The memory the run needs, per worker and on the host, against what this process may use
  // (Note [Memory plan] in src/train/memory_plan.hpp), as one line of text. Throws InputError,
  // naming the key that drives it, when it does not fit; run() checks the same before step 1.
  std::string memory_plan() const;
  // The plan at trainer.zero 0, 1 and 2, one line each ("zero 0: ..."), whether each fits or
  // not (a line that does not says so), for --dry-run --compare-zero.
  std::string memory_plans_by_zero() const;

  // Continue from a checkpoint: its weights, optimiser state, step (and so the learning-rate
  // schedule) and sampler position. Throws InputError if it was written for another model or
  // config, naming every changed key with both values. The learning rate, schedule.*,
  // weight_decay, clip_grad_norm and the trainer keys but trainer.seed may change: they apply
  // from the resumed step on (resume_changes() lists them; Note [What a resume may change] in
  // src/train/resume_changes.cpp). With the same config and device count the resumed run is
  // bit-identical to an uninterrupted one; with another count, the position in the epoch is
  // carried over as a count of samples, rounded down to a whole batch per worker.
  void resume_from(Checkpoint checkpoint);
  // The keys the resumed run changed, accepted by resume_from(); empty for a fresh run.
  const std::vector<ConfigChange>& resume_changes() const noexcept;

  // Start from these weights (load_weights() in the model's layout), with the config's fresh
  // optimiser, schedule and sampler at step 0: fine-tuning. Throws InputError when the file's
  // recorded architecture ("lockstep.model") differs from the config's model.
  // With model.lora the weights are the frozen base (Model::frozen_tensors()), needed by every
  // run, a resumed one too, which must find the base its checkpoint names ("lockstep.lora_base").
  void init_from(Weights weights);
  // LoRA: start the adapters from these values (a PEFT adapter's, in param_tensors()' layout)
  // instead of drawing them from trainer.seed.
  void init_adapters(std::vector<float> adapters);

  // Asks every worker to stop after the current step. The workers agree on the step, and a
  // checkpoint is written when trainer.checkpoint.dir is set; the final eval is skipped (the
  // Summary's eval_loss is NaN), so run() returns soon after. Callable from any thread and
  // from a signal handler (it only stores to a lock-free atomic).
  void request_stop() noexcept;
  // The step whose checkpoint is being written now, or -1: so that a signal handler can say
  // that exiting at once leaves it incomplete. Lock-free, like request_stop().
  std::int64_t saving_step() const noexcept;

  Summary run();
  // Local worker 0's parameters after run(), on the host (the same in every process).
  const std::vector<float>& final_parameters() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep
