// Frozen parameters and LoRA adapters (Model::gpt with a LoraSpec).
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/random.hpp"
#include "lockstep/model.hpp"
#include "model/lora.hpp"

namespace lockstep {

// Note [Frozen parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A model may hold parameters that are never trained (a LoRA model's base). They live in a
// second buffer of the Replica, `frozen`, with the same reverse-layer layout as the parameter
// buffer (Model::frozen_tensors, Model::frozen_read_offset), and a layer reads its share through
// LayerWorkspace::frozen. Everything the trainer does to parameters it does to params() alone:
// the gradient buffer, the reducer's buckets and all-reduce, ZeRO's shards, the optimiser's
// state, clipping, the replica check and checkpoints see only the trainable parameters, because
// Model::param_count() and param_tensors() count only them. So no code of the trainer changes to
// freeze a weight: a frozen weight is simply not a parameter. The frozen buffer is loaded once
// per replica (Replica::load_frozen) from the base on the host, and nothing writes it after, so
// it stays bit-identical through a run, and each worker holds one copy, as it holds one copy of
// the parameters.
// A layer frozen as a whole (make_frozen: a LoRA model's embedding, norms and LM head) is the
// layer itself reading ws.frozen instead of params, and its backward computes only its input
// gradient: it is skipped when there is none (a first layer), and the layer is handed no
// gradient buffer (grads null), which the decoder's embedding, RMSNorm and LM head accept.
// Under bf16 (trainer.precision: bf16) a frozen weight is held in bf16 only: no fp32 master is
// needed for a weight that never changes, so the Replica rounds the base once as it loads it
// (load_frozen, on the host, to nearest even as Device::to_bf16) and keeps only the bf16 bits
// (Replica::frozen_bf16_, LayerWorkspace::frozen_bf16; frozen_ is empty). The matrix products
// read those bits where a trained weight's products read its bf16 copy (a Frozen layer hands
// them to the inner layer as its params_bf16 and null as its fp32 params). What a trained
// weight's layer reads in fp32 a frozen one reads widened from bf16: the embedding's lookup
// reads the bf16 tables (Device::embedding_forward's bf16 overload: wte, and GPT-2's wpe at each
// row's position, packed windows included, summed in fp32 as the fp32 lookup on the widened
// tables), and the norms' weights (RMSNorm's; LayerNorm's weight and bias) and a block's biases
// are widened into the layer's scratch, a few C values each, each call (GPT-2's block: 13C).
// So the frozen base costs 2 bytes a value on each worker instead of 4 (the full model's bf16
// run pays 6: master and copy): for SmolLM2-135M's shape, 134.5 M frozen values, 269 MB
// instead of 538 MB per worker. The memory plan counts it so (memory_plan.cpp).
// The base a bf16 run computes with is then round_to_bf16(base): the same values a bf16 full
// fine-tune's products read, while its embedding and norms read the fp32 master; the adapters
// are ordinary bf16 parameters (fp32 master and copy, Note [bf16 compute] in ops.hpp).

// Note [LoRA]
// ~~~~~~~~~~~
// LoRA (Hu et al. 2021, as PEFT implements it): a targeted projection y = x W^T (+ b) becomes
//   y = x W^T (+ b) + s (x A^T) B^T,   A (r, in), B (out, r), s = alpha / r,
// with W and b frozen and only A and B trained. A starts as PEFT's default, kaiming_uniform_
// with a = sqrt(5), which is U(-1/sqrt(in), 1/sqrt(in)); B starts at zero, so the first forward
// is the base model's. The block computes the base projection as before, then adds the
// adapter's two thin products into the same output (for q, k and v a column block of the one
// qkv product; for gate and up of the one gate|up product); it keeps u = s x A^T (N, r) for
// backward. Backward computes the base projection's input gradient alone (dx = dy W, no dW, no
// db) and adds the adapter's: dB += dy^T u, du = s dy B, dA += du^T x, dx += du A. The block's
// trainable parameters are the adapters alone, stored target by target in PEFT's order
// (q, k, v, o, gate, up, down; A then B), named as PEFT names them under its wrapper
// ("model.layers.0.self_attn.q_proj.lora_A.weight"), so an adapter file copies in by name. Its
// base weights are its frozen parameters, in the layout and names of the block without
// adapters, so a Hugging Face checkpoint loads into them unchanged.
// With dropout, the adapters read dropout(x), not x (Note [LoRA dropout]).
// GPT-2's block (gpt.cpp) carries adapters the same way on c_attn (one (N, 3C) product),
// attn.c_proj, c_fc and mlp.c_proj, stored in that order and named by transformers' module paths
// ("transformer.h.0.attn.c_attn.lora_A.weight"). Hugging Face's Conv1D stores W as (in, out),
// but lockstep's blocks hold every W as (out, in) (the import and export transpose it: Note
// [Hugging Face GPT-2] in src/io/hf_model.cpp), and PEFT's A and B on a Conv1D are Linear
// weights as on a Linear, so the adapters, the merge and the PEFT files are the same as the
// Llama block's. c_fc's product feeds GELU, which the Device fuses into it: with an adapter on
// c_fc the block runs the product, adds the adapter's terms into the pre-activation it keeps,
// then GELU, so backward's GELU reads the adapted pre-activation; without one, the fused call
// as before. Under bf16 GPT-2's frozen base is held in bf16 only as the Llama block's is (Note
// [Frozen parameters]); with an adapter on c_attn or c_fc, whose outputs (qkv, fc) are kept in
// bf16, the base's product, its bias and the adapter's terms are summed in fp32 and rounded
// once, and backward's products read the gradients rounded where the bf16 block without
// adapters rounds them.

// Note [LoRA dropout]
// ~~~~~~~~~~~~~~~~~~~
// PEFT's lora_dropout drops the adapter's input alone, in training:
//   y = x W^T (+ b) + s (dropout(x) A^T) B^T,   dropout(x) = x * m / (1 - p), m in {0, 1},
// one mask per target (q, k and v read the same x through three masks, as PEFT's three
// nn.Dropout modules draw three); the base's input is never dropped, and eval and sampling
// (and the merged export, which has no adapters) drop nothing. The mask is not drawn from a
// generator's state but is a function of a key and the element's index (Device::dropout,
// dropout_keeps in common/elementwise_math.hpp: the i-th draw of a SplitMix64 stream seeded
// with the key, kept when its top 24 bits reach p 2^24). The key of a target's mask is derived
// (derive_key) from (trainer.seed, step, micro-batch, the worker's rank) by the worker
// (Replica::set_dropout_key, before each training forward), then the layer's index
// (Replica::workspace), then the target's index in the block. So:
//   - the mask is not kept from forward to backward: backward draws it again from the same
//     key (the dropped input for dA, and the mask on dx), which costs one pass over x instead of
//     (N, in) floats per target;
//   - a recompute (Note [Recomputation] in src/model/model.cpp) reruns the same forward with the
//     same key, so trainer.recompute: full stays bit-identical to none;
//   - an exact resume redraws the same masks for the same step, micro-batch
//     and rank, on any backend and with any thread count: nothing but the key and the index
//     decide them;
//   - N workers at B are not 1 worker at N B with dropout (the masks differ by rank), nor is a
//     run that shrank after losing a worker the run that did not: the masks are keyed by the
//     worker, as each worker's data is its own.
// CUDA graphs are off with dropout (a captured forward would replay the first step's key).

namespace {

// A layer whose parameters are all frozen (Note [Frozen parameters]).
class Frozen final : public Layer {
 public:
  explicit Frozen(std::unique_ptr<Layer> inner) : inner_(std::move(inner)) {}

  std::string_view kind() const noexcept override { return inner_->kind(); }
  int in_features() const noexcept override { return inner_->in_features(); }
  int out_features() const noexcept override { return inner_->out_features(); }
  std::size_t frozen_count() const noexcept override { return inner_->param_count(); }
  std::vector<ParamTensor> frozen_tensors(const std::string& prefix) const override {
    return inner_->param_tensors(prefix);
  }
  void init_frozen(float* frozen, std::uint64_t& rng) const override {
    inner_->init_parameters(frozen, rng);
  }
  std::size_t workspace_size(int batch, Precision precision) const noexcept override {
    return inner_->workspace_size(batch, precision);
  }
  std::size_t scratch_size(int batch, Precision precision) const noexcept override {
    return inner_->scratch_size(batch, precision);
  }
  std::size_t scratch_size_with_din(int batch, Precision precision) const noexcept override {
    return inner_->scratch_size_with_din(batch, precision);
  }
  bool backward_reads_output() const noexcept override { return inner_->backward_reads_output(); }
  int tied_to() const noexcept override { return inner_->tied_to(); }
  int vocab_padding() const noexcept override { return inner_->vocab_padding(); }
  bool dout_bf16() const noexcept override { return inner_->dout_bf16(); }
  std::shared_ptr<const std::vector<float>> constants() const override {
    return inner_->constants();
  }

  void forward(Device& dev, const float* /*params*/, const float* in, float* out, int batch,
               const LayerWorkspace& ws) const override {
    inner_->forward(dev, frozen(ws), in, out, batch, inner_workspace(ws));
  }
  void backward(Device& dev, const float* /*params*/, float* /*grads*/, const float* in,
                const float* out, const float* dout, float* din, int batch,
                const LayerWorkspace& ws) const override {
    if (din)
      inner_->backward(dev, frozen(ws), nullptr, in, out, dout, din, batch, inner_workspace(ws));
  }
  bool fuses_loss() const noexcept override { return inner_->fuses_loss(); }
  void forward_loss(Device& dev, const float* /*params*/, float* /*grads*/, const float* in,
                    float* din, const LossInput& loss, int batch,
                    const LayerWorkspace& ws) const override {
    inner_->forward_loss(dev, frozen(ws), nullptr, in, din, loss, batch, inner_workspace(ws));
  }

 private:
  // The inner layer's fp32 parameters: the frozen ones, or null under bf16, where the inner
  // layer reads the bf16 ones as its params_bf16 (inner_workspace) and widens what it reads in
  // fp32 itself.
  const float* frozen(const LayerWorkspace& ws) const {
    if (ws.precision == Precision::bf16) {
      if (!ws.frozen_bf16)
        throw std::logic_error("frozen layer: no bf16 frozen parameters in the workspace");
      return nullptr;
    }
    if (!ws.frozen) throw std::logic_error("frozen layer: no frozen parameters in the workspace");
    return ws.frozen;
  }
  static LayerWorkspace inner_workspace(const LayerWorkspace& ws) {
    LayerWorkspace inner = ws;
    if (ws.precision == Precision::bf16) inner.params_bf16 = ws.frozen_bf16;
    return inner;
  }
  std::unique_ptr<Layer> inner_;
};

}  // namespace

std::unique_ptr<Layer> make_frozen(std::unique_ptr<Layer> inner) {
  if (!inner) throw std::invalid_argument("make_frozen: null layer");
  return std::make_unique<Frozen>(std::move(inner));
}

std::vector<float> merge_lora(const Model& model, const LoraSpec& lora,
                              std::span<const float> adapters, std::span<const float> frozen) {
  if (adapters.size() != model.param_count() || frozen.size() != model.frozen_count())
    throw std::invalid_argument(fmt::format(
        "merge_lora: {} adapter and {} base values, the model has {} and {}", adapters.size(),
        frozen.size(), model.param_count(), model.frozen_count()));
  std::map<std::string, ParamTensor> base;
  for (ParamTensor& t : model.frozen_tensors()) base.emplace(t.name, std::move(t));
  const std::vector<ParamTensor> tensors = model.param_tensors();
  std::vector<float> merged(frozen.begin(), frozen.end());
  const float scale = lora.scale();
  const std::string a_suffix = ".lora_A.weight";
  for (std::size_t i = 0; i + 1 < tensors.size(); ++i) {
    const ParamTensor& a = tensors[i];
    if (!a.name.ends_with(a_suffix)) continue;
    const std::string module = a.name.substr(0, a.name.size() - a_suffix.size());
    const ParamTensor& b = tensors[i + 1];
    const auto w = base.find(module + ".weight");
    if (b.name != module + ".lora_B.weight" || w == base.end())
      throw std::logic_error("merge_lora: " + module + " has no B or no base weight");
    const std::size_t r = std::size_t(a.shape[0]), in = std::size_t(a.shape[1]);
    const std::size_t out = std::size_t(b.shape[0]);
    // delta (out, in) = (B A) * s, then W += delta: PEFT's get_delta_weight and merge.
    for (std::size_t o = 0; o < out; ++o)
      for (std::size_t c = 0; c < in; ++c) {
        float ba = 0.0f;
        for (std::size_t k = 0; k < r; ++k)
          ba += adapters[b.offset + o * r + k] * adapters[a.offset + k * in + c];
        merged[w->second.offset + o * in + c] += ba * scale;
      }
  }
  return merged;
}

namespace detail {

std::vector<ParamTensor> lora_tensors(const std::string& prefix,
                                      const std::vector<LoraTarget>& targets, int rank) {
  std::vector<ParamTensor> out;
  std::size_t offset = 0;
  for (const LoraTarget& t : targets) {
    out.push_back({prefix + t.module + ".lora_A.weight", offset, {rank, t.in}});
    offset += out.back().numel();
    out.push_back({prefix + t.module + ".lora_B.weight", offset, {t.out, rank}});
    offset += out.back().numel();
  }
  return out;
}

void init_lora(float* params, const std::vector<LoraTarget>& targets, int rank,
               std::uint64_t& rng) {
  for (const LoraTarget& t : targets) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(t.in));
    const std::size_t a = std::size_t(rank) * t.in, b = std::size_t(t.out) * rank;
    for (std::size_t i = 0; i < a; ++i)
      params[i] = static_cast<float>((2.0 * uniform01(rng) - 1.0) * bound);
    std::fill(params + a, params + a + b, 0.0f);
    params += a + b;
  }
}

}  // namespace detail
}  // namespace lockstep
