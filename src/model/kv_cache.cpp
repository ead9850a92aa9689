// Generation with a key/value cache: Replica::decode and the KvCache it reads and extends
// (lockstep/model.hpp), for GPT-2 and the Llama family alike.
#include <algorithm>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "lockstep/model.hpp"

namespace lockstep {

// Note [KV cache]
// ~~~~~~~~~~~~~~~
// Sampling appends one token at a time. Run as a forward, each token costs the whole window: T
// positions through every layer, and attention over T^2 pairs. But a decoder's output at
// position p depends on positions <= p alone (attention is causal; every other part works per
// position), so appending a token changes nothing computed for the positions before it; of
// those, attention reads only their keys and values. So each block keeps them, and each new
// token costs one position (Layer::decode, Replica::decode):
// - Per-position layers (the embeddings, the norms, the LM head) run their forward's ops on
//   `count` rows; GPT-2's embedding adds the position rows from `start`.
// - A block's cache is the qkv rows of the whole sequence, (T, (H + 2 Hkv) D), in the layout of
//   its forward's qkv buffer: its projection writes the new rows in place at row `start`, RoPE
//   rotates them at their positions (RopeShape::position), and attention reads q, k and v there
//   as forward reads its qkv (detail::cached_attention), with no copy and no strided write. The
//   q columns of the older rows are never read again: H D floats per position kept for nothing,
//   the price of those in-place writes (SmolLM2-135M: 30 blocks x 2048 x 960 floats, 236 MB
//   for a full context, of which 142 MB are q).
// - Attention of the `count` newest queries against the start + count cached keys is the
//   materialised path's products around causal_softmax_tail_forward, whose row i sees the keys
//   up to its own position: count = 1 sees them all; count = start + count (a prompt, from 0)
//   is the causal softmax.
// generate() (src/model/generate.cpp) runs the prompt once (the prefill, count = its length),
// then one call per token at count 1. The products are forward's on other shapes, so the logits
// agree with forward's to rounding, not bit for bit; greedy sampling is tested to draw the same
// tokens either way, on both architectures. Decode computes in fp32 from the master parameters,
// whatever the replica's precision (sampling is not a training step).

KvCache::KvCache(Device& device, const Model& model) {
  if (model.frozen_count() > 0)  // Layer::decode reads one parameter buffer (Note [LoRA])
    throw std::invalid_argument(
        "kv cache: a LoRA model's decode would need its frozen base; `lockstep export --format "
        "hf` merges the adapters into a model to sample from");
  const int context = model.inputs();
  // Layer i writes acts_[i % 2]: each as wide as the widest of its writers (one holds the
  // logits, the other the residual stream).
  std::size_t widest[2] = {0, 0}, scratch = 0;
  for (std::size_t i = 0; i < model.layers().size(); ++i) {
    const Layer& layer = *model.layers()[i];
    if (!layer.decodes())
      throw std::invalid_argument(fmt::format(
          "kv cache: layer '{}' cannot decode (only a decoder generates)", layer.kind()));
    layers_.emplace_back(device, layer.cache_size());
    widest[i % 2] = std::max<std::size_t>(widest[i % 2], layer.out_features() / context);
    scratch = std::max(scratch, layer.decode_scratch_size(context));
  }
  for (int k = 0; k < 2; ++k) acts_[k] = DeviceArray<float>(device, context * widest[k]);
  scratch_ = DeviceArray<float>(device, scratch);
}

std::size_t KvCache::bytes() const noexcept {
  std::size_t floats = acts_[0].size() + acts_[1].size() + scratch_.size();
  for (const DeviceArray<float>& layer : layers_) floats += layer.size();
  return floats * sizeof(float);
}

const float* Replica::decode(const float* ids, int start, int count, KvCache& cache) {
  const auto& layers = model_->layers();
  const int context = model_->inputs();
  if (start < 0 || count < 1 || start + count > context)
    throw std::invalid_argument(fmt::format(
        "decode: positions [{}, {}) outside the context [0, {})", start, start + count, context));
  if (cache.layers_.size() != layers.size())
    throw std::invalid_argument("decode: the cache was made for another model");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const float* in = i == 0 ? ids : cache.acts_[(i + 1) % 2].data();
    const DecodeStep step{
        .start = start, .count = count, .cache = cache.layers_[i].data(),
        .scratch = cache.scratch_.data(),
        .constants = constant_of_[i] >= 0 ? constants_[constant_of_[i]].data() : nullptr};
    layers[i]->decode(*device_, params_.data() + model_->read_offset(i), in,
                      cache.acts_[i % 2].data(), step);
  }
  return cache.acts_[(layers.size() - 1) % 2].data();
}

}  // namespace lockstep
