// The validated training configuration.
//
//   lockstep::Config cfg = lockstep::load_config("configs/quickstart.yaml",
//                                                {"trainer.devices=4", "trainer.steps=100"});
//
// Every value is checked when it is read. Bad values throw one ConfigError listing each problem
// on a line of its own, in the file's order: "FILE:LINE:COL: KEY.PATH: expected ..., got ...".
// Unknown keys are rejected with a "did you mean" suggestion. Overrides ("a.b.c=value") pass
// through the same checks and are named "--set a.b.c=value" in messages.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/error.hpp"
#include "lockstep/export.hpp"
#include "lockstep/types.hpp"

namespace lockstep {

class LOCKSTEP_API ConfigError : public InputError {
 public:
  using InputError::InputError;
};

// model.rope_scaling: transformers' rope_scaling {"rope_type": "llama3", ...} (Llama 3.1 and
// later), or none.
struct LOCKSTEP_API RopeScalingConfig {
  RopeScalingKind type = RopeScalingKind::none;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

// model.lora: LoRA adapters on a Llama-family decoder's projections (Note [LoRA] in
// src/model/lora.cpp); rank 0: none, every parameter trained.
struct LOCKSTEP_API LoraConfig {
  int rank = 0;
  double alpha = 16.0;                 // the adapters' output is scaled by alpha / rank
  std::string targets = "q_proj,v_proj";  // PEFT's module names, comma-separated, or "all"
  double dropout = 0.0;                // on the adapters' input; only 0 is built
};

struct LOCKSTEP_API ModelConfig {
  std::string type = "mlp";      // "mlp" (classification data) or "gpt" (tokens or text data)
  // mlp
  std::vector<int> hidden{64};   // hidden layer widths; input and output sizes come from the data
  Activation activation = Activation::relu;
  // gpt
  int vocab_size = 0;            // at most kMaxVocabSize; 0: 256 for text, required for tokens
  int context = 128;             // tokens per sample (the windows of the token stream)
  int n_layer = 4;
  int n_head = 4;                // divides d_model
  int d_model = 128;
  // auto, fused or materialized: how the blocks compute attention (AttentionKind in
  // lockstep/types.hpp). The same function either way, summed in another order.
  AttentionKind attention = AttentionKind::automatic;
  // gpt: the decoder's parts (Note [One decoder] in src/model/decoder.cpp). `family` is a preset:
  // load_config() sets each part key below that the file, an override or a default does not
  // set to the family's value (Note [Model families] in src/config/schema.hpp). The defaults
  // here are GPT-2's; a Config filled by hand sets its parts itself.
  ModelFamily family = ModelFamily::gpt2;
  NormKind norm = NormKind::layernorm;
  double norm_eps = 1e-5;        // rmsnorm's; layernorm's is 1e-5 (GPT-2's), fixed
  PositionKind positions = PositionKind::learned;
  double rope_theta = 10000.0;   // rope: the base of the rotary frequencies
  RopeScalingConfig rope_scaling;  // rope: Llama 3.1's frequency scaling, or none
  MlpKind mlp = MlpKind::gelu;
  int intermediate_size = 0;     // swiglu: the MLP's hidden width; 0: 4 x d_model
  int n_kv_head = 0;             // key/value heads, dividing n_head (grouped-query); 0: n_head
  int head_dim = 0;              // channels per head; 0: d_model / n_head
  bool qkv_bias = true;          // biases on the q, k and v projections
  bool proj_bias = true;         // biases on the attention's output projection and the MLP's
  bool tie_embeddings = true;    // the LM head reads the token embedding (no weight of its own)
  LoraConfig lora;               // gpt, Llama family: LoRA adapters, the base frozen
};

struct LOCKSTEP_API DataConfig {
  DatasetKind dataset = DatasetKind::csv;
  std::string path;              // csv, tokens, text: the file
  TokenFormat format = TokenFormat::automatic;  // tokens: llm.c .bin header or raw uint16
  std::string eval_path;         // tokens, text: a separate eval file instead of the held-out tail
  // tokens, text: the BPE tokenizer of the data (what `lockstep tokenize --tokenizer` takes).
  // Text is then tokenised with it at load, and checkpoints record it for `lockstep sample`;
  // model.vocab_size defaults to its size. Empty: text is read one token per byte.
  std::string tokenizer;
  // How `tokenizer` is read when it is a tiktoken rank file, which does not say: auto (GPT-2's
  // pattern), gpt2, llama3 or qwen2 (lockstep tokenize's --tokenizer-family).
  std::string tokenizer_family = "auto";
  int label_column = -1;         // csv: column holding the class; negative counts from the end
  bool header = false;           // csv: skip the first line
  std::string images;            // idx: images file (e.g. train-images-idx3-ubyte)
  std::string labels;            // idx: labels file
  std::int64_t samples = 10000;  // synthetic: number of samples
  int features = 32;             // synthetic: features per sample
  int classes = 10;              // synthetic: number of classes
  double eval_fraction = 0.2;    // held-out share of the samples (tokens, text: the stream's tail)
  int batch_size = 32;           // per device, as in DDP: the global batch is batch_size x devices
  bool shuffle = true;
  bool drop_last = false;
  bool normalize = true;         // standardise every feature with the train split's mean and std
                                 // (not for tokens and text)
  int prefetch = 2;              // batches each worker's loader thread assembles ahead of
                                 // compute; 0: no thread (see ShardLoader)
  // chat (ChatOptions in lockstep/dataset.hpp): the template conversations are rendered with,
  // the roles whose tokens count toward the loss, several conversations to a window, and bad
  // records skipped rather than refused.
  std::string chat_template = "chatml";
  std::vector<std::string> train_on = {"assistant"};
  bool pack = false;
  bool skip_bad_records = false;
};

struct LOCKSTEP_API OptimizerConfig {
  OptimizerKind type = OptimizerKind::sgd;
  double lr = 0.01;
  double momentum = 0.0;         // sgd
  bool nesterov = false;         // sgd; needs momentum > 0
  double weight_decay = 0.0;     // sgd: L2 added to the gradient; adamw: decoupled. Matrices
                                 // only (tensors of >= 2 dimensions), unless decay_all
  bool decay_all = false;        // weight_decay on every tensor, biases and LayerNorms too
  double beta1 = 0.9;            // adamw
  double beta2 = 0.999;          // adamw
  double eps = 1e-8;             // adamw
  double clip_grad_norm = 0.0;   // clip the averaged gradient to this global norm; 0 = off
};

struct LOCKSTEP_API ScheduleConfig {
  ScheduleKind type = ScheduleKind::constant;
  std::int64_t warmup_steps = 0;  // warmup_cosine: linear ramp from lr/warmup to lr
  double min_lr = 0.0;            // warmup_cosine: floor of the cosine decay
};

struct LOCKSTEP_API CheckpointConfig {
  std::string dir;                // where checkpoints go; empty = no checkpoints
  std::int64_t every_steps = 0;   // 0: only at the end (and on SIGINT/SIGTERM)
  int keep_last = 3;
  // A new run may replace the checkpoints already in `dir` (Note [A used checkpoint directory]
  // in src/train/run_files.hpp); false: it refuses to start there.
  bool overwrite = false;
};

struct LOCKSTEP_API TrainerConfig {
  BackendKind backend = BackendKind::automatic;
  std::vector<int> devices{0};    // device ids; "devices: 4" in YAML means [0, 1, 2, 3]
  std::int64_t steps = 0;         // exactly one of steps and epochs is set
  std::int64_t epochs = 0;
  std::uint64_t seed = 0;
  std::int64_t log_every = 50;
  std::int64_t eval_every = 0;    // 0: evaluate only at the end
  std::int64_t check_replicas_every = 100;  // 0: check only at the end
  int threads_per_device = 0;     // cpu backend: 0 = hardware threads / devices (at least 1)
  CommKind comm = CommKind::automatic;  // cuda: nccl, or peer (one process, any ids, repeats ok)
  // tf32: cuda TF32 tensor-core GEMMs (cpu: fp32); bf16: bf16 matrix products with fp32
  // master weights (Note [bf16 compute] in src/model/ops.hpp)
  Precision precision = Precision::fp32;
  // Gradient reduction (see Note [Buckets] in src/train/reducer.hpp).
  double bucket_cap_mb = 25.0;    // the first bucket is capped at 1 MB, as in DDP
  bool overlap = true;            // all-reduce each bucket as soon as backward fills it
  // bf16: round each bucket to bf16 for the all-reduce, and back (PyTorch DDP's
  // bf16_compress_hook; Note [bf16 gradient reduction] in src/train/reducer.hpp)
  ReduceDtype grad_reduce_dtype = ReduceDtype::fp32;
  int accumulate_steps = 1;       // micro-batches per optimiser step; all-reduce after the last
  // 1: ZeRO-1, optimiser state sharded (Note [ZeRO-1] in src/train/reducer.hpp); 2: ZeRO-2,
  // the gradients too (Note [ZeRO-2])
  int zero = 0;
  // full: a block keeps only its input; backward reruns its forward first (Note
  // [Recomputation] in src/model/model.cpp). selective is not implemented yet.
  Recompute recompute = Recompute::none;
  // cuda: each micro-batch's forward and backward replayed as CUDA graphs (Note [Step graphs]
  // in src/train/step_graphs.hpp); auto keeps them where they measured faster
  GraphMode cuda_graphs = GraphMode::automatic;
  std::string trace;              // Chrome trace-event JSON of every worker, when set
  std::string report;             // offline HTML report of the run (`lockstep train`), when set
  std::string metrics;            // JSON lines, one per logged step and eval, appended, when set
  // Failure handling.
  NonfinitePolicy on_nonfinite = NonfinitePolicy::stop;  // NaN/Inf loss or gradient norm
  int max_nonfinite_skips = 5;    // skip: stop after this many skipped steps in a row
  double step_timeout_s = 0.0;    // stop the run when a worker makes no progress this long; 0 = off
  double stop_grace_s = 30.0;     // wait this long for workers to stop, then report and leave them
  // A lost device: stop, or go on with the survivors while at least min_workers remain.
  WorkerFailurePolicy on_worker_failure = WorkerFailurePolicy::stop;
  int min_workers = 1;
  bool keep_global_batch = false;  // shrink: raise accumulate_steps to keep it, where it divides
  std::int64_t snapshot_every = 0;  // shrink: copy the state to host memory every K steps; 0 = off
  CheckpointConfig checkpoint;
};

struct LOCKSTEP_API Config {
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainerConfig trainer;
  std::string source = "<defaults>";  // where it was read from, for messages
  // Where each key the file or an override set was written ("FILE:LINE:COL" or "--set
  // KEY=VALUE"), by path ("model.n_head"); a key left at its default is absent. So that a
  // default can come from elsewhere (the model of `train --init-from`) without overriding a
  // value the user wrote.
  std::map<std::string, std::string, std::less<>> set_at;

  // Checks the cross-field rules (steps xor epochs, nesterov needs momentum, ...).
  // load_config() calls it; embedders who fill a Config by hand should too.
  void validate() const;
};

// A stable 64-bit hash (FNV-1a 64 of a canonical text) of every setting that changes the math
// of training: model.*, data.* but prefetch, optimizer.*, schedule.* and trainer.seed. Not the
// backend, devices, steps, epochs or logging. Checkpoints record it, so that a resumed run can
// tell whether it trains the same problem the same way.
LOCKSTEP_API std::uint64_t config_hash(const Config& config);

// Every key of the schema ("optimizer.lr", "trainer.devices", ...) with its value as text, in
// schema order; a data path as the absolute file it names. Checkpoints record them beside the
// hash, so that a refused resume can name what changed.
using ConfigValues = std::vector<std::pair<std::string, std::string>>;
LOCKSTEP_API ConfigValues config_values(const Config& config);

// Every key and value of `config` as YAML that load_config() reads back to the same settings, a
// path as the absolute file it names (`lockstep config --print`).
LOCKSTEP_API std::string to_yaml(const Config& config);

// One key of the schema, as `lockstep train --help` lists it.
struct LOCKSTEP_API ConfigKeyHelp {
  std::string key;            // "optimizer.lr"
  std::string type;           // the values it takes: "a number > 0"
  std::string default_value;  // as YAML: "0.01", "[64]", "null" (unset)
  std::string description;    // one line
};

// Every key of the schema, in its order, with its default.
LOCKSTEP_API std::vector<ConfigKeyHelp> config_key_help();

// Reads and validates a YAML file, then applies "a.b.c=value" overrides. A relative path the
// file gives is resolved against the file's directory; one an override gives is left relative
// to the working directory (Note [Config paths] in src/config/read_yaml.cpp).
LOCKSTEP_API Config load_config(const std::filesystem::path& file,
                                std::span<const std::string> overrides = {});

// Values for the keys that neither the file nor an override sets ("model.n_head=12", read as
// overrides are), and where they came from, for messages: what `lockstep train --init-from`
// takes from the weights. Config::set_at leaves them out.
struct LOCKSTEP_API ConfigDefaults {
  std::string source;               // e.g. "gpt2/config.json"
  std::vector<std::string> values;  // "a.b.c=value"
};
LOCKSTEP_API Config load_config(const std::filesystem::path& file,
                                std::span<const std::string> overrides,
                                const ConfigDefaults& defaults);

// How a config file is read: `data_files_exist` false skips the check that the data files
// exist, for a config shown before its data is made (`lockstep config --print`).
struct LOCKSTEP_API ConfigReading {
  bool data_files_exist = true;
};
LOCKSTEP_API Config load_config(const std::filesystem::path& file,
                                std::span<const std::string> overrides,
                                const ConfigDefaults& defaults, const ConfigReading& reading);

// Same, from text in memory. `source` names it in messages; paths are left as written.
LOCKSTEP_API Config parse_config(std::string_view yaml, std::string_view source,
                                 std::span<const std::string> overrides = {});

}  // namespace lockstep
