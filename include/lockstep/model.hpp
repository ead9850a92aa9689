// Models: layers, their parameter layout, and a replica on one device.
//
//   lockstep::Model model = lockstep::Model::mlp({.inputs = 64, .hidden = {128}, .classes = 10,
//                                                 .activation = lockstep::Activation::relu});
//   std::vector<float> init = model.initial_parameters(/*seed=*/0);   // host, once
//   lockstep::Replica replica(device, model, /*max_batch=*/32);
//   replica.load_parameters(init);
//   const float* logits = replica.forward(x, batch);
//
// A Model is the architecture: stateless layers and where each parameter lives. It is shared,
// read-only, by every worker. A Replica is one worker's copy: one contiguous parameter buffer,
// one contiguous gradient buffer with the same layout, and the activations.
//
// Layout: layers are stored in REVERSE order of the forward pass (the last layer at offset 0),
// so the gradients backward produces first are contiguous at the front. The reducer buckets
// views of that buffer without copying.
//
// Backward accumulates into parameter gradients (+=) and overwrites activation gradients (=).
//
// A layer maps (B, in_features) to (B, out_features) per sample. Sequence layers flatten a sample:
// a GPT block sees (B, T * C) and knows its T and C. A layer that must keep intermediate values
// from forward to backward (a transformer block's attention probabilities, say) asks for them
// through workspace_size(); forward and backward may also use scratch shared by every layer of
// a replica.
//
// Precision::bf16 (Note [bf16 compute] in src/model/ops.hpp): the replica keeps fp32 master
// parameters and a bf16 copy of them; matrix products read bf16 operands and accumulate in fp32,
// everything else stays fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/device.hpp"
#include "lockstep/export.hpp"
#include "lockstep/types.hpp"

namespace lockstep {

// A named tensor inside the parameter buffer, for checkpoints and export.
struct LOCKSTEP_API ParamTensor {
  std::string name;                  // "layers.0.weight", as in torch.nn.Sequential
  std::size_t offset = 0;            // in elements, into the parameter buffer
  std::vector<std::int64_t> shape;   // row-major
  std::size_t numel() const;
};

// Device memory a layer uses besides its input, output and parameters, and the arithmetic of
// its matrix products (Note [bf16 compute] in src/model/ops.hpp).
struct LOCKSTEP_API LayerWorkspace {
  float* saved = nullptr;    // workspace_size(batch, precision) floats, forward to backward
  float* scratch = nullptr;  // scratch_size(batch, precision) floats, shared by all layers
  Precision precision = Precision::fp32;
  // bf16: the layer's parameters rounded to bf16, at the offsets of its fp32 `params`, which
  // its matrix products read instead; null otherwise.
  const std::uint16_t* params_bf16 = nullptr;
  // bf16, a layer whose dout_bf16() is true: its output gradient rounded to bf16 (B,
  // out_features), which its backward reads instead of dout; null otherwise.
  const std::uint16_t* dout_bf16 = nullptr;
  // bf16, a layer whose dout_bf16() is true, when set: forward writes its output rounded to
  // bf16 here (B, out_features) and leaves `out` alone; the loss then reads it and writes the
  // gradient over it (dout_bf16 is the same buffer; Note [Fused classifier] in
  // src/cpu/ops/softmax.cpp).
  std::uint16_t* out_bf16 = nullptr;
  // The replica's device copy of the layer's constants() (Note [Layer constants] in
  // src/model/decoder.cpp), null when it has none.
  const float* constants = nullptr;
  // Recompute::selective: where the layer's recomputed_size() floats live, a buffer the replica
  // shares between layers; null: they are part of `saved`, after the rest, and saved holds
  // workspace_size() floats (with this set, workspace_size() - recomputed_size()).
  float* recomputed = nullptr;
  // Packed sequences: each row's position in its own sequence on the device, (B, T) int32, or
  // null for one sequence per row, at positions 0..T-1 (Replica::set_positions; Note [Packed
  // attention] in src/model/attention.hpp).
  const std::int32_t* positions = nullptr;
  // The layer's frozen parameters (Layer::frozen_count(), at Model::frozen_read_offset), which
  // have no gradient; null when it has none (Note [Frozen parameters] in src/model/lora.cpp).
  const float* frozen = nullptr;
  // bf16: the layer's frozen parameters as bf16 bits, the only copy the replica holds (frozen
  // is then null); null otherwise.
  const std::uint16_t* frozen_bf16 = nullptr;
  // Training with dropout (LoRA's, Note [LoRA dropout] in src/model/lora.cpp): the key of this
  // layer's masks in this forward (Replica::set_dropout_key, mixed with the layer's index), the
  // same when backward or a recompute draws them again; 0: no dropout (eval, sampling).
  std::uint64_t dropout_key = 0;
};

// The labels of Layer::forward_loss (device memory, kIgnoreLabel where a row does not count),
// the scale of the loss's gradient, and where its sums go.
struct LOCKSTEP_API LossInput {
  const std::int32_t* labels = nullptr;
  float grad_scale = 0.0f;
  LossStats* stats = nullptr;
};

// One call of Layer::decode: `count` positions from `start` of one sequence, the layer's
// cache (Layer::cache_size() floats, its first `start` positions filled), decode's scratch, and
// the layer's constants as LayerWorkspace::constants.
struct LOCKSTEP_API DecodeStep {
  int start = 0, count = 0;
  float* cache = nullptr;
  float* scratch = nullptr;
  const float* constants = nullptr;
};

class LOCKSTEP_API Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string_view kind() const noexcept = 0;
  virtual int in_features() const noexcept = 0;
  virtual int out_features() const noexcept = 0;
  virtual std::size_t param_count() const noexcept { return 0; }
  // This layer's tensors, with offsets relative to the layer's first parameter.
  virtual std::vector<ParamTensor> param_tensors(const std::string& /*prefix*/) const { return {}; }
  // Fills params[0..param_count()) on the host from rng draws (a 64-bit generator).
  virtual void init_parameters(float* /*params*/, std::uint64_t& /*rng_state*/) const {}
  // Frozen parameters (Note [Frozen parameters] in src/model/lora.cpp): read through
  // LayerWorkspace::frozen, never given a gradient; their tensors, offsets relative to the
  // layer's first frozen parameter, and their initial values (a base drawn from a seed).
  virtual std::size_t frozen_count() const noexcept { return 0; }
  virtual std::vector<ParamTensor> frozen_tensors(const std::string& /*prefix*/) const {
    return {};
  }
  virtual void init_frozen(float* /*frozen*/, std::uint64_t& /*rng_state*/) const {}
  // Floats of LayerWorkspace::saved and ::scratch for a batch of `batch` computed in
  // `precision` (bf16 keeps the inputs of matrix products as bf16, two to a float).
  // LayerWorkspace::saved holds what forward keeps for backward; ::scratch is free at every
  // call (forward's temporaries, backward's), shared by every layer of a replica.
  virtual std::size_t workspace_size(int /*batch*/,
                                     Precision /*precision*/ = Precision::fp32) const noexcept {
    return 0;
  }
  virtual std::size_t scratch_size(int /*batch*/,
                                   Precision /*precision*/ = Precision::fp32) const noexcept {
    return 0;
  }
  // The floats of ::scratch enough when backward gets a din (every layer but a model's first),
  // where that is less than scratch_size(), which is enough for every call: a decoder block
  // keeps its output gradient rounded to bf16 in din's storage until it writes din (Note
  // [Backward scratch lifetimes] in src/model/gpt.cpp). Replica and the memory plan size the
  // scratch by it for the layers after the first.
  virtual std::size_t scratch_size_with_din(int batch,
                                            Precision precision = Precision::fp32) const noexcept {
    return scratch_size(batch, precision);
  }
  // Whether backward reads `out`, its forward's output. A final norm's does not: the replica
  // then keeps its output, an LM head's input, in an activation gradient's buffer (Note [Head
  // input] in src/model/model.cpp).
  virtual bool backward_reads_output() const noexcept { return true; }
  // Tied weights: the index of an earlier layer whose parameters this layer reads (and whose
  // gradients it accumulates into), or -1 for its own. A tied layer has no parameters itself.
  virtual int tied_to() const noexcept { return -1; }
  // A GPT's LM head: out_features() = positions x (vocabulary + this padding), and forward sets
  // the padding's logits to -inf (no softmax mass, never the argmax, zero gradient; see Note
  // [Padded vocabulary] in src/model/gpt.cpp). 0 for every other layer.
  virtual int vocab_padding() const noexcept { return 0; }
  // Under Precision::bf16, whether backward reads its output gradient only as matrix-product
  // input, rounded to bf16, from LayerWorkspace::dout_bf16 (not dout). A loss can then write
  // the gradient in bf16 directly (Replica::dlogits_bf16).
  virtual bool dout_bf16() const noexcept { return false; }
  // Read-only values forward and backward read besides the parameters (a Llama block's RoPE
  // cos and sin), made once on the host when the model is built; null when none. Layers may
  // share one table: a Replica uploads each distinct table once, at its construction, and hands
  // it as LayerWorkspace::constants (Note [Layer constants] in src/model/decoder.cpp).
  virtual std::shared_ptr<const std::vector<float>> constants() const { return nullptr; }
  // Recompute::selective (Note [Recomputation] in src/model/model.cpp): the floats of
  // workspace_size() that recompute() rewrites from the rest of the saved values and the input
  // by element-wise kernels only (normalisations, GELU, SwiGLU), with no matrix product and no
  // attention; 0 when the layer has none.
  virtual std::size_t recomputed_size(int /*batch*/,
                                      Precision /*precision*/ = Precision::fp32) const noexcept {
    return 0;
  }
  // Writes those values into ws.recomputed again, bit for bit what forward wrote there, from
  // the same parameters and input and what forward kept in ws.saved.
  virtual void recompute(Device& /*dev*/, const float* /*params*/, const float* /*in*/,
                         int /*batch*/, const LayerWorkspace& /*ws*/) const {}

  // ---- Generation with a key/value cache (Note [KV cache] in src/model/kv_cache.cpp) ----
  // Whether decode() runs this layer: a decoder's layers do, an MLP's do not.
  virtual bool decodes() const noexcept { return false; }
  // Floats of one sequence's cache for this layer (a block's), and of decode()'s scratch for
  // `count` positions.
  virtual std::size_t cache_size() const noexcept { return 0; }
  virtual std::size_t decode_scratch_size(int /*count*/) const noexcept { return 0; }
  // Positions [step.start, step.start + step.count) of one sequence, in fp32: in (count,
  // in_features() / context), out (count, out_features() / context), where context is the
  // model's; a block reads the cached positions before step.start and appends these. The
  // default throws std::logic_error (a layer that does not decode).
  virtual void decode(Device& dev, const float* params, const float* in, float* out,
                      const DecodeStep& step) const;

  // ---- An LM head fused with its loss (Note [Chunked classifier] in src/model/lm_head.cpp) ----
  // Whether forward_loss() runs this layer (a model's last) with softmax cross-entropy.
  virtual bool fuses_loss() const noexcept { return false; }
  // Forward, the loss against loss.labels (B x out_features / classes rows) and backward, a
  // fixed count of rows at a time, so that only one chunk's logits ever exist: the loss and
  // correct count are added to *loss.stats as softmax_cross_entropy adds them. With din not
  // null, din (B, in_features) = the gradient of grad_scale x the summed loss (overwritten) and
  // grads += the parameters' (null: a frozen weight, none). din null: the loss alone, no
  // gradient (evaluation). The default throws std::logic_error.
  virtual void forward_loss(Device& dev, const float* params, float* grads, const float* in,
                            float* din, const LossInput& loss, int batch,
                            const LayerWorkspace& ws) const;

  // in (B, in_features), out (B, out_features)
  virtual void forward(Device& dev, const float* params, const float* in, float* out, int batch,
                       const LayerWorkspace& ws) const = 0;
  // dout (B, out_features) -> din (B, in_features), overwritten; din may be null (first layer).
  // Parameter gradients are accumulated into grads (+=).
  virtual void backward(Device& dev, const float* params, float* grads, const float* in,
                        const float* out, const float* dout, float* din, int batch,
                        const LayerWorkspace& ws) const = 0;
};

// weight (out, in), bias (out); out = in * weight^T + bias. PyTorch's default init:
// U(-1/sqrt(in), 1/sqrt(in)) for both.
LOCKSTEP_API std::unique_ptr<Layer> make_linear(int in_features, int out_features);
LOCKSTEP_API std::unique_ptr<Layer> make_activation(Activation f, int features);
// The GPT layers (see Model::gpt). Embedding: wte (V, C), wpe (T, C); in (B, T) token ids as
// floats, out (B, T * C). Block: one pre-LayerNorm transformer block on (B, T * C). LayerNorm:
// weight, bias (C) per position. Tied LM head: reads wte from layer `embedding_layer`, out
// (B, T * P) logits, P = V rounded up to a multiple of 64, -inf past V. A block's attention is
// fused or materialized (AttentionKind; auto resolved first by choose_attention): the same
// function, the fused path without the (B, H, T, T) matrices.
LOCKSTEP_API std::unique_ptr<Layer> make_embedding(int vocab, int context, int channels);
LOCKSTEP_API std::unique_ptr<Layer> make_block(
    int context, int channels, int heads, int n_layer,
    AttentionKind attention = AttentionKind::materialized);
LOCKSTEP_API std::unique_ptr<Layer> make_layernorm(int context, int channels);
LOCKSTEP_API std::unique_ptr<Layer> make_tied_lm_head(int embedding_layer, int vocab, int context,
                                                    int channels);

// An LM head with a weight of its own, (vocab, channels) named "weight" (an untied Llama's
// lm_head), otherwise as the tied head.
LOCKSTEP_API std::unique_ptr<Layer> make_lm_head(int vocab, int context, int channels);

struct LOCKSTEP_API MlpSpec {
  int inputs = 0;
  std::vector<int> hidden;
  int classes = 0;
  Activation activation = Activation::relu;
};

// "mlp inputs=64 hidden=64,32 classes=10 activation=relu": checkpoints carry it as
// "lockstep.model".
LOCKSTEP_API std::string to_string(const MlpSpec& spec);

// Llama 3.1's scaling of the rotary frequencies (transformers' rope_scaling with rope_type
// "llama3"): wavelengths longer than original_max_position_embeddings / low_freq_factor are
// divided by `factor`, shorter than ... / high_freq_factor kept, and those between blended.
struct LOCKSTEP_API Llama3Scaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
  bool operator==(const Llama3Scaling&) const = default;
};

// A decoder-only transformer, GPT-2 or a Llama-family model (Note [One decoder] in
// src/model/decoder.cpp). Input (B, context) token ids as floats; output logits (B, context *
// P): the vocabulary padded to P, a multiple of 64, with -inf logits past it.
//
// With its defaults it is GPT-2: token and position embeddings, n_layer pre-LayerNorm blocks
// (causal multi-head self-attention, then a 4x MLP with tanh-GELU, each on a residual), a final
// LayerNorm and an LM head tied to the token embedding. Parameter names follow nanoGPT
// ("transformer.h.0.attn.c_attn.weight", weights (out, in) as torch.nn.Linear); the tied head
// has no tensor of its own.
//
// With norm rmsnorm, positions rope and mlp swiglu it is a Llama-family decoder (Llama, Qwen2,
// Mistral, SmolLM2): a token embedding alone, n_layer blocks of RMSNorm, grouped-query
// attention with rotary embeddings, RMSNorm and a SwiGLU MLP, a final RMSNorm and an LM head,
// tied or not; parameter names and storage order are Hugging Face's
// ("model.layers.0.self_attn.q_proj.weight"). Other mixes of the parts are refused.
struct LOCKSTEP_API GptSpec {
  int vocab_size = 256;
  int context = 64;
  int n_layer = 2;
  int n_head = 4;
  int d_model = 64;
  NormKind norm = NormKind::layernorm;
  double norm_eps = 1e-5;          // rmsnorm's (layernorm's is 1e-5)
  PositionKind positions = PositionKind::learned;
  double rope_theta = 10000.0;     // rope
  std::optional<Llama3Scaling> rope_scaling{};  // rope: llama3 scaling, or none
  MlpKind mlp = MlpKind::gelu;
  int intermediate_size = 0;       // swiglu: hidden width; 0: 4 d_model
  int n_kv_head = 0;               // 0: n_head
  int head_dim = 0;                // 0: d_model / n_head
  bool qkv_bias = true;
  bool proj_bias = true;           // the attention output's and the MLP's biases
  bool tie_embeddings = true;

  // The parts of the Llama family (rmsnorm, rope, swiglu) rather than GPT-2's.
  bool llama_parts() const noexcept { return norm == NormKind::rmsnorm; }
  int kv_heads() const noexcept { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_size() const noexcept { return head_dim > 0 ? head_dim : d_model / n_head; }
  int hidden_size() const noexcept {
    return intermediate_size > 0 ? intermediate_size : 4 * d_model;
  }
};
// The same description by the name of what it is.
using DecoderSpec = GptSpec;

// "gpt vocab_size=256 context=64 n_layer=2 n_head=4 d_model=64", and back; the parse throws
// std::invalid_argument naming what it could not read. Checkpoints carry it as
// "lockstep.model". A GPT-2 spec is exactly these words; any other setting appends "key=value"
// words ("norm=rmsnorm norm_eps=1e-06 positions=rope rope_theta=10000 ..."), each where it
// differs from GPT-2's (norm_eps with rmsnorm, rope_theta with rope always), so every string an
// earlier version wrote reads as it did.
LOCKSTEP_API std::string to_string(const GptSpec& spec);
LOCKSTEP_API GptSpec parse_gpt_spec(std::string_view text);

// Training FLOPs per token of a decoder (forward and backward, as nanoGPT's and PaLM's MFU
// count them): 6 per weight that multiplies (every parameter but the embeddings' lookups: the
// position embedding, and an untied token embedding; the tied one counts once, for the LM head)
// plus 12 * n_layer * n_head * head_size * context for attention's two matrix products.
LOCKSTEP_API double gpt_flops_per_token(const GptSpec& spec);

// LoRA adapters on a decoder's projections (Note [LoRA] in src/model/lora.cpp): each target
// W (out, in) gains A (rank, in) and B (out, rank), y = x W^T + (alpha / rank) (x A^T) B^T; the
// base weights are frozen. Targets by PEFT's module names (q_proj, k_proj, v_proj, o_proj,
// gate_proj, up_proj, down_proj). rank 0: no adapters, every parameter trained.
struct LOCKSTEP_API LoraSpec {
  int rank = 0;
  double alpha = 8.0;
  std::vector<std::string> targets;
  // In training, dropout on each adapter's input with this probability, as PEFT's lora_dropout
  // (Note [LoRA dropout] in src/model/lora.cpp); the base's input is never dropped.
  double dropout = 0.0;
  bool enabled() const noexcept { return rank > 0; }
  float scale() const noexcept { return static_cast<float>(alpha / rank); }
};
// The names LoraSpec::targets may hold, in the order a block's adapters are stored.
LOCKSTEP_API const std::vector<std::string>& lora_target_names();
// "q_proj,v_proj" (model.lora.targets) as names in storage order, "all" as every one; throws
// std::invalid_argument naming an unknown or repeated name.
LOCKSTEP_API std::vector<std::string> parse_lora_targets(std::string_view text);
// Every parameter of `inner` frozen: it reads them from LayerWorkspace::frozen and computes no
// gradient for them (the embedding, norms and LM head of a LoRA model).
LOCKSTEP_API std::unique_ptr<Layer> make_frozen(std::unique_ptr<Layer> inner);

// The Llama-family layers (see Model::gpt). Token embedding: embed_tokens (V, C), no positions;
// in (B, T) token ids as floats, out (B, T * C). RMSNorm: weight (C) per position, epsilon
// `eps`. Llama block: RMSNorm, grouped-query attention with rotary embeddings and a SwiGLU MLP
// on (B, T * C), Hugging Face's tensor names ("self_attn.q_proj.weight", ...), reading the
// cos and sin of `rope` (one table shared by every block of a model).
struct LOCKSTEP_API RopeConstants {
  std::shared_ptr<const std::vector<float>> table;  // cos (positions, half), then sin
  int positions = 0;
  int half = 0;  // head_size / 2
};
// The table of a spec's rotary embeddings (rope_theta, rope_scaling), for its context.
LOCKSTEP_API RopeConstants make_rope_constants(const GptSpec& spec);
LOCKSTEP_API std::unique_ptr<Layer> make_token_embedding(int vocab, int context, int channels);
LOCKSTEP_API std::unique_ptr<Layer> make_rmsnorm(int context, int channels, double eps);
// With `lora` enabled the block's own parameters are its adapters and its base weights are
// frozen (Note [LoRA] in src/model/lora.cpp).
LOCKSTEP_API std::unique_ptr<Layer> make_llama_block(
    const GptSpec& spec, AttentionKind attention, RopeConstants rope, const LoraSpec& lora = {});

class Model;
// A LoRA model's base with its adapters merged (Note [LoRA] in src/model/lora.cpp): the frozen
// parameters (Model::frozen_tensors()' layout) with W + (alpha / rank) B A for every adapted W,
// computed in fp32 as PEFT's merge_and_unload does.
LOCKSTEP_API std::vector<float> merge_lora(const Model& model, const LoraSpec& lora,
                                           std::span<const float> adapters,
                                           std::span<const float> frozen);

class LOCKSTEP_API Model {
 public:
  // `names` prefixes each layer's tensors; by default "layers.{i}", as torch.nn.Sequential.
  explicit Model(std::vector<std::unique_ptr<Layer>> layers, std::vector<std::string> names = {});
  static Model mlp(const MlpSpec& spec);
  // `attention` fused or materialized, for every block (the reference by default). With `lora`
  // enabled (a Llama-family spec only): the adapters are the parameters, the rest frozen.
  static Model gpt(const GptSpec& spec, AttentionKind attention = AttentionKind::materialized,
                   const LoraSpec& lora = {});

  const std::vector<std::unique_ptr<Layer>>& layers() const noexcept { return layers_; }
  // Offset of layer i's parameters in the parameter buffer (see Layout above).
  std::size_t param_offset(std::size_t layer) const { return offsets_.at(layer); }
  std::size_t param_count() const noexcept { return param_count_; }
  int inputs() const;
  int outputs() const;
  std::vector<ParamTensor> param_tensors() const;
  // Widest activation, for sizing buffers.
  int max_width() const;
  // Where layer i's parameters are read from: its own block, or the block of the layer it is
  // tied to.
  std::size_t read_offset(std::size_t layer) const;
  // Recomputable layers (a transformer block): under Recompute::full a replica keeps only their
  // input and reruns their forward in backward, under Recompute::selective their
  // recomputed_size() part (Note [Recomputation] in src/model/model.cpp).
  // A layer so marked must have a forward that is a pure function of its parameters and input,
  // writing only its output and LayerWorkspace::saved, never a last layer.
  void mark_recomputable(std::size_t layer);
  bool recomputable(std::size_t layer) const { return recomputable_.at(layer) != 0; }
  // Whether a replica keeps the output of the layer below the last, the input of an LM head that
  // fuses its loss, in an activation gradient's buffer rather than a buffer of its own: when
  // that layer's backward does not read its output (Note [Head input] in src/model/model.cpp).
  bool head_input_in_gradient() const noexcept;

  // The initial parameters, drawn on the host from `seed` alone: the same for any device count.
  std::vector<float> initial_parameters(std::uint64_t seed) const;

  // Frozen parameters (Note [Frozen parameters] in src/model/lora.cpp): a second buffer with the
  // same reverse layer order, which no gradient, reducer or optimiser touches.
  std::size_t frozen_count() const noexcept { return frozen_count_; }
  std::vector<ParamTensor> frozen_tensors() const;
  // Where layer i reads its frozen parameters (a tied layer: the tied layer's).
  std::size_t frozen_read_offset(std::size_t layer) const;
  // The frozen parameters drawn from `seed` (a base that no file supplies: tests, a scratch run).
  std::vector<float> initial_frozen(std::uint64_t seed) const;

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::string> names_;
  std::vector<std::size_t> offsets_;
  std::size_t param_count_ = 0;
  std::vector<std::size_t> frozen_offsets_;
  std::size_t frozen_count_ = 0;
  std::vector<char> recomputable_;
};

// Where backward accumulates layer i's parameter gradients: the start of the region at its
// Model::read_offset (a tied layer's is the tied layer's). Unset: the replica's own gradient
// buffer. ZeRO-2 hands out its bucket buffers instead (Note [ZeRO-2] in src/train/reducer.hpp).
using GradientTarget = std::function<float*(std::size_t layer)>;

// One sequence's key/value cache for a decoder (Replica::decode, Note [KV cache] in
// src/model/kv_cache.cpp), with the activations and scratch of its steps, on one device.
class LOCKSTEP_API KvCache {
 public:
  // std::invalid_argument when a layer of `model` does not decode (an MLP).
  KvCache(Device& device, const Model& model);
  std::size_t bytes() const noexcept;  // on the device, all told

 private:
  friend class Replica;
  std::vector<DeviceArray<float>> layers_;  // layers_[i]: layer i's cache
  DeviceArray<float> acts_[2];              // ping-pong: layer i writes acts_[i % 2]
  DeviceArray<float> scratch_;
};

class LOCKSTEP_API Replica {
 public:
  // own_gradients false: no gradient buffer (grads() is null, gradients() empty); backward and
  // warm_up then need a GradientTarget. recompute full: the model's recomputable layers share
  // one saved workspace and rerun their forward in backward; selective: they share one buffer
  // for their recomputed_size() part and rerun Layer::recompute (Note [Recomputation]).
  Replica(Device& device, const Model& model, int max_batch,
          Precision precision = Precision::fp32, bool own_gradients = true,
          Recompute recompute = Recompute::none);

  Device& device() noexcept { return *device_; }
  const Model& model() const noexcept { return *model_; }
  Precision precision() const noexcept { return precision_; }
  // The fp32 master parameters, and with Precision::bf16 their copy rounded to bf16 (null
  // otherwise), which forward and backward compute with. Whoever changes params() keeps the
  // copy equal to to_bf16(params()): the optimiser's step writes it in the same pass; anything
  // else calls refresh_bf16().
  float* params() noexcept { return params_.data(); }
  std::uint16_t* params_bf16() noexcept { return params_bf16_.data(); }
  float* grads() noexcept { return grads_.data(); }
  std::size_t param_count() const noexcept { return params_.size(); }

  // Also writes the bf16 copy.
  void load_parameters(std::span<const float> host);
  // The model's frozen parameters (Model::frozen_count() floats), once, before the first forward;
  // under bf16 kept as their bf16 rounding only (Note [Frozen parameters] in src/model/lora.cpp).
  void load_frozen(std::span<const float> host);
  std::vector<float> frozen() const;  // to host (bf16: the held bf16 values, widened)
  // bf16: rounds the whole parameter buffer into the bf16 copy (one pass); nothing otherwise.
  void refresh_bf16();
  std::vector<float> parameters() const;  // to host
  std::vector<float> gradients() const;   // to host
  void zero_grads();

  // x (B, inputs) on the device -> logits (B, outputs), owned by the replica. With a bf16 LM
  // head (dlogits_bf16() not null) these are its bf16 logits widened, one pass more than
  // forward_bf16: for sampling and tests. The logits of an LM head that fuses its loss are
  // allocated by the first call (a step never makes them: Note [Chunked classifier]), not with
  // the replica.
  const float* forward(const float* x, int batch);
  // The same for a bf16 LM head: its logits in bf16, as it wrote them (B, outputs), in the
  // buffer of dlogits_bf16(), where the fused classifier (softmax_cross_entropy with bf16
  // logits) writes their gradient over them. Null, computing nothing, without one.
  const std::uint16_t* forward_bf16(const float* x, int batch);
  // Packed sequences: (B, T) int32 positions on the device, each row's place in its own
  // sequence (0 where one starts), for the forward and backward calls that follow, until set
  // again; null (the default) for one sequence per row. Attention stays inside a sequence and
  // positions (RoPE, learned) restart at each (Note [Packed attention] in
  // src/model/attention.hpp).
  void set_positions(const std::int32_t* positions) noexcept { positions_ = positions; }
  // Training with dropout (Note [LoRA dropout] in src/model/lora.cpp): the key from which the
  // forward and backward calls that follow draw their masks, until set again (each layer mixes
  // in its index); 0 (the default): no dropout, as eval and sampling run. Nothing else changes
  // it, so a backward, or a recompute in it, draws the forward's masks again.
  void set_dropout_key(std::uint64_t key) noexcept { dropout_key_ = key; }
  // dlogits (B, outputs). After each layer's parameter gradients are final, calls
  // grads_ready(layer index) so a reducer can start on them; layers run last to first.
  // When dlogits_bf16() is not null, dlogits is first rounded into it; or dlogits may be null,
  // and backward starts from the bf16 gradient already there.
  // `target`, when set, says where each layer's parameter gradients go (GradientTarget).
  void backward(const float* x, const float* dlogits, int batch,
                const std::function<void(std::size_t)>& grads_ready = {},
                const GradientTarget& target = {});
  // bf16 with a last layer whose dout_bf16() is true (a GPT's LM head): the gradient of the
  // logits rounded to bf16 (B, outputs), which a loss may write directly
  // (softmax_cross_entropy's bf16 forms) before backward(x, nullptr, ...); forward and
  // forward_bf16 leave the bf16 logits here; allocated by the first call of any of them when
  // the head fuses its loss. Null otherwise.
  std::uint16_t* dlogits_bf16();

  // Training and evaluation with an LM head fused with the loss (Layer::fuses_loss; Note
  // [Chunked classifier] in src/model/lm_head.cpp), which never makes the logits:
  //   forward_hidden(x, batch);                        // every layer but the head
  //   head_loss(batch, {.labels, .grad_scale, .stats}, /*gradients=*/true, target);
  //   backward(x, nullptr, batch, grads_ready, target);  // from the layer below the head
  // Whether the model's last layer fuses its loss.
  bool fuses_loss() const noexcept;
  // x (B, inputs) on the device: the forward of every layer but the last.
  void forward_hidden(const float* x, int batch);
  // After forward_hidden: the head's forward and the loss (Layer::forward_loss); gradients:
  // also the head's backward, its parameter gradients added (into `target`'s when set) and its
  // input gradient kept for the next backward(x, nullptr, ...), which starts below the head
  // (reporting the head's parameters first, as when it ran the head). Without gradients: the
  // loss alone (evaluation).
  void head_loss(int batch, const LossInput& loss, bool gradients,
                 const GradientTarget& target = {});

  // Token ids (count) on the device, positions [start, start + count) of one sequence, ->
  // their logits (count, outputs() / inputs()), owned by `cache`: forward through every layer's
  // decode(), reading the positions before `start` from the cache and appending these (Note [KV
  // cache] in src/model/kv_cache.cpp). fp32, from the master parameters, at any precision.
  // std::invalid_argument when start + count exceeds the context or a layer does not decode.
  const float* decode(const float* ids, int start, int count, KvCache& cache);

  // Forward and backward once at `batch` on zeros (token 0 for a GPT) with a zero gradient of
  // the logits, then the gradients zeroed: what a device makes on the first product of each
  // shape (oneDNN primitives, cuBLAS's set-up) is made here rather than in the first step
  // (Note [Warm-up] in src/train/worker_loop.hpp). The parameters are left alone; activations
  // and gradients keep nothing that a later forward and backward would read. `target`: as for
  // backward; the gradients written there are left as they are.
  void warm_up(int batch, const GradientTarget& target = {});
  // Device bytes of the layers' outputs, saved values, the shared scratch and recomputation
  // buffer, the activation gradients, the bf16 logits and the layers' constants: the memory
  // plan's activations less a worker's fp32 dlogits (activation_bytes in
  // src/train/memory_plan.cpp), until forward() makes the logits of a head that fuses its
  // loss (which a step never makes).
  std::size_t activation_bytes() const;

 private:
  // Layer i's workspace: its saved buffer, the shared scratch, and its bf16 parameters.
  LayerWorkspace workspace(std::size_t layer);
  // Whether layer i's forward is rerun in backward (Note [Recomputation]).
  bool recomputes(std::size_t layer) const;
  // Whether layer i writes parameter gradients (its own, or those of the layer it is tied to).
  bool has_gradients(std::size_t layer) const;
  // The layers' forward; the last writes bf16 logits into dlogits_bf16_ when there is one.
  void run_forward(const float* x, int batch);
  // Where layer i's output lives: acts_[i], or for the layer below a head that fuses its loss,
  // when acts_[i] is empty, dbuf_[L % 2] for L layers (Note [Head input]).
  float* output(std::size_t layer);

  Device* device_;
  const Model* model_;
  int max_batch_;
  Precision precision_;
  DeviceArray<float> params_;
  DeviceArray<std::uint16_t> params_bf16_;  // bf16 only: to_bf16(params_)
  DeviceArray<float> grads_;
  DeviceArray<float> frozen_;              // Model::frozen_count() floats, no gradient; bf16: none
  DeviceArray<std::uint16_t> frozen_bf16_;  // bf16 only: the frozen parameters' bf16 bits
  // acts_[i] = output of layer i; the last is empty until forward() with a bf16 LM head, whose
  // output is dlogits_bf16_. The one below a head that fuses its loss may be empty too: its
  // output is then in dbuf_ (output(); Note [Head input] in src/model/model.cpp).
  std::vector<DeviceArray<float>> acts_;
  Recompute recompute_;
  std::vector<DeviceArray<float>> saved_;  // saved_[i] = layer i's LayerWorkspace::saved
  // Recompute::full: the saved workspace every recomputed layer shares (selective: their
  // recomputed parts), and the layer whose values of the latest batch it holds (npos: none).
  DeviceArray<float> shared_saved_;
  std::size_t shared_holds_ = static_cast<std::size_t>(-1);
  DeviceArray<float> scratch_;             // shared LayerWorkspace::scratch
  DeviceArray<float> dbuf_[2];             // ping-pong activation gradients
  DeviceArray<std::uint16_t> dlogits_bf16_;  // see dlogits_bf16()
  // Each distinct Layer::constants() table, uploaded once; constant_of_[i]: layer i's, or -1.
  std::vector<DeviceArray<float>> constants_;
  std::vector<int> constant_of_;
  const std::int32_t* positions_ = nullptr;
  std::uint64_t dropout_key_ = 0;
  // A bf16 LM head's logits are bf16 (dlogits_bf16_), made by the first call that needs them
  // when the head fuses its loss.
  bool logits_bf16_ = false;
  // head_loss left the head's input gradient for the next backward.
  bool head_done_ = false;
};

}  // namespace lockstep
