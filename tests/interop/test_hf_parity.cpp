// Parity with transformers for models read from Hugging Face directories. Llama, Qwen2 and
// Mistral directories that save_pretrained wrote (GQA, tied and untied, q/k/v biases, llama3
// scaling; bf16 and fp32, sharded and not) load by name, bit for bit as transformers reads them,
// into the decoder's layout (Hugging Face's names and storage order), and say the model keys
// their config.json gives. For GPT-2, a random-initialised
// model saved by save_pretrained (tests/interop/hf_parity.py make), read by load_weights as
// `train --init-from` reads it, gives transformers' logits and, for one batch, the gradient of
// the mean next-token loss of every parameter, each within 1e-5 relative (norm of the
// difference over the norm of transformers'), in fp32 on the CPU; and the same of `export
// --format hf` of those weights, read back by transformers. And 20 AdamW steps of `lockstep
// train --init-from` a Llama with grouped-query attention against transformers' model under
// torch.optim.AdamW with lockstep's settings, from the same weights on the same windows: losses
// within 1e-4 relative (hf_parity.py train). Skips without the transformers environment
// (tests/interop/hf_venv.sh).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "../cli/cli_runner.hpp"
#include "../data/temp_files.hpp"
#include "io/hf_config.hpp"
#include "lockstep/lockstep.hpp"
#include "parity_batch.hpp"
#include "python_env.hpp"

namespace fs = std::filesystem;
using lockstep::test::run_command;
using lockstep::test::write_raw;

namespace {

const std::string kScript = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/interop/hf_parity.py";

// lockstep's logits (B, T, vocab) and parameter gradients of the mean next-token loss for
// `batch` windows of context + 1 tokens, of the model the directory `hf` describes, written
// into `out` as hf_parity.py check reads them.
void lockstep_logits_and_grads(const fs::path& hf, int batch, const fs::path& out) {
  const std::optional<lockstep::WeightsModel> described = lockstep::weights_model(hf);
  REQUIRE(described);
  const lockstep::GptSpec& spec = described->spec;
  const lockstep::Model model = lockstep::Model::gpt(spec);
  const lockstep::Weights weights = lockstep::load_weights(hf, model.param_tensors());
  const std::unique_ptr<lockstep::Device> dev = lockstep::make_cpu_device(0, 1);
  lockstep::Replica replica(*dev, model, batch);
  replica.load_parameters(weights.params);

  const int T = spec.context, V = spec.vocab_size;
  const auto [tokens, inputs] = lockstep::test::parity_batch(batch, T, V);
  lockstep::DeviceArray<float> x(*dev, inputs.size());
  x.upload(inputs);
  std::vector<float> padded(static_cast<std::size_t>(model.outputs()) * static_cast<std::size_t>(batch));
  dev->copy_to_host(padded.data(), replica.forward(x.data(), batch), padded.size() * sizeof(float));
  const std::size_t width = static_cast<std::size_t>(model.outputs()) / static_cast<std::size_t>(T);

  // The logits without the padding, and the loss's gradient: (softmax - one-hot) / (B T).
  std::vector<float> logits, dlogits(padded.size(), 0.0f);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < T; ++t) {
      const std::size_t row = (static_cast<std::size_t>(b) * T + t) * width;
      const float* z = padded.data() + row;
      logits.insert(logits.end(), z, z + V);
      double max = z[0], sum = 0;
      for (int v = 0; v < V; ++v) max = std::max(max, static_cast<double>(z[v]));
      for (int v = 0; v < V; ++v) sum += std::exp(z[v] - max);
      const int target = tokens[static_cast<std::size_t>(b) * (T + 1) + t + 1];
      for (int v = 0; v < V; ++v)
        dlogits[row + v] = static_cast<float>((std::exp(z[v] - max) / sum - (v == target)) / (batch * T));
    }
  lockstep::DeviceArray<float> dl(*dev, dlogits.size());
  dl.upload(dlogits);
  replica.zero_grads();
  replica.backward(x.data(), dl.data(), batch);
  lockstep::write_safetensors(out / "grads.safetensors", model.param_tensors(), replica.gradients());
  // The same weights exported (export --format hf), for transformers to read back.
  lockstep::Checkpoint ckpt;
  ckpt.tensors = model.param_tensors();
  ckpt.params = weights.params;
  ckpt.metadata["lockstep.model"] = lockstep::to_string(spec);
  lockstep::export_hf(ckpt, out / "exported", lockstep::TensorDtype::f32, nullptr, 20'000);
  write_raw(out / "tokens.i32", tokens);
  write_raw(out / "logits.f32", logits);
}

// Makes the model with hf_parity.py, and checks lockstep against it; returns the report.
void check_parity(const std::string& python, const lockstep::test::TempDir& dir, const std::string& name,
                  const std::string& family, const std::string& fields, const std::string& save = "") {
  CAPTURE(name);
  const fs::path hf = dir.path() / name, out = dir.path() / (name + "_out");
  fs::create_directories(out);
  const auto made = run_command(python + " \"" + kScript + "\" make " + family + " " + hf.string() +
                                " '" + fields + "' " + save);
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const int batch = 2;
  lockstep_logits_and_grads(hf, batch, out);
  const auto r = run_command(python + " \"" + kScript + "\" check " + hf.string() + " " +
                             (out / "tokens.i32").string() + " " + std::to_string(batch) + " " +
                             (out / "logits.f32").string() + " " + (out / "grads.safetensors").string());
  MESSAGE(name << ": " << r.output);
  CHECK_MESSAGE(r.code == 0, r.output);
  // export --format hf of the weights lockstep read: transformers reads them back to the same
  // logits and gradients.
  const auto back = run_command(python + " \"" + kScript + "\" check " + (out / "exported").string() + " " +
                                (out / "tokens.i32").string() + " " + std::to_string(batch) + " " +
                                (out / "logits.f32").string() + " " + (out / "grads.safetensors").string());
  MESSAGE(name << " exported: " << back.output);
  CHECK_MESSAGE(back.code == 0, back.output);
}

// The Llama family's parameters in the decoder's storage order (Hugging Face's names), of the
// shapes `c` gives.
std::vector<lockstep::ParamTensor> llama_layout(const lockstep::detail::HfConfig& c) {
  std::vector<lockstep::ParamTensor> out;
  std::size_t offset = 0;
  const auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
    out.push_back({name, offset, std::move(shape)});
    offset += out.back().numel();
  };
  const std::int64_t d = c.d_model, q = c.n_head * c.head_dim, kv = c.n_kv_head * c.head_dim;
  add("model.embed_tokens.weight", {c.vocab_size, d});
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    add(layer + "input_layernorm.weight", {d});
    add(layer + "self_attn.q_proj.weight", {q, d});
    add(layer + "self_attn.k_proj.weight", {kv, d});
    add(layer + "self_attn.v_proj.weight", {kv, d});
    if (c.qkv_bias) {
      add(layer + "self_attn.q_proj.bias", {q});
      add(layer + "self_attn.k_proj.bias", {kv});
      add(layer + "self_attn.v_proj.bias", {kv});
    }
    add(layer + "self_attn.o_proj.weight", {d, q});
    add(layer + "post_attention_layernorm.weight", {d});
    add(layer + "mlp.gate_proj.weight", {c.intermediate_size, d});
    add(layer + "mlp.up_proj.weight", {c.intermediate_size, d});
    add(layer + "mlp.down_proj.weight", {d, c.intermediate_size});
  }
  add("model.norm.weight", {d});
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab_size, d});
  return out;
}

}  // namespace

TEST_CASE("interop: transformers' Llama, Qwen2 and Mistral directories load bit for bit, with their model keys") {
  const std::string python = lockstep::test::hf_python();
  if (python.empty()) return;
  const lockstep::test::TempDir dir;
  struct Case {
    std::string family, fields, save, keys;
  };
  const std::string sizes = R"("vocab_size": 96, "max_position_embeddings": 32, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,)";
  const Case cases[] = {
      {"llama", sizes + R"("num_key_value_heads": 2, "tie_word_embeddings": false, "rope_theta": 500000.0,
          "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8}})", "bfloat16 20KB",
       "family=llama vocab_size=96 context=32 n_layer=2 n_head=4 d_model=32 norm=rmsnorm norm_eps=1e-06 "
       "positions=rope rope_theta=500000 rope_scaling.type=llama3 mlp=swiglu intermediate_size=48 "
       "n_kv_head=2 head_dim=8 qkv_bias=false proj_bias=false tie_embeddings=false "
       "rope_scaling.factor=4 rope_scaling.low_freq_factor=1 rope_scaling.high_freq_factor=4 "
       "rope_scaling.original_max_position_embeddings=8"},
      {"qwen2", sizes + R"("num_key_value_heads": 1, "tie_word_embeddings": true, "rms_norm_eps": 1e-05})",
       "float32 none",
       "family=qwen2 vocab_size=96 context=32 n_layer=2 n_head=4 d_model=32 norm=rmsnorm norm_eps=1e-05 "
       "positions=rope rope_theta=10000 rope_scaling.type=none mlp=swiglu intermediate_size=48 "
       "n_kv_head=1 head_dim=8 qkv_bias=true proj_bias=false tie_embeddings=true"},
      {"mistral", sizes + R"("num_key_value_heads": 4, "sliding_window": null, "rope_theta": 1000000.0})",
       "float32 20KB",
       "family=mistral vocab_size=96 context=32 n_layer=2 n_head=4 d_model=32 norm=rmsnorm norm_eps=1e-06 "
       "positions=rope rope_theta=1000000 rope_scaling.type=none mlp=swiglu intermediate_size=48 "
       "n_kv_head=4 head_dim=8 qkv_bias=false proj_bias=false tie_embeddings=false"}};
  for (const Case& c : cases) {
    CAPTURE(c.family);
    const fs::path hf = dir.path() / c.family, params = dir.path() / (c.family + ".safetensors");
    const auto made = run_command(python + " \"" + kScript + "\" make " + c.family + " " + hf.string() +
                                  " '{" + c.fields + "' " + c.save + " " + params.string());
    REQUIRE_MESSAGE(made.code == 0, made.output);
    const std::optional<lockstep::WeightsModel> described = lockstep::weights_model(hf);
    REQUIRE(described);
    std::string keys;
    for (const auto& [key, value] : described->keys) keys += (keys.empty() ? "" : " ") + key + "=" + value;
    CHECK(keys == c.keys);
    CHECK(described->max_context == 32);

    const std::vector<lockstep::ParamTensor> layout =
        llama_layout(lockstep::detail::read_hf_config(hf / "config.json"));
    const lockstep::Weights loaded = lockstep::load_weights(hf, layout);
    const lockstep::SafetensorsFile theirs = lockstep::read_safetensors(params);
    REQUIRE(theirs.tensors.size() == layout.size());
    for (const lockstep::ParamTensor& t : theirs.tensors) {
      CAPTURE(t.name);
      const auto mine = std::find_if(layout.begin(), layout.end(),
                                     [&](const lockstep::ParamTensor& e) { return e.name == t.name; });
      REQUIRE(mine != layout.end());
      CHECK(mine->shape == t.shape);
      CHECK(std::memcmp(loaded.params.data() + mine->offset, theirs.data.data() + t.offset,
                        t.numel() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("interop: transformers' GPT-2, Llama, Qwen2 and Mistral give lockstep their logits and gradients") {
  const std::string python = lockstep::test::hf_python();
  if (python.empty()) return;
  const lockstep::test::TempDir dir;
  // A vocabulary of 96: lockstep pads its logits, transformers does not.
  check_parity(python, dir, "gpt2_bf16_sharded", "gpt2",
               R"({"vocab_size": 96, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 4,
                   "activation_function": "gelu_new"})",
               "bfloat16 20KB");
  // The Llama family, with grouped-query attention (4 query heads on 2 kv heads, and on 1) and
  // without (Mistral's 4). llama3 scaling: transformers 4.40 predates it, hf_parity.py sets its
  // frequencies.
  const std::string sizes = R"("vocab_size": 96, "max_position_embeddings": 16, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,)";
  check_parity(python, dir, "llama_bf16_sharded", "llama",
               "{" + sizes + R"("num_key_value_heads": 2, "tie_word_embeddings": false, "rope_theta": 500000.0,
                   "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8}})",
               "bfloat16 20KB");
  check_parity(python, dir, "qwen2_tied", "qwen2",
               "{" + sizes + R"("num_key_value_heads": 1, "tie_word_embeddings": true})");
  check_parity(python, dir, "mistral_sharded", "mistral",
               "{" + sizes + R"("num_key_value_heads": 4, "sliding_window": null})",
               "float32 20KB");
}

TEST_CASE("interop: 20 AdamW steps of a Llama with grouped-query attention, in lockstep and in transformers") {
  const std::string python = lockstep::test::hf_python();
  if (python.empty()) return;
  const lockstep::test::TempDir dir;
  // 4 query heads on 2 kv heads, untied, fp32; hf_parity.py train runs `lockstep train
  // --init-from` on it and transformers' model with torch.optim.AdamW, the same settings.
  const fs::path hf = dir.path() / "llama";
  const auto made = run_command(python + " \"" + kScript + "\" make llama " + hf.string() + R"( '{
      "vocab_size": 96, "max_position_embeddings": 16, "hidden_size": 32, "intermediate_size": 48,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "tie_word_embeddings": false}')");
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const auto r = run_command(python + " \"" + kScript + "\" train " + hf.string() + " " +
                             lockstep::test::cli_path() + " 20 4");
  MESSAGE(r.output);
  CHECK_MESSAGE(r.code == 0, r.output);
}
