// Model (architecture and parameter layout) and Replica (one worker's buffers).
//
// Invariants:
//  - A Model has at least one layer, and layer i's out_features equals layer i+1's in_features.
//  - Parameter offsets run in REVERSE layer order: the last layer's parameters sit at offset 0.
//    Names, initialisation and the forward pass run in forward order.
//  - A tied layer (tied_to() = j) has no parameters, j < its index, and layer j has some; it
//    reads layer j's parameters and accumulates into layer j's gradients.
//  - A Replica's gradient buffer has the parameter buffer's layout. Activation gradients
//    alternate between two ping-pong buffers, so a layer's din is never its dout.
//
// Note [Recomputation]
//   trainer.recompute (Replica's Recompute) trades backward time for activation memory in the
//   layers a model marks recomputable (a decoder's blocks), for any model, here:
//   - full is block-level activation checkpointing: a recomputable layer keeps its input, the
//     output of the layer before, which the replica keeps anyway, and no saved workspace of its
//     own. Every recomputed layer shares one saved workspace, as large as the largest of
//     theirs. Forward runs as before, each recomputed layer writing its saved values into the
//     shared one over the layer's before. Backward, before a recomputed layer's backward, runs
//     its forward again on the same input and parameters into the shared workspace and its
//     output buffer. So one block's saved activations are alive at a time.
//   - selective keeps what a matrix product or the attention made (qkv, atty, res1, GELU's input fc
//     or SwiGLU's gate | up, the attention's log-sum-exp or probabilities, the norms' statistics)
//     and drops what element-wise kernels make from those: the norms' outputs and GELU's or
//     SwiGLU's (Layer::recomputed_size; llm.c's recompute of GELU and LayerNorm, torchtitan's
//     selective checkpointing by op). A decoder block drops res1 as well, the fp32 (N, C) first
//     residual, and makes it again from the kept atty and the block's input with the attention's
//     output product (c_proj, o_proj with its adapters) and the residual add: the block's cheapest
//     product ((N, C) x (C, C), a twelfth of a GPT-2 block's forward products, by its FLOPs about
//     2% of a GPT-2 124M step), where res1 is the largest thing selective would keep in bf16 (fp32,
//     24 of a block's 120 MiB at B 8 x T 1024) and keeping it held selective above two thirds of
//     none's activations (issue 45; bench/RESULTS.md). So under bf16 a GPT-2 block recomputes 4 of
//     the 8 fp32 (N, C)-equivalents it keeps (res1 1, ln_1's and ln_2's outputs 1/2 each, GELU's
//     2). The recomputable layers' dropped parts share one buffer (LayerWorkspace::recomputed), and
//     backward calls Layer::recompute, which reruns those kernels on what was kept.
//   In both, the last layer forward ran still has its values in the shared buffer and is not
//   rerun. Nothing is allocated (the shared buffer is the replica's, sized once) and nothing
//   is read back to the host, so the step's guards hold; the bytes are Replica's and the memory
//   plan's alike (activation_bytes in src/train/memory_plan.cpp).
//   What makes it bit-identical to Recompute::none: the rerun is the same call on the same values:
//   forward(params, in, out, batch, workspace) with the same parameters, input bits, batch,
//   precision and bf16 parameter copy, on the same device, or for selective the same kernels on the
//   values forward gave them (the input norm of the kept input; the output product of the kept
//   atty, its adapters and the residual norm, the very calls forward made, through one function
//   both call; GELU of the kept fc, SwiGLU of the kept gate | up; LoRA's dropout masks drawn again
//   from the same keys), so they write the same bits (the norms' statistics are rewritten with
//   their own), and backward reads exactly what it read without recomputation.
//   What would break it: a forward that is not a pure function of (parameters, input) and the
//   workspace's keys (dropout drawing from a generator state, a counter, anything kept between
//   calls; LoRA's dropout draws from LayerWorkspace::dropout_key, Note [LoRA dropout] in
//   src/model/lora.cpp); kernels whose result depends on timing (atomics summing in arrival
//   order, an autotuner choosing another algorithm on the second call, split-K chosen by load); a
//   forward that reads its previous output or scratch left by another layer as input; the
//   optimiser or anything else changing the parameters or their bf16 copy between forward and
//   backward; and marking a layer whose forward writes anything but its output and saved
//   workspace (the LM head's logits, which the loss overwrites with their gradient, are why a
//   last layer never is; the head fused with the loss runs its backward with its forward: Note
//   [Chunked classifier]).
//   The CPU's kernels are deterministic; on a GPU the forward kernels used (cuBLAS(Lt) products
//   with a fixed algorithm, the fused attention's forward) are run-to-run deterministic too.
//   One known difference, selective on CUDA: where cuBLASLt fuses GELU into c_fc's product
//   (Note [Fused linear]) forward applies its GELU to the fp32 pre-activation, while the
//   recompute applies lockstep's GELU kernel to the kept fc, so a GPT-2 block's GELU output may
//   differ from none's in the last bit (bf16) or in cuBLASLt's GELU formula (fp32). The CPU and
//   the Llama blocks' SwiGLU run the same kernel both times, and so should CUDA with
//   LOCKSTEP_CUDA_LINEAR=bias or composed (GELU as its own kernel on the kept pre), not yet run
//   on a GPU. full has no such case: it reruns the forward itself.
//
// Note [Head input]
//   An LM head that fuses its loss (Note [Chunked classifier] in src/model/lm_head.cpp) reads
//   its input, the final norm's output (B, T * C) fp32, in head_loss (or in forward(), for
//   logits, and in a backward given dlogits), and nothing of it is needed once the head's
//   backward has run; the final norm's backward reads the norm's input and statistics, not its
//   output (Layer::backward_reads_output). So when both hold (Model::head_input_in_gradient)
//   that output has no buffer of its own: it lives in dbuf_[L % 2] for L layers, the
//   activation gradient the norm (layer L - 2) writes its din into, which no forward touches:
//   - forward_hidden() and run_forward() write it last; head_loss() reads it and writes the
//     head's din into the other buffer, dbuf_[(L - 1) % 2]; a backward given dlogits runs the
//     head's backward first, which reads it and writes that other buffer too;
//   - then the norm's backward reads its input acts_[L - 3] and its dout dbuf_[(L - 1) % 2] and
//     overwrites its din, which held its output, read by nobody after the head; the layers
//     below it run on the two buffers as ever. Under recompute the blocks rerun their forward
//     into their own outputs, acts_[i], never this one.
//   The head keeps nothing of its input either: under bf16 its products read the input rounded
//   to bf16, which each call that needs it (forward, forward_loss, backward with a weight
//   gradient) rounds again into its scratch, after the chunk of logits: the same to_bf16 of the
//   same bits, hence the same bits. For GPT-2 124M at B 8 x T 1024 in bf16 that is 24 MiB (the
//   norm's output) + 12 MiB (the head's bf16 input) less in every recompute mode, with the
//   head's scratch (74 + 12 MiB) still below a block's (144 MiB), which the replica allocates
//   anyway (issue 45: recompute full at a quarter of none). The Llama decoder's final RMSNorm
//   and its head, tied or not, are the same. The memory plan counts the same buffers
//   (activation_bytes in src/train/memory_plan.cpp reads head_input_in_gradient too).
//   What would break it: a final layer whose backward reads its output while claiming not to
//   (it must say backward_reads_output, and then keeps acts_), anything that reads the norm's
//   output after the norm's backward has begun, or a head given its din in the buffer of its
//   input (dbuf_[(L - 1) % 2] is the other one).
//   Tests: tests/train/test_recompute.cpp (a replica's gradients and bytes, the plan's figures),
//   tests/model/test_chunked_classifier.cpp (the head's calls on their scratch) and
//   bench/compare_builds.sh against a build from before (bit for bit).
#include <algorithm>
#include <functional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/model.hpp"

#include "common/bf16.hpp"
#include "common/nvtx_range.hpp"
#include "common/random.hpp"

namespace lockstep {

std::size_t ParamTensor::numel() const {
  std::size_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// ---- Model ----------------------------------------------------------------------------------

Model::Model(std::vector<std::unique_ptr<Layer>> layers, std::vector<std::string> names)
    : layers_(std::move(layers)), names_(std::move(names)) {
  if (layers_.empty()) throw std::invalid_argument("model: needs at least one layer");
  if (names_.empty())
    for (std::size_t i = 0; i < layers_.size(); ++i) names_.push_back(fmt::format("layers.{}", i));
  if (names_.size() != layers_.size())
    throw std::invalid_argument(fmt::format("model: {} names for {} layers", names_.size(),
                                            layers_.size()));
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]) throw std::invalid_argument(fmt::format("model: layer {} is null", i));
    if (i > 0 && layers_[i - 1]->out_features() != layers_[i]->in_features())
      throw std::invalid_argument(fmt::format(
          "model: layer {} ({}) outputs {} features but layer {} ({}) expects {}", i - 1,
          layers_[i - 1]->kind(), layers_[i - 1]->out_features(), i, layers_[i]->kind(),
          layers_[i]->in_features()));
    const int tied = layers_[i]->tied_to();
    if (tied >= 0 && (static_cast<std::size_t>(tied) >= i || layers_[i]->param_count() != 0 ||
                      layers_[i]->frozen_count() != 0 ||
                      layers_[tied]->param_count() + layers_[tied]->frozen_count() == 0))
      throw std::invalid_argument(fmt::format(
          "model: layer {} ({}) is tied to layer {}: it must be an earlier layer with parameters, "
          "and the tied layer must have none of its own",
          i, layers_[i]->kind(), tied));
  }
  recomputable_.assign(layers_.size(), 0);
  offsets_.resize(layers_.size());
  frozen_offsets_.resize(layers_.size());
  for (std::size_t i = layers_.size(); i-- > 0;) {
    offsets_[i] = param_count_;
    param_count_ += layers_[i]->param_count();
    frozen_offsets_[i] = frozen_count_;
    frozen_count_ += layers_[i]->frozen_count();
  }
}

std::string to_string(const MlpSpec& spec) {
  return fmt::format("mlp inputs={} hidden={} classes={} activation={}", spec.inputs,
                     fmt::join(spec.hidden, ","), spec.classes, to_string(spec.activation));
}

// Linear(inputs, h1), act, Linear(h1, h2), act, ..., Linear(h_last, classes).
Model Model::mlp(const MlpSpec& spec) {
  if (spec.inputs < 1)
    throw std::invalid_argument(
        fmt::format("mlp: inputs must be at least 1, got {}", spec.inputs));
  if (spec.classes < 1)
    throw std::invalid_argument(
        fmt::format("mlp: classes must be at least 1, got {}", spec.classes));
  for (std::size_t i = 0; i < spec.hidden.size(); ++i)
    if (spec.hidden[i] < 1)
      throw std::invalid_argument(
          fmt::format("mlp: hidden width {} must be at least 1, got {}", i, spec.hidden[i]));
  std::vector<std::unique_ptr<Layer>> layers;
  int width = spec.inputs;
  for (int h : spec.hidden) {
    layers.push_back(make_linear(width, h));
    layers.push_back(make_activation(spec.activation, h));
    width = h;
  }
  layers.push_back(make_linear(width, spec.classes));
  return Model(std::move(layers));
}

int Model::inputs() const { return layers_.front()->in_features(); }
int Model::outputs() const { return layers_.back()->out_features(); }

namespace {

// Every layer's tensors from `of(layer, name)`, offsets moved by the layer's in `offsets`.
template <class Of>
std::vector<ParamTensor> all_tensors(const std::vector<std::unique_ptr<Layer>>& layers,
                                     const std::vector<std::string>& names,
                                     const std::vector<std::size_t>& offsets, const Of& of) {
  std::vector<ParamTensor> out;
  for (std::size_t i = 0; i < layers.size(); ++i)
    for (ParamTensor& t : of(*layers[i], names[i])) {
      t.offset += offsets[i];
      out.push_back(std::move(t));
    }
  return out;
}

}  // namespace

std::vector<ParamTensor> Model::param_tensors() const {
  return all_tensors(layers_, names_, offsets_, [](const Layer& l, const std::string& name) {
    return l.param_tensors(name);
  });
}

std::vector<ParamTensor> Model::frozen_tensors() const {
  return all_tensors(layers_, names_, frozen_offsets_, [](const Layer& l, const std::string& name) {
    return l.frozen_tensors(name);
  });
}

std::size_t Model::frozen_read_offset(std::size_t layer) const {
  const int tied = layers_.at(layer)->tied_to();
  return frozen_offsets_[tied >= 0 ? static_cast<std::size_t>(tied) : layer];
}

// Drawn as the model without adapters draws its parameters from the same seed (each frozen layer
// draws what it drew as a trainable one), so a LoRA model's base from trainer.seed is the full
// model's initialisation; the adapters draw from a generator of their own, seeded alike.
std::vector<float> Model::initial_frozen(std::uint64_t seed) const {
  std::vector<float> frozen(frozen_count_);
  std::uint64_t rng_state = seed;
  for (std::size_t i = 0; i < layers_.size(); ++i)
    layers_[i]->init_frozen(frozen.data() + frozen_offsets_[i], rng_state);
  return frozen;
}

int Model::max_width() const {
  int width = 0;
  for (const auto& layer : layers_)
    width = std::max({width, layer->in_features(), layer->out_features()});
  return width;
}

std::size_t Model::read_offset(std::size_t layer) const {
  const int tied = layers_.at(layer)->tied_to();
  return offsets_[tied >= 0 ? static_cast<std::size_t>(tied) : layer];
}

void Model::mark_recomputable(std::size_t layer) {
  if (layer + 1 >= layers_.size())
    throw std::invalid_argument(
        fmt::format("model: layer {} cannot be recomputed: the last layer never is", layer));
  recomputable_.at(layer) = 1;
}

bool Model::head_input_in_gradient() const noexcept {
  const std::size_t count = layers_.size();
  return count >= 2 && layers_.back()->fuses_loss() &&
         !layers_[count - 2]->backward_reads_output();
}

std::vector<float> Model::initial_parameters(std::uint64_t seed) const {
  std::vector<float> params(param_count_);
  std::uint64_t rng_state = seed;
  for (std::size_t i = 0; i < layers_.size(); ++i)
    layers_[i]->init_parameters(params.data() + offsets_[i], rng_state);
  return params;
}

// ---- Replica --------------------------------------------------------------------------------

namespace {

int checked_max_batch(int max_batch) {
  if (max_batch < 1)
    throw std::invalid_argument(
        fmt::format("replica: max_batch must be at least 1, got {}", max_batch));
  return max_batch;
}

void check_batch(int batch, int max_batch) {
  if (batch < 0 || batch > max_batch)
    throw std::invalid_argument(
        fmt::format("replica: batch {} is outside [0, max_batch = {}]", batch, max_batch));
}

std::size_t elements(int batch, int features) {
  return static_cast<std::size_t>(batch) * static_cast<std::size_t>(features);
}

}  // namespace

Replica::Replica(Device& device, const Model& model, int max_batch, Precision precision,
                 bool own_gradients, Recompute recompute)
    : device_(&device),
      model_(&model),
      max_batch_(checked_max_batch(max_batch)),
      precision_(precision),
      params_(device, model.param_count()),
      params_bf16_(device, precision == Precision::bf16 ? model.param_count() : 0),
      grads_(device, own_gradients ? model.param_count() : 0),
      frozen_(device, precision == Precision::bf16 ? 0 : model.frozen_count()),
      frozen_bf16_(device, precision == Precision::bf16 ? model.frozen_count() : 0),
      recompute_(recompute) {
  // Activation gradients are layers' din: as wide as the widest input after the first layer.
  int din_width = 1;
  std::size_t scratch = 0, shared = 0;
  const Layer& last = *model.layers().back();  // a model has at least one layer
  logits_bf16_ = precision == Precision::bf16 && last.dout_bf16();
  const std::size_t count = model.layers().size();
  for (std::size_t i = 0; i < count; ++i) {
    const Layer& layer = *model.layers()[i];
    if (i > 0) din_width = std::max(din_width, layer.in_features());
    // A bf16 LM head writes its logits into dlogits_bf16_ instead (see forward()); a head that
    // fuses its loss gets them from the first forward() (Note [Chunked classifier]); the
    // layer below it may write into dbuf_ (Note [Head input]).
    const bool head = i + 1 == count && (logits_bf16_ || layer.fuses_loss());
    const bool head_input = i + 2 == count && model.head_input_in_gradient();
    acts_.emplace_back(device, head || head_input ? 0 : elements(max_batch, layer.out_features()));
    const std::size_t saved = layer.workspace_size(max_batch, precision);
    // Note [Recomputation]: what a recomputed layer keeps of its own, and what it shares.
    const std::size_t dropped = !recomputes(i)                    ? 0
                                : recompute == Recompute::full ? saved
                                                               : layer.recomputed_size(max_batch, precision);
    saved_.emplace_back(device, saved - dropped);
    shared = std::max(shared, dropped);
    scratch = std::max(scratch, i == 0 ? layer.scratch_size(max_batch, precision)
                                       : layer.scratch_size_with_din(max_batch, precision));
  }
  scratch_ = DeviceArray<float>(device, scratch);
  shared_saved_ = DeviceArray<float>(device, shared);
  if (logits_bf16_ && !last.fuses_loss())
    dlogits_bf16_ = DeviceArray<std::uint16_t>(device, elements(max_batch, last.out_features()));
  for (DeviceArray<float>& d : dbuf_) d = DeviceArray<float>(device, elements(max_batch, din_width));
  // Note [Layer constants]: one device copy of each distinct table.
  std::vector<const std::vector<float>*> tables;
  for (const auto& layer : model.layers()) {
    const std::shared_ptr<const std::vector<float>> table = layer->constants();
    if (!table) {
      constant_of_.push_back(-1);
      continue;
    }
    const auto it = std::find(tables.begin(), tables.end(), table.get());
    constant_of_.push_back(static_cast<int>(it - tables.begin()));
    if (it != tables.end()) continue;
    tables.push_back(table.get());
    constants_.emplace_back(device, table->size());
    constants_.back().upload(*table);
  }
}

void Replica::load_parameters(std::span<const float> host) {
  if (host.size() != params_.size())
    throw std::invalid_argument(fmt::format("replica: got {} parameters, the model has {}",
                                            host.size(), params_.size()));
  params_.upload(host);
  refresh_bf16();
}

// Under bf16 the base is rounded on the host (to nearest even, as Device::to_bf16) and only its
// bf16 bits reach the device (Note [Frozen parameters] in lora.cpp).
void Replica::load_frozen(std::span<const float> host) {
  if (host.size() != model_->frozen_count())
    throw std::invalid_argument(fmt::format("replica: got {} frozen parameters, the model has {}",
                                            host.size(), model_->frozen_count()));
  if (!frozen_bf16_.size()) return frozen_.upload(host);
  std::vector<std::uint16_t> bits(host.size());
  std::transform(host.begin(), host.end(), bits.begin(), detail::float_to_bf16);
  frozen_bf16_.upload(bits);
}

std::vector<float> Replica::frozen() const {
  if (!frozen_bf16_.size()) return frozen_.download();
  const std::vector<std::uint16_t> bits = frozen_bf16_.download();
  std::vector<float> widened(bits.size());
  std::transform(bits.begin(), bits.end(), widened.begin(), detail::bf16_to_float);
  return widened;
}

void Replica::refresh_bf16() {
  if (params_bf16_.size()) device_->to_bf16(params_.data(), params_bf16_.data(), params_.size());
}

float* Replica::output(std::size_t layer) {
  if (layer + 2 == acts_.size() && !acts_[layer].size()) return dbuf_[acts_.size() % 2].data();
  return acts_[layer].data();
}

bool Replica::recomputes(std::size_t layer) const {
  return recompute_ != Recompute::none && model_->recomputable(layer);
}

LayerWorkspace Replica::workspace(std::size_t layer) {
  const std::uint16_t* bf16 = params_bf16_.data();
  const bool full = recompute_ == Recompute::full && recomputes(layer);
  const bool selective = recompute_ == Recompute::selective && recomputes(layer);
  return {.saved = full ? shared_saved_.data() : saved_[layer].data(),
          .scratch = scratch_.data(),
          .precision = precision_,
          .params_bf16 = bf16 ? bf16 + model_->read_offset(layer) : nullptr,
          .dout_bf16 = layer + 1 == model_->layers().size() ? dlogits_bf16_.data() : nullptr,
          .out_bf16 = layer + 1 == model_->layers().size() ? dlogits_bf16_.data() : nullptr,
          .constants = constant_of_[layer] >= 0 ? constants_[constant_of_[layer]].data() : nullptr,
          .recomputed = selective ? shared_saved_.data() : nullptr,
          .positions = positions_,
          .frozen = frozen_.size() ? frozen_.data() + model_->frozen_read_offset(layer) : nullptr,
          .frozen_bf16 = frozen_bf16_.size()
                             ? frozen_bf16_.data() + model_->frozen_read_offset(layer)
                             : nullptr,
          .dropout_key = dropout_key_ != 0 ? detail::derive_key(dropout_key_, layer) : 0};
}

void Layer::forward_loss(Device& /*dev*/, const float* /*params*/, float* /*grads*/,
                         const float* /*in*/, float* /*din*/, const LossInput& /*loss*/,
                         int /*batch*/, const LayerWorkspace& /*ws*/) const {
  throw std::logic_error(fmt::format("layer '{}' does not fuse a loss", kind()));
}

// Layer's key function (its vtable and typeinfo are emitted here, with the rest of Layer's
// defaults): a layer with no cached decode (Note [KV cache] in src/model/kv_cache.cpp).
void Layer::decode(Device& /*dev*/, const float* /*params*/, const float* /*in*/,
                   float* /*out*/, const DecodeStep& /*step*/) const {
  throw std::logic_error(fmt::format("layer '{}' has no cached decode", kind()));
}

std::vector<float> Replica::parameters() const { return params_.download(); }
std::vector<float> Replica::gradients() const { return grads_.download(); }

void Replica::zero_grads() {
  if (grads_.size()) device_->fill(grads_.data(), 0.0f, grads_.size());
}

void Replica::run_forward(const float* x, int batch) {
  check_batch(batch, max_batch_);
  (void)dlogits_bf16();  // the bf16 logits' buffer, made now if the head fuses its loss
  const auto& layers = model_->layers();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const float* in = i == 0 ? x : output(i - 1);
    layers[i]->forward(*device_, params_.data() + model_->read_offset(i), in, output(i), batch,
                       workspace(i));
    if (recomputes(i)) shared_holds_ = i;
  }
}

const float* Replica::forward(const float* x, int batch) {
  if (!acts_.back().size())  // a bf16 head's widened logits, or those of a head fusing its loss
    acts_.back() = DeviceArray<float>(*device_, elements(max_batch_, model_->outputs()));
  run_forward(x, batch);
  if (dlogits_bf16_.size())
    device_->from_bf16(dlogits_bf16_.data(), acts_.back().data(),
                       elements(batch, model_->layers().back()->out_features()));
  return acts_.back().data();
}

const std::uint16_t* Replica::forward_bf16(const float* x, int batch) {
  if (!logits_bf16_) return nullptr;
  run_forward(x, batch);
  return dlogits_bf16_.data();
}

std::uint16_t* Replica::dlogits_bf16() {
  if (logits_bf16_ && !dlogits_bf16_.size())
    dlogits_bf16_ = DeviceArray<std::uint16_t>(*device_, elements(max_batch_, model_->outputs()));
  return dlogits_bf16_.data();
}

bool Replica::fuses_loss() const noexcept { return model_->layers().back()->fuses_loss(); }

void Replica::forward_hidden(const float* x, int batch) {
  check_batch(batch, max_batch_);
  if (!fuses_loss())
    throw std::logic_error("replica: forward_hidden needs an LM head that fuses its loss");
  const auto& layers = model_->layers();
  for (std::size_t i = 0; i + 1 < layers.size(); ++i) {
    const float* in = i == 0 ? x : output(i - 1);
    layers[i]->forward(*device_, params_.data() + model_->read_offset(i), in, output(i), batch,
                       workspace(i));
    if (recomputes(i)) shared_holds_ = i;
  }
  head_done_ = false;
}

// The head's input gradient goes where backward's layer L - 1 would have written it,
// dbuf_[(L - 1) % 2], which layer L - 2 reads as its dout.
void Replica::head_loss(int batch, const LossInput& loss, bool gradients,
                        const GradientTarget& target) {
  check_batch(batch, max_batch_);
  const auto& layers = model_->layers();
  const std::size_t head = layers.size() - 1;
  if (!fuses_loss() || head == 0)
    throw std::logic_error("replica: head_loss needs an LM head that fuses its loss, after "
                           "other layers");
  const detail::NvtxRange range("loss layers.", head);
  const std::size_t offset = model_->read_offset(head);
  float* grads = nullptr;
  if (gradients && has_gradients(head)) {
    if (!target && grads_.size() != model_->param_count())
      throw std::invalid_argument("replica: head_loss without a gradient buffer needs a target");
    grads = target ? target(head) : grads_.data() + offset;
  }
  layers[head]->forward_loss(*device_, params_.data() + offset, grads, output(head - 1),
                             gradients ? dbuf_[head % 2].data() : nullptr, loss, batch,
                             workspace(head));
  head_done_ = gradients;
}

bool Replica::has_gradients(std::size_t layer) const {
  const auto& layers = model_->layers();
  const int tied = layers[layer]->tied_to();
  return layers[layer]->param_count() > 0 ||
         (tied >= 0 && layers[static_cast<std::size_t>(tied)]->param_count() > 0);
}

// Layer i writes its din into dbuf_[i % 2] and reads its dout from dbuf_[(i + 1) % 2], which
// layer i + 1 wrote; the last layer reads dlogits, the first writes no din.
void Replica::backward(const float* x, const float* dlogits, int batch,
                       const std::function<void(std::size_t)>& grads_ready,
                       const GradientTarget& target) {
  check_batch(batch, max_batch_);
  if (!target && grads_.size() != model_->param_count())
    throw std::invalid_argument("replica: backward without a gradient buffer needs a target");
  const auto& layers = model_->layers();
  // After head_loss: the head's backward is done, its input gradient in dbuf_.
  const bool from_head = !dlogits && head_done_;
  head_done_ = false;
  if (logits_bf16_ && dlogits)
    device_->to_bf16(dlogits, dlogits_bf16(), elements(batch, layers.back()->out_features()));
  if (!dlogits && !from_head && !dlogits_bf16_.size())
    throw std::invalid_argument(
        "replica: backward without dlogits needs a bf16 LM head or head_loss first");
  if (from_head && grads_ready && layers.back()->param_count() > 0)
    grads_ready(layers.size() - 1);
  for (std::size_t i = layers.size() - (from_head ? 1 : 0); i-- > 0;) {
    const float* in = i == 0 ? x : output(i - 1);
    const float* dout = i + 1 == layers.size() ? dlogits : dbuf_[(i + 1) % 2].data();
    float* din = i == 0 ? nullptr : dbuf_[i % 2].data();
    const std::size_t offset = model_->read_offset(i);
    if (recomputes(i) && shared_holds_ != i) {  // Note [Recomputation]
      const detail::NvtxRange recompute("recompute layers.", i);
      if (recompute_ == Recompute::full)
        layers[i]->forward(*device_, params_.data() + offset, in, output(i), batch,
                           workspace(i));
      else
        layers[i]->recompute(*device_, params_.data() + offset, in, batch, workspace(i));
      shared_holds_ = i;
    }
    const detail::NvtxRange range("backward layers.", i);
    float* grads = !has_gradients(i) ? nullptr : target ? target(i) : grads_.data() + offset;
    layers[i]->backward(*device_, params_.data() + offset, grads, in, output(i), dout, din, batch,
                        workspace(i));
    if (grads_ready && layers[i]->param_count() > 0) grads_ready(i);
  }
}

std::size_t Replica::activation_bytes() const {
  std::size_t floats = scratch_.size() + shared_saved_.size() + dbuf_[0].size() + dbuf_[1].size();
  for (const auto* buffers : {&acts_, &saved_, &constants_})
    for (const DeviceArray<float>& a : *buffers) floats += a.size();
  return floats * sizeof(float) + dlogits_bf16_.size() * sizeof(std::uint16_t);
}

// An LM head fused with its loss warms up as a step runs it. Otherwise the logits' buffer,
// zeroed, serves as their gradient: the last layer's backward only reads it, as it reads its
// output, and the next forward overwrites it. With a bf16 LM head it is dlogits_bf16_ (zero
// bits are bf16 zeros, two to a float; the head's rows have an even P).
void Replica::warm_up(int batch, const GradientTarget& target) {
  check_batch(batch, max_batch_);
  const DeviceArray<float> x(*device_, elements(batch, model_->inputs()));  // allocated zeroed
  const std::size_t n = elements(batch, model_->outputs());
  if (fuses_loss()) {
    // Label 0 at every position with a zero scale: a zero gradient of the logits, as below,
    // through the step's own path (Note [Chunked classifier]).
    const DeviceArray<std::int32_t> labels(*device_, elements(batch, model_->inputs()));
    DeviceArray<LossStats> stats(*device_, 1);
    forward_hidden(x.data(), batch);
    head_loss(batch, {.labels = labels.data(), .grad_scale = 0.0f, .stats = stats.data()},
              /*gradients=*/true, target);
    backward(x.data(), nullptr, batch, {}, target);
  } else if (dlogits_bf16_.size()) {
    if (n % 2 != 0) throw std::logic_error("replica: a bf16 LM head's logits have an odd count");
    run_forward(x.data(), batch);
    device_->fill(reinterpret_cast<float*>(dlogits_bf16_.data()), 0.0f, n / 2);
    backward(x.data(), nullptr, batch, {}, target);
  } else {
    forward(x.data(), batch);
    float* dlogits = acts_.back().data();
    device_->fill(dlogits, 0.0f, n);
    backward(x.data(), dlogits, batch, {}, target);
  }
  zero_grads();
}

}  // namespace lockstep
