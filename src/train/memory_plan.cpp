#include "train/memory_plan.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "lockstep/comm.hpp"
#include "lockstep/error.hpp"
#include "lockstep/trainer.hpp"
#include "train/reducer.hpp"

namespace lockstep::detail {
namespace {

constexpr double kFloat = sizeof(float);

// A cgroup's limit file: a byte count, or "max" (none). cgroupfs files report a size of 0, so
// they are read as streams, not through open_input.
double cgroup_limit(const char* file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return 0;
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    return 0;
  }
}

// The host's copies of the whole parameter buffer besides the workers': the initial parameters
// and the final ones of the summary.
constexpr double kHostCopies = 2;

double optimizer_vectors(const OptimizerConfig& opt) {
  if (opt.type == OptimizerKind::adamw) return 2;  // m and v
  return opt.momentum != 0.0 ? 1 : 0;
}

// The elements of every bucket's shard that the rank holding the most holds (Note [ZeRO-1] in
// reducer.hpp).
std::size_t largest_shard(const std::vector<Bucket>& buckets, int ranks) {
  std::size_t most = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    std::size_t held = 0;
    for (const Bucket& b : buckets) held += shard_range(b.end - b.begin, ranks, rank, kZeroGrain).size();
    most = std::max(most, held);
  }
  return most;
}

// The parameters whose optimiser state one worker holds: all of them, or under trainer.zero 1
// and 2 its shard of every bucket (Note [ZeRO-1] in reducer.hpp), the most any rank holds.
double optimizer_elements(const Config& cfg, const Model& model, int ranks) {
  if (cfg.trainer.zero < 1 || ranks <= 1) return static_cast<double>(model.param_count());
  return static_cast<double>(largest_shard(plan_buckets(model, cfg.trainer.bucket_cap_mb), ranks));
}

// The gradient floats one worker holds: the whole buffer, or under trainer.zero 2 without
// accumulation its shards and the buckets' buffers (Note [ZeRO-2] in reducer.hpp), as the
// reducer allocates them.
double gradient_elements(const Config& cfg, const Model& model, int ranks) {
  if (cfg.trainer.zero != 2 || cfg.trainer.accumulate_steps != 1)
    return static_cast<double>(model.param_count());
  const std::vector<Bucket> buckets = plan_buckets(model, cfg.trainer.bucket_cap_mb);
  return static_cast<double>(largest_shard(buckets, std::max(ranks, 1)) +
                             plan_gradient_slots(model, buckets).floats);
}

// Floats of a layer's workspace or scratch for `batch`: its size at the batch itself, unless
// that could multiply out of range; then the per-sample size times the batch, in double (under
// bf16 slightly more: each bf16 region is rounded up to 64 bytes per call).
template <class Size>
double floats_for(Size size, int batch) {
  const double estimate = static_cast<double>(size(1)) * batch;
  return estimate < 1e15 ? static_cast<double>(size(batch)) : estimate;
}

// Activations, what layers keep for backward, the shared scratch, the two activation gradients
// and the gradient of the logits, for a batch of `batch`. An LM head fused with the loss (a
// decoder's) keeps neither logits nor their gradient: one chunk of them is its scratch (Note
// [Chunked classifier] in src/model/lm_head.cpp); Replica::forward makes the logits, never a
// step. Other models: the last layer's output and the worker's fp32 dlogits.
// Per sample sizes times the batch, in double, so that no size multiplies out of range.
// Under trainer.recompute full the recomputable layers share one saved workspace, the largest of
// theirs; under selective their recomputed parts share one buffer, the largest of those (Note
// [Recomputation] in src/model/model.cpp), as Replica allocates them.
double activation_bytes(const Model& model, int batch, Precision precision, Recompute recompute) {
  const Layer& last = *model.layers().back();
  const bool fused = last.fuses_loss();
  // The worker's fp32 dlogits; the layers' outputs are added below.
  double per_sample = fused ? 0.0 : last.out_features();
  double kept = 0, shared = 0, scratch = 0, din = 1;
  std::vector<const std::vector<float>*> constants;  // Note [Layer constants]: one copy each
  for (std::size_t i = 0; i < model.layers().size(); ++i) {
    const Layer& layer = *model.layers()[i];
    const auto table = layer.constants();
    if (table && std::find(constants.begin(), constants.end(), table.get()) == constants.end()) {
      constants.push_back(table.get());
      kept += static_cast<double>(table->size());
    }
    // The head's input may live in an activation gradient's buffer (Note [Head input] in
    // src/model/model.cpp).
    const bool head_input = i + 2 == model.layers().size() && model.head_input_in_gradient();
    if ((!fused || i + 1 < model.layers().size()) && !head_input)
      per_sample += static_cast<double>(layer.out_features());
    const double saved = floats_for([&](int b) { return layer.workspace_size(b, precision); }, batch);
    const double dropped =
        recompute == Recompute::none || !model.recomputable(i) ? 0.0
        : recompute == Recompute::full
            ? saved
            : floats_for([&](int b) { return layer.recomputed_size(b, precision); }, batch);
    shared = std::max(shared, dropped);
    kept += saved - dropped;
    // A first layer's backward gets no din (Layer::scratch_size_with_din).
    scratch = std::max(scratch, floats_for(
                                    [&](int b) {
                                      return i == 0 ? layer.scratch_size(b, precision)
                                                    : layer.scratch_size_with_din(b, precision);
                                    },
                                    batch));
    if (i > 0) din = std::max(din, static_cast<double>(layer.in_features()));
  }
  return ((per_sample + 2 * din) * batch + kept + shared + scratch) * kFloat;
}

double dataset_bytes(const Dataset& d) {
  if (const auto* tokens = dynamic_cast<const TokenDataset*>(&d))
    return static_cast<double>(tokens->token_count()) * sizeof(std::uint16_t);
  return static_cast<double>(d.size()) * (d.features() + d.targets()) * kFloat;
}

// The config key (or data property) behind the largest term of the plan.
std::string driver_of(const MemoryPlan& p, const Config& cfg, const Dataset& train,
                      std::size_t model_params) {
  const int batch = cfg.data.batch_size;
  const bool weights = p.parameters + p.gradients + p.optimizer > p.activations + p.staging;
  if (cfg.model.type == "gpt") {
    if (!weights)
      return fmt::format("data.batch_size = {} with model.context = {}", batch, cfg.model.context);
    // The blocks' weights against the embedding's and an untied head's.
    const double c = cfg.model.d_model, vocab = static_cast<double>(train.classes()) * c;
    const double embeddings = (cfg.model.tie_embeddings ? 1.0 : 2.0) * vocab;
    const double blocks = static_cast<double>(model_params) - embeddings;
    return blocks >= embeddings
               ? fmt::format("model.d_model = {} (model.n_layer = {})", cfg.model.d_model,
                             cfg.model.n_layer)
               : fmt::format("model.vocab_size = {}", train.classes());
  }
  // The widest layer makes the largest weight matrix, and the widest activations.
  std::string name = fmt::format("the data's {} features", train.features());
  int widest = train.features();
  for (std::size_t j = 0; j < cfg.model.hidden.size(); ++j)
    if (cfg.model.hidden[j] > widest) {
      widest = cfg.model.hidden[j];
      name = fmt::format("model.hidden[{}] = {}", j, widest);
    }
  if (train.classes() > widest)
    name = fmt::format("the data's {} classes (the largest label + 1)", train.classes());
  if (weights) return name;
  return widest == train.features() ? fmt::format("data.batch_size = {}", batch)
                                    : fmt::format("data.batch_size = {} with {}", batch, name);
}

}  // namespace

MemoryLimit host_memory_limit() {
  MemoryLimit limit{.bytes = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                             static_cast<double>(::sysconf(_SC_PAGE_SIZE)),
                    .source = "physical memory"};
  const auto lower = [&](double bytes, const char* source) {
    if (bytes > 0 && bytes < limit.bytes) limit = {.bytes = bytes, .source = source};
  };
  lower(cgroup_limit("/sys/fs/cgroup/memory.max"), "cgroup memory.max");
  lower(cgroup_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes"), "cgroup memory limit");
  struct ::rlimit as {};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    lower(static_cast<double>(as.rlim_cur), "RLIMIT_AS (ulimit -v)");
  return limit;
}

double cudnn_attention_backward_bytes(const AttentionShape& s, bool deterministic) {
  const double b = s.batch, t = s.T, h = s.heads, d = s.head_size;
  const auto round_up = [](double x, double to) { return std::ceil(x / to) * to; };
  // The bf16 gradient in qkv's layout, (B T, (H + 2 Hkv) D); the dP workspace and the dQ
  // accumulator go by the query heads (the frontend's sizes).
  const double gradient = round_up(2.0 * b * t * double(qkv_width(s)), 256);
  const double sums = 4.0 * b * h * t;
  const double t64 = round_up(t, 64);
  return gradient + sums + (deterministic ? 2.0 * b * h * t64 * t64 : 4.0 * b * h * t * d);
}

MemoryPlan plan_memory(const Config& cfg, const Model& model, const Dataset& train,
                       const Dataset* eval, bool workers_on_host, int ranks,
                       bool cudnn_attention) {
  const double params = static_cast<double>(model.param_count()) * kFloat;
  const int batch = cfg.data.batch_size;
  MemoryPlan p;
  // bf16 compute: the replica's bf16 copy of the parameters too (2 bytes each).
  p.parameters = cfg.trainer.precision == Precision::bf16 ? 1.5 * params : params;
  // The frozen base: 4 bytes a value, or under bf16 its bf16 bits alone, 2 (Note [Frozen
  // parameters] in src/model/lora.cpp).
  p.frozen = static_cast<double>(model.frozen_count()) *
             (cfg.trainer.precision == Precision::bf16 ? 2.0 : kFloat);
  p.gradient_wire = static_cast<double>(model.param_count()) *
                    (cfg.trainer.grad_reduce_dtype == ReduceDtype::bf16 ? 2.0 : kFloat);
  // With a bf16 all-reduce, the reducer's bf16 copy of the buckets too (2 bytes a parameter).
  p.gradients = gradient_elements(cfg, model, ranks) * kFloat +
                (cfg.trainer.grad_reduce_dtype == ReduceDtype::bf16 ? 0.5 * params : 0.0);
  p.optimizer = optimizer_vectors(cfg.optimizer) * optimizer_elements(cfg, model, ranks) * kFloat;
  if (cfg.trainer.zero >= 1 && ranks > 1) p.zero_ranks = ranks;
  p.zero = cfg.trainer.zero;
  p.gradients_sharded = cfg.trainer.zero == 2 && cfg.trainer.accumulate_steps == 1;
  p.activations = activation_bytes(model, batch, cfg.trainer.precision, cfg.trainer.recompute);
  p.recompute = cfg.trainer.recompute;
  if (cudnn_attention) {
    const int heads = cfg.model.n_head;
    p.attention_workspace = cudnn_attention_backward_bytes(
        {batch, cfg.model.context, heads, gpt_spec(cfg.model, 1).head_size(),
         gpt_spec(cfg.model, 1).n_kv_head},
        /*deterministic=*/true);
    // Packed windows: the mask cuDNN reads as a bias, (B, 1, T, T) bf16, in the same working
    // memory (Note [cuDNN packed mask] in src/cuda/cudnn_attention.hpp).
    if (cfg.data.dataset == DatasetKind::chat && cfg.data.pack)
      p.attention_workspace += std::ceil(2.0 * batch * double(cfg.model.context) *
                                         double(cfg.model.context) / 256.0) * 256.0;
  }
  // Two staged batches in flight: inputs as floats, targets as int32.
  p.staging = 2.0 * batch * (train.features() + train.targets()) * kFloat;
  p.workers = static_cast<int>(cfg.trainer.devices.size());
  p.workers_on_host = workers_on_host;
  p.dataset = dataset_bytes(train) + (eval ? dataset_bytes(*eval) : 0.0);
  // and the base, once, in fp32 on the host
  p.host_copies = kHostCopies * params + static_cast<double>(model.frozen_count()) * kFloat;
  if (cfg.trainer.snapshot_every > 0 && cfg.trainer.on_worker_failure == WorkerFailurePolicy::shrink)
    p.snapshots = 2 * (1 + optimizer_vectors(cfg.optimizer)) * params;
  for (std::size_t i = 0; i < model.layers().size(); ++i)
    p.recomputable = p.recomputable || model.recomputable(i);
  p.driver = driver_of(p, cfg, train, model.param_count());
  return p;
}

std::string memory_suggestion(const MemoryPlan& plan) {
  const bool activations = plan.activations > plan.parameters + plan.gradients + plan.optimizer;
  if (activations && plan.recompute != Recompute::full && plan.recomputable)
    return " (activations are most of it: trainer.recompute: full keeps a block's input only, "
           "selective drops its norms' and activation functions' outputs)";
  if (!activations && plan.zero < 2)
    return " (the model's state is most of it: trainer.zero: 2 shards gradients and optimiser "
           "state across workers)";
  return "";
}

void check_memory_plan(const MemoryPlan& plan, const MemoryLimit& limit, const Config& cfg) {
  if (plan.host() <= limit.bytes) return;
  throw InputError(fmt::format(
      "{}: {} needs {} per worker, {} in all on the host with {} worker(s) and the dataset's {}; "
      "{} available ({}){}",
      cfg.source, plan.driver, format_bytes(plan.per_worker()), format_bytes(plan.host()),
      plan.workers, format_bytes(plan.dataset), format_bytes(limit.bytes), limit.source,
      memory_suggestion(plan)));
}

std::string describe(const MemoryPlan& p, const MemoryLimit& limit) {
  return fmt::format(
      "{} per worker (parameters {}{}, gradients {}{}, optimizer {}{}, activations {}{}, staging "
      "{}{}) x {} worker(s){}; host {} (dataset {}) of {} available ({})",
      format_bytes(p.per_worker()), format_bytes(p.parameters),
      p.frozen > 0 ? fmt::format(", frozen base {}", format_bytes(p.frozen)) : std::string(),
      format_bytes(p.gradients),
      p.gradients_sharded ? std::string(" as ZeRO-2 shards and buckets")
      : p.zero == 2       ? std::string(" whole: ZeRO-2 with accumulation")
                          : std::string(),
      format_bytes(p.optimizer),
      p.zero_ranks > 1 ? fmt::format(" as a ZeRO-{} shard of {}", p.zero, p.zero_ranks)
                       : std::string(),
      format_bytes(p.activations),
      p.recompute != Recompute::none
          ? fmt::format(" with trainer.recompute {}", to_string(p.recompute))
          : std::string(),
      format_bytes(p.staging),
      p.attention_workspace > 0
          ? fmt::format(", cuDNN attention {}", format_bytes(p.attention_workspace))
          : "",
      p.workers,
      p.workers_on_host ? " on the host" : " on their devices", format_bytes(p.host()),
      format_bytes(p.dataset), format_bytes(limit.bytes), limit.source);
}

std::string format_bytes(double bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t unit = 0;
  while (bytes >= 1024.0 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

}  // namespace lockstep::detail
