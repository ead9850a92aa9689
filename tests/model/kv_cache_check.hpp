// Shared by the key/value cache's tests on the CPU (test_kv_cache.cpp) and the GPU
// (tests/cuda/test_cuda_kv_cache.cpp): small decoders of both architectures, and the check that
// Replica::decode gives forward's logits on any device (Note [KV cache] in
// src/model/kv_cache.cpp).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/lockstep.hpp"

namespace lockstep::test {

struct KvCase {
  std::string name;
  GptSpec spec;
};

// GPT-2; a Llama with grouped-query attention (4 query heads on 2 kv heads), q/k/v biases,
// llama3 RoPE scaling and an untied head; a tied multi-query one.
inline std::vector<KvCase> kv_cases() {
  const GptSpec gpt2{.vocab_size = 40, .context = 12, .n_layer = 2, .n_head = 2, .d_model = 16};
  GptSpec llama{.vocab_size = 40, .context = 12, .n_layer = 2, .n_head = 4, .d_model = 16,
                .norm = NormKind::rmsnorm, .norm_eps = 1e-6, .positions = PositionKind::rope,
                .rope_scaling = Llama3Scaling{.factor = 4.0, .original_max_position_embeddings = 8.0},
                .mlp = MlpKind::swiglu, .intermediate_size = 24, .n_kv_head = 2,
                .qkv_bias = true, .proj_bias = false, .tie_embeddings = false};
  GptSpec mqa = llama;
  mqa.n_kv_head = 1;
  mqa.qkv_bias = false;
  mqa.tie_embeddings = true;
  mqa.rope_scaling.reset();
  return {{"gpt2", gpt2}, {"llama gqa", llama}, {"llama mqa tied", mqa}};
}

// Parameters with logits far enough apart that greedy decoding does not hinge on rounding: the
// initial ones scaled by 8.
inline std::vector<float> spread_parameters(const Model& model, std::uint64_t seed) {
  std::vector<float> p = model.initial_parameters(seed);
  for (float& x : p) x *= 8.0f;
  return p;
}

// The logits (vocab padded, one row per position) of the sequence `tokens` read two ways on
// `dev`: by forward on the whole window, and by decode in the steps `steps` (counts summing to
// tokens.size(): a prefill, then one or more positions at a time). Returns {forward, decode}.
inline std::vector<std::vector<float>> forward_and_decode(Device& dev, const Model& model,
                                                          const std::vector<float>& params,
                                                          const std::vector<int>& tokens,
                                                          const std::vector<int>& steps) {
  const int context = model.inputs(), stride = model.outputs() / context;
  const int n = static_cast<int>(tokens.size());
  Replica replica(dev, model, 1);
  replica.load_parameters(params);
  std::vector<float> window(static_cast<std::size_t>(context), 0.0f);
  std::copy(tokens.begin(), tokens.end(), window.begin());
  DeviceArray<float> x(dev, window.size());
  x.upload(window);
  std::vector<float> full(std::size_t(context) * stride);
  dev.copy_to_host(full.data(), replica.forward(x.data(), 1), full.size() * sizeof(float));
  full.resize(std::size_t(n) * stride);

  KvCache cache(dev, model);
  std::vector<float> decoded(full.size());
  int start = 0;
  for (const int count : steps) {
    DeviceArray<float> ids(dev, std::size_t(count));
    ids.upload(std::vector<float>(window.begin() + start, window.begin() + start + count));
    dev.copy_to_host(decoded.data() + std::size_t(start) * stride,
                     replica.decode(ids.data(), start, count, cache),
                     std::size_t(count) * stride * sizeof(float));
    start += count;
  }
  return {full, decoded};
}

}  // namespace lockstep::test
