// The Llama-family decoder (Note [One decoder] in src/model/decoder.cpp): finite-difference
// checks of its block (with and without biases, both attention paths, a head size of its own)
// and of a whole tiny model through a Replica (tied and untied head); Hugging Face's names and
// storage order; the spec's text; causality.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "lockstep/model.hpp"

namespace {

using lockstep::DeviceArray;
using lockstep::Model;
using namespace lockstep::test;

constexpr lockstep::GptSpec kLlama{.vocab_size = 11, .context = 5, .n_layer = 2, .n_head = 2,
                                   .d_model = 8, .norm = lockstep::NormKind::rmsnorm,
                                   .norm_eps = 1e-6, .positions = lockstep::PositionKind::rope,
                                   .mlp = lockstep::MlpKind::swiglu, .intermediate_size = 12,
                                   .qkv_bias = false, .proj_bias = false,
                                   .tie_embeddings = false};

// FD of one block on its own: every parameter and the input.
void check_block(const lockstep::GptSpec& spec, lockstep::AttentionKind attention) {
  const int batch = 2;
  const auto layer =
      lockstep::make_llama_block(spec, attention, lockstep::make_rope_constants(spec));
  auto params = random_floats(layer->param_count(), 4, -0.5, 0.5);
  const auto g = layer_gradients(*layer, batch, params,
                                 random_floats(std::size_t(batch) * spec.context * spec.d_model,
                                               5, -2.0, 2.0),
                                 6);
  std::string miss = mismatch(g.fd_params, g.params);
  CHECK_MESSAGE(miss.empty(), "parameters: ", miss);
  miss = mismatch(g.fd_input, g.input);
  CHECK_MESSAGE(miss.empty(), "input: ", miss);
}

// FD of a whole model's mean next-token cross-entropy, every parameter.
void check_model(const lockstep::GptSpec& spec) {
  const Model model = Model::gpt(spec);
  auto dev = lockstep::make_cpu_device(0, 2);
  const int batch = 2, t = spec.context, v = spec.vocab_size;
  lockstep::Replica replica(*dev, model, /*max_batch=*/3);
  std::vector<float> params = model.initial_parameters(3);
  // Away from the 0.02 init, so that attention is not uniform; the loss is summed in fp32, so a
  // larger scale (sharper curvature, noisier differences) would blur the check.
  for (float& p : params) p *= 2.0f;
  auto xd = on_device(*dev, random_tokens(std::size_t(batch) * t, v, 16));
  auto yd = on_device(*dev, random_labels(std::size_t(batch) * t, v, 17));
  const int padded = model.outputs() / t;
  DeviceArray<float> dlogits(*dev, std::size_t(batch) * t * padded);
  const int rows = batch * t;
  const auto loss = [&](float* grad) {
    replica.load_parameters(params);
    const float* logits = replica.forward(xd.data(), batch);
    return dev->softmax_cross_entropy(logits, yd.data(), rows, padded, grad, 1.0f / rows)
               .loss_sum /
           rows;
  };
  replica.zero_grads();
  loss(dlogits.data());
  replica.backward(xd.data(), dlogits.data(), batch);
  const auto analytic = replica.gradients();
  std::vector<double> fd;
  for (std::size_t i = 0; i < params.size(); ++i)
    fd.push_back(central_difference(params, i, [&] { return loss(nullptr); }, 1e-3f));
  const std::string miss = mismatch(fd, analytic);
  CHECK_MESSAGE(miss.empty(), miss);
}

}  // namespace

TEST_SUITE("gradcheck") {
  TEST_CASE("llama block: every parameter and the input, no biases, both attention paths") {
    check_block(kLlama, lockstep::AttentionKind::materialized);
    check_block(kLlama, lockstep::AttentionKind::fused);
  }

  TEST_CASE("llama block with q/k/v and projection biases, and a head size of its own") {
    lockstep::GptSpec spec = kLlama;
    spec.qkv_bias = spec.proj_bias = true;
    spec.head_dim = 6;  // Q = 12 != C = 8: o_proj is (8, 12)
    check_block(spec, lockstep::AttentionKind::materialized);
  }

  TEST_CASE("llama block with grouped-query attention: 4 query heads on 2 and on 1 kv heads") {
    lockstep::GptSpec spec = kLlama;
    spec.n_head = 4;
    spec.head_dim = 2;
    for (const int kv : {2, 1}) {
      CAPTURE(kv);
      spec.n_kv_head = kv;
      spec.qkv_bias = kv == 1;
      check_block(spec, lockstep::AttentionKind::materialized);
      check_block(spec, lockstep::AttentionKind::fused);
    }
  }

  TEST_CASE("a tiny Llama through a Replica: untied and tied heads, every parameter") {
    check_model(kLlama);
    lockstep::GptSpec tied = kLlama;
    tied.tie_embeddings = true;
    tied.qkv_bias = true;
    check_model(tied);
  }
}

TEST_SUITE("model") {
  TEST_CASE("llama layout: Hugging Face's names and storage order, q|k|v and gate|up stacked") {
    lockstep::GptSpec spec = kLlama;
    spec.qkv_bias = true;
    const Model model = Model::gpt(spec);
    const auto tensors = model.param_tensors();
    std::vector<std::string> names;
    for (const auto& t : tensors) names.push_back(t.name);
    const std::vector<std::string> layer0 = {
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.k_proj.bias",
        "model.layers.0.self_attn.v_proj.bias",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight"};
    CHECK(names.front() == "model.embed_tokens.weight");
    CHECK(std::vector<std::string>(names.begin() + 1, names.begin() + 13) == layer0);
    CHECK(names[names.size() - 2] == "model.norm.weight");
    CHECK(names.back() == "lm_head.weight");
    // Contiguous within a layer: each stacked product reads one matrix.
    for (std::size_t i = 1; i + 1 < 13; ++i)
      CHECK(tensors[i].offset + tensors[i].numel() == tensors[i + 1].offset);
    const auto find = [&](const std::string& name) {
      return *std::find_if(tensors.begin(), tensors.end(),
                           [&](const auto& t) { return t.name == name; });
    };
    CHECK(find("model.layers.1.mlp.gate_proj.weight").shape == std::vector<std::int64_t>{12, 8});
    CHECK(find("model.layers.1.mlp.down_proj.weight").shape == std::vector<std::int64_t>{8, 12});
    CHECK(find("lm_head.weight").shape == std::vector<std::int64_t>{11, 8});
    // Tied: no lm_head tensor; the head reads embed_tokens.
    lockstep::GptSpec tied = kLlama;
    tied.tie_embeddings = true;
    const Model tied_model = Model::gpt(tied);
    CHECK(tied_model.param_count() == model.param_count() - 11 * 8 - 3 * 16);
    CHECK(tied_model.param_tensors().back().name == "model.norm.weight");
    // Init: norms 1, weights N(0, 0.02).
    const auto init = model.initial_parameters(7);
    const auto norm = find("model.layers.0.post_attention_layernorm.weight");
    CHECK(std::all_of(init.begin() + norm.offset, init.begin() + norm.offset + 8,
                      [](float x) { return x == 1.0f; }));
    const auto bias = find("model.layers.0.self_attn.q_proj.bias");
    CHECK(std::all_of(init.begin() + bias.offset, init.begin() + bias.offset + bias.numel(),
                      [](float x) { return x == 0.0f; }));
    double sq = 0;
    const auto up = find("model.layers.0.mlp.up_proj.weight");
    for (std::size_t i = 0; i < up.numel(); ++i) sq += double(init[up.offset + i]) * init[up.offset + i];
    CHECK(std::sqrt(sq / up.numel()) == doctest::Approx(0.02).epsilon(0.25));
  }

  TEST_CASE("llama is causal: a later token never changes earlier logits") {
    const Model model = Model::gpt(kLlama);
    auto dev = lockstep::make_cpu_device(0, 1);
    lockstep::Replica replica(*dev, model, 1);
    replica.load_parameters(model.initial_parameters(5));
    std::vector<float> x = {1, 2, 3, 4, 5};
    auto xd = on_device(*dev, x);
    const int p = model.outputs() / kLlama.context;
    const auto logits = [&] {
      const float* l = replica.forward(xd.data(), 1);
      return std::vector<float>(l, l + std::size_t(4) * p);  // the first four positions
    };
    const auto before = logits();
    x[4] = 9;
    xd.upload(x);
    CHECK(logits() == before);
  }

  TEST_CASE("decoder spec text: GPT-2's exactly as before, a Llama's settings appended, both read back") {
    const lockstep::GptSpec gpt2{.vocab_size = 50257, .context = 1024, .n_layer = 12,
                                 .n_head = 12, .d_model = 768};
    CHECK(lockstep::to_string(gpt2) ==
          "gpt vocab_size=50257 context=1024 n_layer=12 n_head=12 d_model=768");
    // A string an earlier version wrote reads as GPT-2.
    const auto old = lockstep::parse_gpt_spec("gpt vocab_size=256 context=64 n_layer=4 n_head=4 "
                                              "d_model=128");
    CHECK(!old.llama_parts());
    CHECK(old.tie_embeddings);
    CHECK(lockstep::to_string(old) == "gpt vocab_size=256 context=64 n_layer=4 n_head=4 d_model=128");

    lockstep::GptSpec llama = kLlama;
    llama.rope_scaling = lockstep::Llama3Scaling{32.0, 1.0, 4.0, 8192.0};
    llama.head_dim = 6;
    llama.n_kv_head = 1;
    llama.qkv_bias = true;
    const std::string text = lockstep::to_string(llama);
    CHECK(text ==
          "gpt vocab_size=11 context=5 n_layer=2 n_head=2 d_model=8 norm=rmsnorm norm_eps=1e-06 "
          "positions=rope rope_theta=10000 rope_scaling=llama3:32,1,4,8192 mlp=swiglu "
          "intermediate_size=12 n_kv_head=1 head_dim=6 proj_bias=false tie_embeddings=false");
    const auto back = lockstep::parse_gpt_spec(text);
    CHECK(lockstep::to_string(back) == text);
    CHECK(back.rope_scaling == llama.rope_scaling);
    CHECK(back.head_dim == 6);
    CHECK(back.qkv_bias);
    for (const char* bad : {"norm=batchnorm", "mlp=relu", "n_kv_head=0", "rope_scaling=yarn:2",
                            "qkv_bias=maybe", "colour=blue", "norm=rmsnorm norm=rmsnorm", "norm"}) {
      INFO(bad);
      CHECK_THROWS_AS(lockstep::parse_gpt_spec(
                          std::string("gpt vocab_size=2 context=2 n_layer=1 n_head=1 d_model=2 ") +
                          bad),
                      std::invalid_argument);
    }
  }

  TEST_CASE("decoder mixes of parts, and kv heads that do not divide the heads, are refused") {
    lockstep::GptSpec mix = kLlama;
    mix.positions = lockstep::PositionKind::learned;
    CHECK_THROWS_AS(Model::gpt(mix), std::invalid_argument);
    lockstep::GptSpec gpt2_untied{.vocab_size = 11, .context = 5, .n_layer = 1, .n_head = 2,
                                  .d_model = 8};
    gpt2_untied.tie_embeddings = false;
    CHECK_THROWS_AS(Model::gpt(gpt2_untied), std::invalid_argument);
    lockstep::GptSpec odd = kLlama;
    odd.n_head = 4;
    odd.n_kv_head = 3;
    CHECK_THROWS_AS(Model::gpt(odd), std::invalid_argument);
  }

  TEST_CASE("decoder FLOPs per token: 6 per multiplying weight plus attention's products") {
    const lockstep::GptSpec s = kLlama;  // C 8, H 2, D 4, F 12, V 11, T 5, L 2, untied
    const double block = 8.0 * 24 + 8 * 8 + 3 * 8 * 12 + 2 * 8;  // qkv, o, gate|up|down, norms
    const double params = 11 * 8 + 2 * block + 8;  // the head; the untied embedding is a lookup
    CHECK(lockstep::gpt_flops_per_token(s) == doctest::Approx(6 * params + 12 * 2 * 8 * 5));
  }
}
