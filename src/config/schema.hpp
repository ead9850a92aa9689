// The config's schema: every section and key with its type, its rule and its line of help
// (visit_schema()), and the tables and rules the keys use. The visitors that walk it live in the
// files of their concern: read_yaml.cpp (Parser, PathResolver), checks.cpp (Checker), hash.cpp
// (Hasher), render.cpp (Renderer), schema.cpp (KeyCollector). A new key is one line here, and
// a rule that ties it to others one check in checks.cpp.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "lockstep/config.hpp"

namespace lockstep::config_impl {

// ---- Enum spellings -------------------------------------------------------------------------

template <class E>
struct Spelling {
  E value;
  std::string_view name;
};

constexpr Spelling<Activation> kActivations[] = {
    {Activation::relu, "relu"}, {Activation::gelu, "gelu"}, {Activation::tanh, "tanh"}};
constexpr Spelling<DatasetKind> kDatasetKinds[] = {{DatasetKind::csv, "csv"},
                                                   {DatasetKind::idx, "idx"},
                                                   {DatasetKind::synthetic, "synthetic"},
                                                   {DatasetKind::tokens, "tokens"},
                                                   {DatasetKind::text, "text"},
                                                   {DatasetKind::chat, "chat"},
                                                   {DatasetKind::given, "given"}};
constexpr Spelling<TokenFormat> kTokenFormats[] = {
    {TokenFormat::automatic, "auto"}, {TokenFormat::llmc, "llmc"}, {TokenFormat::raw, "raw"}};
constexpr Spelling<OptimizerKind> kOptimizerKinds[] = {{OptimizerKind::sgd, "sgd"},
                                                       {OptimizerKind::adamw, "adamw"}};
constexpr Spelling<ScheduleKind> kScheduleKinds[] = {
    {ScheduleKind::constant, "constant"}, {ScheduleKind::warmup_cosine, "warmup_cosine"}};
constexpr Spelling<BackendKind> kBackendKinds[] = {
    {BackendKind::automatic, "auto"}, {BackendKind::cpu, "cpu"}, {BackendKind::cuda, "cuda"}};

constexpr Spelling<CommKind> kCommKinds[] = {
    {CommKind::automatic, "auto"}, {CommKind::nccl, "nccl"}, {CommKind::peer, "peer"}};

constexpr Spelling<NonfinitePolicy> kNonfinitePolicies[] = {
    {NonfinitePolicy::stop, "stop"}, {NonfinitePolicy::skip, "skip"}};

constexpr Spelling<WorkerFailurePolicy> kWorkerFailurePolicies[] = {
    {WorkerFailurePolicy::stop, "stop"}, {WorkerFailurePolicy::shrink, "shrink"}};

constexpr Spelling<Precision> kPrecisions[] = {
    {Precision::fp32, "fp32"}, {Precision::tf32, "tf32"}, {Precision::bf16, "bf16"}};

constexpr Spelling<ReduceDtype> kReduceDtypes[] = {{ReduceDtype::fp32, "fp32"},
                                                   {ReduceDtype::bf16, "bf16"}};

constexpr Spelling<AttentionKind> kAttentionKinds[] = {{AttentionKind::automatic, "auto"},
                                                       {AttentionKind::fused, "fused"},
                                                       {AttentionKind::materialized,
                                                        "materialized"}};

constexpr Spelling<GraphMode> kGraphModes[] = {
    {GraphMode::automatic, "auto"}, {GraphMode::on, "on"}, {GraphMode::off, "off"}};

// trainer.recompute (Note [Recomputation] in src/model/model.cpp).
constexpr Spelling<Recompute> kRecomputeModes[] = {
    {Recompute::none, "none"}, {Recompute::selective, "selective"}, {Recompute::full, "full"}};

constexpr std::string_view kModelTypes[] = {"mlp", "gpt"};
// The chat templates and roles (chat_template_names() and chat_roles() in lockstep/dataset.hpp).
constexpr std::string_view kChatTemplates[] = {"chatml", "llama3"};
constexpr std::string_view kTokenizerFamilies[] = {"auto", "gpt2", "llama3", "qwen2"};
constexpr std::string_view kChatRoles[] = {"system", "user", "assistant"};

constexpr Spelling<ModelFamily> kModelFamilies[] = {{ModelFamily::gpt2, "gpt2"},
                                                    {ModelFamily::llama, "llama"},
                                                    {ModelFamily::qwen2, "qwen2"},
                                                    {ModelFamily::mistral, "mistral"}};
constexpr Spelling<NormKind> kNormKinds[] = {{NormKind::layernorm, "layernorm"},
                                             {NormKind::rmsnorm, "rmsnorm"}};
constexpr Spelling<PositionKind> kPositionKinds[] = {{PositionKind::learned, "learned"},
                                                     {PositionKind::rope, "rope"}};
constexpr Spelling<MlpKind> kMlpKinds[] = {{MlpKind::gelu, "gelu"}, {MlpKind::swiglu, "swiglu"}};
constexpr Spelling<RopeScalingKind> kRopeScalingKinds[] = {{RopeScalingKind::none, "none"},
                                                           {RopeScalingKind::llama3, "llama3"}};

// Note [Model families]
// ~~~~~~~~~~~~~~~~~~~~~
// model.family is a preset of the decoder's part keys, as transformers' config classes default
// them (GPT2Config, LlamaConfig, Qwen2Config, MistralConfig): a family is a row of this table,
// not a model of its own (LitGPT's one Config for many families). load_config() applies the row
// after the file, the overrides and the ConfigDefaults (`train --init-from`), as defaults of its
// own: each key none of those set takes the family's value, and a key one of them set keeps it,
// so `family: llama` with `qkv_bias: true` is a Llama with q/k/v biases. Messages name such a
// value's place as "model.family llama (model.norm=rmsnorm)". The rows leave the size keys
// (d_model, n_layer, n_head, n_kv_head, head_dim, intermediate_size, vocab_size, context) to the
// user, and rope_theta out of gpt2's, where it does not apply.
struct FamilyPreset {
  std::string_view name;
  std::vector<std::string_view> settings;  // "model.KEY=VALUE", read as overrides are
};
inline const std::vector<FamilyPreset>& family_presets() {
  static const std::vector<FamilyPreset> presets = [] {
    const std::vector<std::string_view> llama = {
        "model.norm=rmsnorm",   "model.norm_eps=1e-6",   "model.positions=rope",
        "model.rope_theta=10000", "model.mlp=swiglu",    "model.qkv_bias=false",
        "model.proj_bias=false", "model.tie_embeddings=false"};
    std::vector<std::string_view> qwen2 = llama;
    qwen2[5] = "model.qkv_bias=true";
    return std::vector<FamilyPreset>{
        {"gpt2",
         {"model.norm=layernorm", "model.norm_eps=1e-5", "model.positions=learned",
          "model.mlp=gelu", "model.qkv_bias=true", "model.proj_bias=true",
          "model.tie_embeddings=true"}},
        {"llama", llama},
        {"qwen2", qwen2},
        {"mistral", llama}};
  }();
  return presets;
}

template <class Table, class E>
const std::string_view* find_name(const Table& table, E value) {
  for (const auto& s : table)
    if (s.value == value) return &s.name;
  return nullptr;  // only for a value cast from an integer outside the enum
}

template <class Table, class E>
std::string_view spelling(const Table& table, E value) {
  const std::string_view* name = find_name(table, value);
  return name ? *name : "invalid";
}

template <class Table>
std::string join_names(const Table& table) {
  std::string out;
  for (const auto& s : table) out += (out.empty() ? "" : ", ") + std::string(s.name);
  return out;
}

// ---- Rules ----------------------------------------------------------------------------------

// The bounds of an integer key. Without `max`, the upper bound is that of the C++ member's type.
constexpr std::int64_t kNoMax = std::numeric_limits<std::int64_t>::max();
struct IntRule {
  std::int64_t min = std::numeric_limits<std::int64_t>::min();
  // trainer.steps and trainer.epochs: 0 in a Config means "not set" (null in YAML).
  bool zero_means_unset = false;
  std::int64_t max = kNoMax;
};

inline std::string describe(IntRule rule) {
  if (rule.max == rule.min + 1) return fmt::format("{} or {}", rule.min, rule.max);
  if (rule.max != kNoMax)
    return fmt::format("an integer in [{}, {}]", rule.min, rule.max);
  if (rule.min == std::numeric_limits<std::int64_t>::min()) return "an integer";
  return fmt::format("an integer >= {}", rule.min);
}

struct NumberRule {
  double min;
  bool min_inclusive;
  double max_exclusive;  // +inf when unbounded (infinities are rejected anyway)
  std::string_view description;
};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr NumberRule kPositive{0.0, false, kInf, "a number > 0"};
constexpr NumberRule kNonNegative{0.0, true, kInf, "a number >= 0"};
constexpr NumberRule kFraction{0.0, true, 1.0, "a number in [0, 1)"};

// False for NaN, whose comparisons all fail.
inline bool satisfies(double x, const NumberRule& rule) {
  return (rule.min_inclusive ? x >= rule.min : x > rule.min) && x < rule.max_exclusive;
}

// Keys an earlier version read, with what replaced them: a config that still says one is told
// the new spelling rather than "unknown key".
struct ReplacedKey {
  std::string_view path;
  std::string_view message;
};
constexpr ReplacedKey kReplacedKeys[] = {
    {"trainer.tf32", "replaced by trainer.precision (fp32, tf32 or bf16): 'tf32: true' is now "
                     "'precision: tf32', 'tf32: false' is 'precision: fp32'"},
};

// "devices: 100000" is surely a typo; refuse it before allocating a worker list for it.
constexpr int kMaxDevices = 1024;


// ---- The schema -----------------------------------------------------------------------------

// Every section and key, in the order of config.hpp, each with one line for
// `lockstep train --help`; a key that needs more says it after a newline, which only
// docs/config.md shows (`lockstep config --schema --markdown`). C is Config or const Config.
template <class Visitor, class C>
void visit_schema(Visitor& v, C& c) {
  v.section("model");
  v.choice("type", c.model.type, kModelTypes,
           "the architecture: mlp for csv, idx and synthetic data, gpt for tokens and text");
  v.integer_list("hidden", c.model.hidden, IntRule{.min = 1},
                 "mlp: hidden layer widths; input and output sizes come from the data");
  v.enumeration("activation", c.model.activation, kActivations,
                "mlp: between the Linear layers (gelu is the tanh approximation)");
  v.integer("vocab_size", c.model.vocab_size, IntRule{.min = 0},
            "gpt: token ids are below it; 0: 256 for text, required for tokens (GPT-2: 50257)"
            "\nText needs 256 or more; with data.tokenizer, 0 means the tokenizer's size.");
  v.integer("context", c.model.context, IntRule{.min = 1}, "gpt: tokens per sample");
  v.integer("n_layer", c.model.n_layer, IntRule{.min = 1}, "gpt: transformer blocks");
  v.integer("n_head", c.model.n_head, IntRule{.min = 1},
            "gpt: attention heads; divides model.d_model");
  v.integer("d_model", c.model.d_model, IntRule{.min = 1}, "gpt: width of the residual stream");
  v.enumeration("attention", c.model.attention, kAttentionKinds,
                "gpt: fused (tiled, no (T, T) matrices), materialized, or auto: the faster here"
                "\nfused never holds the (B, H, T, T) score and probability matrices: on the "
                "CPU a tiled online softmax (FlashAttention-2's algorithm, Note [Tiled "
                "attention] in src/cpu/ops/attention.cpp) that keeps one log-sum-exp per row "
                "for backward, so activation memory no longer grows with the square of the "
                "context; materialized computes and keeps those matrices (the reference). "
                "auto: fused where the backend has it and it measured at least as fast (the "
                "CPU in bf16, and in fp32 from context 256: bench/RESULTS.md), materialized "
                "otherwise. On CUDA, fused is cuDNN's fused flash attention (Note [cuDNN "
                "attention] in src/cuda/cudnn_attention.hpp), which takes half-precision "
                "inputs, so it runs under trainer.precision bf16 only, and auto picks it "
                "there; fp32 and tf32 keep the materialised path on CUDA, as do a head size "
                "cuDNN refuses (not a multiple of 8, or above 256), a context of 1, and a "
                "build without cuDNN 9: auto says which path runs and why in the summary, "
                "fused exits with 2. Packed conversations (data.pack) on CUDA: fused reads "
                "their mask as a score bias (Note [cuDNN packed mask]), and auto chooses "
                "as for unpacked data. "
                "The same function either way, summed in another order, "
                "so it is not part of the config hash. The summary, --summary-json "
                "(attention), --dry-run and lockstep devices say which runs.");
  v.enumeration("family", c.model.family, kModelFamilies,
                "gpt: a preset of the part keys below that the config does not set");
  v.enumeration("norm", c.model.norm, kNormKinds, "gpt: layernorm (with bias) or rmsnorm");
  v.number("norm_eps", c.model.norm_eps, kPositive,
           "gpt: rmsnorm's epsilon (layernorm's is 1e-5, fixed)");
  v.enumeration("positions", c.model.positions, kPositionKinds,
                "gpt: learned position embeddings, or rotary (rope)");
  v.number("rope_theta", c.model.rope_theta, kPositive, "rope: the base of the frequencies");
  v.enumeration("mlp", c.model.mlp, kMlpKinds, "gpt: gelu (4 x d_model wide) or swiglu");
  v.integer("intermediate_size", c.model.intermediate_size, IntRule{.min = 0},
            "swiglu: the MLP's hidden width; 0: 4 x d_model");
  v.integer("n_kv_head", c.model.n_kv_head, IntRule{.min = 0},
            "gpt: key/value heads, dividing n_head (grouped-query attention); 0: n_head");
  v.integer("head_dim", c.model.head_dim, IntRule{.min = 0},
            "gpt: channels per head; 0: d_model / n_head");
  v.flag("qkv_bias", c.model.qkv_bias, "gpt: biases on the q, k and v projections");
  v.flag("proj_bias", c.model.proj_bias,
         "gpt: biases on the attention's output projection and the MLP's maps");
  v.flag("tie_embeddings", c.model.tie_embeddings,
         "gpt: the LM head reads the token embedding; false: a weight of its own");
  v.nested("rope_scaling");
  v.nested("lora");

  v.section("model.rope_scaling");
  v.enumeration("type", c.model.rope_scaling.type, kRopeScalingKinds,
                "rope: none, or llama3 (Llama 3.1's scaling of the frequencies)");
  v.number("factor", c.model.rope_scaling.factor, kPositive, "llama3: the scaling factor");
  v.number("low_freq_factor", c.model.rope_scaling.low_freq_factor, kPositive,
           "llama3: wavelengths above original / low_freq_factor are scaled by 1 / factor");
  v.number("high_freq_factor", c.model.rope_scaling.high_freq_factor, kPositive,
           "llama3: wavelengths below original / high_freq_factor are kept");
  v.integer("original_max_position_embeddings",
            c.model.rope_scaling.original_max_position_embeddings, IntRule{.min = 1},
            "llama3: the context the model was first trained at");

  v.section("model.lora");
  v.integer("rank", c.model.lora.rank, IntRule{.min = 0},
            "LoRA adapters' rank on a decoder's blocks (Llama family or GPT-2); 0: none, every "
            "weight trained");
  v.number("alpha", c.model.lora.alpha, kPositive, "LoRA: the adapters are scaled by alpha / rank");
  v.text("targets", c.model.lora.targets,
         "LoRA: projections by PEFT's names, comma-separated (q_proj,...,down_proj; GPT-2: "
         "c_attn, attn.c_proj, c_fc, mlp.c_proj, c_proj for both), or all");
  v.number("dropout", c.model.lora.dropout, kFraction,
           "LoRA: in training, dropout on each adapter's input, as PEFT's lora_dropout");

  v.section("data");
  v.enumeration("dataset", c.data.dataset, kDatasetKinds,
                "where the samples come from (given: the program passes them to the Trainer)"
                "\nThe formats: docs/data-formats.md. chat: conversations as JSON Lines, "
                "rendered with data.template (docs/hugging-face.md). given: from C++ or "
                "Python; the config names no data.");
  v.path("path", c.data.path, "csv, tokens, text: the data file");
  v.enumeration("format", c.data.format, kTokenFormats,
                "tokens: llm.c .bin with its header, headerless uint16, or auto: by the header"
                "\nauto reads the header when the file starts with llm.c's magic number "
                "(20240520).");
  v.path("eval_path", c.data.eval_path,
         "tokens, text: a separate eval file instead of the held-out tail"
         "\nFor token files, llm.c's *_val.bin.");
  v.path("tokenizer", c.data.tokenizer,
         "tokens, text: the BPE tokenizer (lockstep tokenize's); text is tokenised at load"
         "\nWhat lockstep tokenize --tokenizer takes: a Hugging Face directory, a "
         "tokenizer.json, or a tiktoken rank file. model.vocab_size defaults to its size, "
         "and checkpoints record it for lockstep sample and export --format hf.");
  v.choice("tokenizer_family", c.data.tokenizer_family, kTokenizerFamilies,
           "a tiktoken rank file as data.tokenizer: its family's pattern (tokenize "
           "--tokenizer-family); auto: GPT-2's, or what a tokenizer.json says");
  v.integer("label_column", c.data.label_column, IntRule{},
            "csv: the column of the class; negative counts from the end");
  v.flag("header", c.data.header, "csv: skip the first line");
  v.path("images", c.data.images, "idx: the images file (train-images-idx3-ubyte, ...)");
  v.path("labels", c.data.labels, "idx: the labels file");
  v.integer("samples", c.data.samples, IntRule{.min = 1}, "synthetic: number of samples");
  v.integer("features", c.data.features, IntRule{.min = 1}, "synthetic: features per sample");
  v.integer("classes", c.data.classes, IntRule{.min = 2}, "synthetic: number of classes");
  v.number("eval_fraction", c.data.eval_fraction, kFraction,
           "share of the samples held out for eval (tokens, text: the stream's tail)"
           "\nFor tokens and text, the last share of the token stream, so that no window spans "
           "both splits; a split shorter than one window is an error naming the fix.");
  v.integer("batch_size", c.data.batch_size, IntRule{.min = 1},
            "samples per device and step; the global batch is batch_size x devices");
  v.flag("shuffle", c.data.shuffle, "reshuffle every epoch (seed + epoch)");
  v.flag("drop_last", c.data.drop_last, "drop the tail instead of padding shards by wrap-around");
  v.flag("normalize", c.data.normalize,
         "standardise features with the train split's statistics (not tokens and text)");
  v.integer("prefetch", c.data.prefetch, IntRule{.min = 0},
            "batches each worker's loader thread assembles ahead; 0: no loader thread"
            "\nWithout one, the worker assembles each batch when it needs it (the CPU "
            "backend does so anyway when its compute threads take every core: the summary's "
            "\"loader inline\").");
  v.choice("template", c.data.chat_template, kChatTemplates,
           "chat: the chat template conversations are rendered with");
  v.choice_list("train_on", c.data.train_on, kChatRoles,
                "chat: the roles whose tokens (and end-of-turn token) count toward the loss");
  v.flag("pack", c.data.pack,
         "chat: several conversations to a window, attention and positions kept apart");
  v.flag("skip_bad_records", c.data.skip_bad_records,
         "chat: skip and count bad records (else exit 2 naming file and line)");

  v.section("optimizer");
  v.enumeration("type", c.optimizer.type, kOptimizerKinds, "the optimiser");
  v.number("lr", c.optimizer.lr, kPositive, "peak learning rate");
  v.number("momentum", c.optimizer.momentum, kFraction, "sgd: momentum");
  v.flag("nesterov", c.optimizer.nesterov, "sgd: Nesterov momentum; needs momentum > 0");
  v.number("weight_decay", c.optimizer.weight_decay, kNonNegative,
           "sgd: L2 added to the gradient; adamw: decoupled; matrices only unless decay_all"
           "\nApplied to the matrices only (tensors of 2 or more dimensions: linear weights, "
           "embeddings), not to biases and norms, as nanoGPT and llm.c do.");
  v.flag("decay_all", c.optimizer.decay_all,
         "weight_decay on every tensor, biases and LayerNorms too"
         "\nThe behaviour before decay groups.");
  v.number("beta1", c.optimizer.beta1, kFraction, "adamw: first-moment decay");
  v.number("beta2", c.optimizer.beta2, kFraction, "adamw: second-moment decay");
  v.number_pair("betas", "beta1", c.optimizer.beta1, "beta2", c.optimizer.beta2, kFraction,
                "adamw: [beta1, beta2] in one key, instead of both");
  v.number("eps", c.optimizer.eps, kPositive, "adamw: added to the second moment's root");
  v.number("clip_grad_norm", c.optimizer.clip_grad_norm, kNonNegative,
           "clip the averaged gradient to this global norm; 0: off");

  v.section("schedule");
  v.enumeration("type", c.schedule.type, kScheduleKinds, "the learning rate over the steps");
  v.integer("warmup_steps", c.schedule.warmup_steps, IntRule{.min = 0},
            "warmup_cosine: linear ramp to lr, then cosine decay to min_lr at the last step");
  v.number("min_lr", c.schedule.min_lr, kNonNegative, "warmup_cosine: floor of the decay");

  v.section("trainer");
  v.enumeration("backend", c.trainer.backend, kBackendKinds,
                "auto: cuda when a GPU is usable, else cpu");
  v.devices("devices", c.trainer.devices,
            "4 means ids [0, 1, 2, 3]; on the CPU each is a worker thread (lockstep devices)");
  v.integer("steps", c.trainer.steps, IntRule{.min = 1, .zero_means_unset = true},
            "optimiser steps of the run; set this or trainer.epochs");
  v.integer("epochs", c.trainer.epochs, IntRule{.min = 1, .zero_means_unset = true},
            "passes over the training split; set this or trainer.steps");
  v.integer("seed", c.trainer.seed, IntRule{.min = 0},
            "seeds the weights, shuffles, split and synthetic data");
  v.integer("log_every", c.trainer.log_every, IntRule{.min = 1}, "steps between log lines");
  v.integer("eval_every", c.trainer.eval_every, IntRule{.min = 0},
            "steps between evals; 0: at the end only (always at the end)");
  v.integer("check_replicas_every", c.trainer.check_replicas_every, IntRule{.min = 0},
            "steps between replica hash checks; 0: at the end only");
  v.integer("threads_per_device", c.trainer.threads_per_device, IntRule{.min = 0},
            "cpu: threads of each worker; 0: hardware threads / workers"
            "\nThe size of each worker's oneTBB arena. Set on cuda: a warning on stderr before "
            "step 1.");
  v.enumeration("comm", c.trainer.comm, kCommKinds,
                "cuda: nccl, or peer (one process; chosen when ids repeat or one worker)"
                "\npeer is the single-process communicator for replicas that share a GPU; a "
                "worker alone gets it too (a one-rank NCCL communicator costs device memory "
                "and moves nothing). Set "
                "on the CPU backend: a warning on stderr before step 1.");
  v.enumeration("precision", c.trainer.precision, kPrecisions,
                "tf32: cuda TF32 GEMMs; bf16: bf16 products, fp32 master weights"
                "\ntf32: TF32 tensor-core products on cuda (the CPU computes fp32). bf16: "
                "mixed precision: fp32 master weights and optimiser state with a bf16 copy "
                "of the weights, bf16 inputs to every matrix product (fp32 accumulation), "
                "activations kept for backward in bf16, norms, softmax, GELU and the loss in "
                "fp32 (Note [bf16 compute] in src/model/ops.hpp); checkpoints keep the fp32 "
                "weights, so a bf16 run resumes exactly. With model.lora the frozen base is "
                "held in bf16 only, 2 bytes a value (Note [Frozen parameters] in "
                "src/model/lora.cpp). Replaces trainer.tf32 (tf32: true is precision: tf32).");
  v.number("bucket_cap_mb", c.trainer.bucket_cap_mb, kPositive,
           "gradient bucket size; the first bucket is capped at 1 MB"
           "\nAs in PyTorch's DDP; the buckets are laid out in reverse layer order, so that "
           "the ones backward fills first are all-reduced first (docs/how-it-works.md).");
  v.flag("overlap", c.trainer.overlap, "all-reduce each bucket as soon as backward fills it");
  v.enumeration("grad_reduce_dtype", c.trainer.grad_reduce_dtype, kReduceDtypes,
                "bf16: buckets rounded to bf16 for the all-reduce"
                "\nEach bucket is rounded to bf16 for the all-reduce and back (PyTorch DDP's "
                "bf16_compress_hook): half the bytes on the wire with NCCL; the CPU's "
                "communicators sum the values in fp32. The summary reports the gradient "
                "bytes per step. Not with trainer.zero 1 or 2 yet.");
  v.integer("accumulate_steps", c.trainer.accumulate_steps, IntRule{.min = 1},
            "micro-batches per optimiser step; all-reduce after the last"
            "\nThe gradients are all-reduced after the last micro-batch only (DDP's no_sync); "
            "trainer.steps counts optimiser steps, each of which takes accumulate_steps "
            "batches per worker.");
  v.integer("zero", c.trainer.zero, IntRule{.min = 0, .max = 2},
            "1: ZeRO-1, each worker keeps its shard of the optimiser state; 2: and of the "
            "gradients"
            "\nSharding the optimiser state saves its memory at the same bytes on the wire; on "
            "the CPU a zero 1 run ends with the bit-identical weights of zero 0 "
            "(docs/zero.md).");
  v.enumeration("recompute", c.trainer.recompute, kRecomputeModes,
                "selective: blocks recompute norms, GELU/SwiGLU and the first residual in "
                "backward; full: each block keeps only its input and reruns its forward in "
                "backward"
                "\nBoth end with the bits of none. selective keeps what a matrix product or the "
                "attention made except the first residual, which it makes again with the "
                "attention's output projection (a block's cheapest product, (N, C) x (C, C)); "
                "full keeps one block's activations at a time "
                "and costs about a block's forward more. --dry-run gives the activation bytes "
                "of each mode (Note [Recomputation] in src/model/model.cpp; bench/RESULTS.md).");
  v.enumeration("cuda_graphs", c.trainer.cuda_graphs, kGraphModes,
                "cuda: replay each micro-batch as graphs; auto: where that measured faster"
                "\nEach micro-batch's forward (with its loss) and backward are captured once "
                "as CUDA graphs and replayed with one launch each, backward cut into a graph "
                "per gradient bucket so that its all-reduces still start while it runs; the "
                "collectives, optimiser and waits stay as they were, and the bits are the "
                "same either way. on: from the second step; auto: times steps each way and "
                "keeps the graphs only where a step was faster with them. A part whose "
                "capture is refused runs as launched; where the first capture is refused, or "
                "on the CPU, the run goes on without them and the summary's cuda_graphs says "
                "why (on, on the CPU backend, also warns on stderr) (Note [Step graphs] in "
                "src/train/step_graphs.hpp).");
  v.path("trace", c.trainer.trace, "write a Chrome trace-event JSON of every worker here"
         "\nChrome trace-event JSON (Perfetto, chrome://tracing): one track per worker and per "
         "communication thread, with forward, backward per layer, each bucket's all-reduce, "
         "the optimiser, eval, checkpoints and the waits.");
  v.path("report", c.trainer.report, "write an HTML report of the run here"
         "\nA self-contained HTML file: loss and eval curves, throughput per step, per-worker "
         "compute, communication, data-wait and barrier-wait times, the precision and the "
         "matrix products' library.");
  v.path("metrics", c.trainer.metrics, "append JSON lines, one per logged step and eval, here"
         "\nOne JSON object per line, flushed as written (tail -f follows a live run; a "
         "resumed run appends): each run starts with a \"kind\": \"run\" line (start_time in "
         "UTC, config_hash, resumed_from_step, resumed_from, steps, workers); then \"step\" "
         "lines (step, epoch, loss, accuracy, lr, grad_norm, samples_per_s, tokens_per_s, "
         "mfu, comm_hidden_fraction, data_wait_s, elapsed_s), \"eval\" lines (step, loss, "
         "accuracy, samples) and \"recovery\" lines after a shrink. Unknown numbers (mfu on "
         "the CPU) are null. Global rank 0 writes it.");
  v.enumeration("on_nonfinite", c.trainer.on_nonfinite, kNonfinitePolicies,
                "a NaN/Inf loss or gradient norm: stop the run, or skip the update"
                "\nstop names the step and the tensor.");
  v.integer("max_nonfinite_skips", c.trainer.max_nonfinite_skips, IntRule{.min = 1},
            "skip: stop after this many skipped steps in a row");
  v.number("step_timeout_s", c.trainer.step_timeout_s, kNonNegative,
           "stop the run when no worker progresses this long; 0: off"
           "\nThe message names each worker's phase (forward, backward bucket 2, all-reduce 3, "
           "optimiser, eval, checkpoint, ...); eval batches and the stages of a checkpoint "
           "save count as progress.");
  v.number("stop_grace_s", c.trainer.stop_grace_s, kPositive,
           "after a stop, wait this long for the workers, then report and leave them"
           "\nA worker still out then is reported by rank, phase and step and left running, "
           "and the run fails (Note [Bounded stop] in src/train/trainer.cpp).");
  v.enumeration("on_worker_failure", c.trainer.on_worker_failure, kWorkerFailurePolicies,
                "a lost device: stop the run, or shrink: go on with the other workers"
                "\nshrink goes on in the same process with the workers whose devices remain, "
                "from the state they hold alike (docs/embedding.md). The shrink keys "
                "(min_workers, snapshot_every, keep_global_batch) set under stop, like any "
                "setting that cannot apply to the run (cuda_graphs on and comm on the CPU "
                "backend, threads_per_device on cuda), are named in a warning on stderr "
                "before step 1; one that contradicts the run is an error (exit 2).");
  v.integer("min_workers", c.trainer.min_workers, IntRule{.min = 1},
            "shrink: stop instead once fewer workers than this are left"
            "\nAbove the run's workers: exit 2.");
  v.flag("keep_global_batch", c.trainer.keep_global_batch,
         "shrink: raise accumulate_steps to keep the global batch, where it divides"
         "\naccumulate_steps becomes N x k / (N - 1) where that is whole; else each worker "
         "keeps its batch, and the global batch shrinks by 1/N per lost worker.");
  v.integer("snapshot_every", c.trainer.snapshot_every, IntRule{.min = 0},
            "steps between in-memory copies of the state a shrink can go on from; 0: none"
            "\nEvery K steps each worker copies its share of the parameters and optimiser "
            "state (1/N of it) to host memory, on a GPU on a stream of its own: the state to "
            "go on from when the failed step's start is gone (updates per bucket applied, or "
            "trainer.zero 1).");
  v.nested("checkpoint");

  v.section("trainer.checkpoint");
  v.path("dir", c.trainer.checkpoint.dir, "where checkpoints go; unset: no checkpoints");
  v.integer("every_steps", c.trainer.checkpoint.every_steps, IntRule{.min = 0},
            "steps between checkpoints; 0: at the end only (and on SIGINT/SIGTERM)");
  v.integer("keep_last", c.trainer.checkpoint.keep_last, IntRule{.min = 1},
            "checkpoints kept; older ones go once a newer one is complete");
  v.flag("overwrite", c.trainer.checkpoint.overwrite,
         "a new run may replace the checkpoints already in dir; false: it refuses to start"
         "\nA new run (not a resume) in a dir that holds checkpoints: false refuses to start "
         "(exit 2), true removes them before step 1 (train --overwrite).");
}

struct SectionKeys {
  std::string_view name;
  std::vector<std::string_view> keys;
};

// The sections and their keys, in schema order (nested sections as "trainer.checkpoint").
const std::vector<SectionKeys>& schema();
const SectionKeys* find_section(std::string_view name);
// The names a user can write in `section`, a nested section's as its leaves: trainer's
// "checkpoint" is "checkpoint.dir", "checkpoint.every_steps", "checkpoint.keep_last".
std::vector<std::string> leaf_names(std::string_view section);
// The top-level sections; "trainer.checkpoint" is a map inside "trainer".
std::vector<std::string_view> section_names();

}  // namespace lockstep::config_impl
