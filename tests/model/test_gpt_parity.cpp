// GPT parity with PyTorch: lockstep trains a small GPT for a dozen AdamW steps on the CPU and
// writes its initial weights, the token windows, its losses and its step-1 gradient; then
// tests/model/gpt_parity.py trains the same architecture in PyTorch from the same weights on the
// same windows and compares (relative error <= 1e-4 in fp32). Skips when PyTorch can't be
// imported (LOCKSTEP_PYTHON names the interpreter; default /usr/bin/python3, Debian's, which
// has python3-torch). LOCKSTEP_PARITY_BACKEND=cuda runs lockstep's side on GPU 0 and PyTorch's
// on cuda (scripts/gpu_check.sh does), TF32 off on both.
//
// The cases "through lockstep train" let the script drive the CLI instead (gpt_parity.py
// --lockstep), which is how trainer.precision is reached: fp32 within 1e-4 of PyTorch; bf16
// near PyTorch's CPU autocast and measurably away from its fp32 run, so that a bf16 run that
// computed in fp32 fails (Note [bf16 parity] in gpt_parity.py).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../cli/cli_runner.hpp"
#include "../data/temp_files.hpp"
#include "../skip.hpp"
#include "common/random.hpp"
#include "lockstep/device.hpp"
#include "lockstep/model.hpp"
#include "train/optimizer.hpp"

namespace {

std::string python_interpreter() {
  if (const char* p = std::getenv("LOCKSTEP_PYTHON")) return p;
  return std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

template <class T>
void write_raw(const std::filesystem::path& file, const std::vector<T>& v) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  REQUIRE(out.good());
}

// gpt_parity.py --lockstep: `lockstep train` at `precision` against PyTorch, the losses of 12
// AdamW steps.
void check_through_cli(const std::string& precision, const std::string& attention) {
  const std::string python = python_interpreter();
  if (lockstep::test::run_command(python + " -c 'import torch, numpy'").code != 0) {
    lockstep::test::skip(lockstep::test::Skip::missing,
                         python + " cannot import torch and numpy (Debian: python3-torch)");
    return;
  }
  const char* backend = std::getenv("LOCKSTEP_PARITY_BACKEND");
  const bool cuda = backend && std::string(backend) == "cuda";
  const auto r = lockstep::test::run_command(
      python + " \"" LOCKSTEP_SOURCE_DIR "/tests/model/gpt_parity.py\" --lockstep " +
      lockstep::test::cli_path() + " --precision " + precision + " --attention " + attention +
      (cuda ? " --device cuda" : ""));
  MESSAGE(r.output);
  CHECK_MESSAGE(r.code == 0, r.output);
}

}  // namespace

// model.attention auto, and fused: the CPU's tiled attention (Note [Tiled attention]), which
// auto leaves to contexts of 256 and more in fp32.
TEST_CASE("gpt parity with PyTorch through lockstep train: fp32, the loss at 12 AdamW steps") {
  for (const char* attention : {"auto", "fused"}) {
    INFO("model.attention ", attention);
    check_through_cli("fp32", attention);
  }
}

TEST_CASE("gpt parity with PyTorch through lockstep train: bf16 against torch.autocast") {
  for (const char* attention : {"auto", "fused"}) {
    INFO("model.attention ", attention);
    check_through_cli("bf16", attention);
  }
}

namespace {

// The manifest's model: GPT-2's five numbers, and a Llama-family decoder's settings after them.
std::string manifest_model(const lockstep::GptSpec& spec) {
  std::string out = fmt::format(
      "\"vocab_size\": {}, \"context\": {}, \"n_layer\": {}, \"n_head\": {}, \"d_model\": {}",
      spec.vocab_size, spec.context, spec.n_layer, spec.n_head, spec.d_model);
  if (!spec.llama_parts()) return out;
  return out + fmt::format(
      ", \"norm\": \"rmsnorm\", \"norm_eps\": {:.9g}, \"rope_theta\": {:.9g}, "
      "\"n_kv_head\": {}, \"head_dim\": {}, \"intermediate_size\": {}, \"qkv_bias\": {}, "
      "\"proj_bias\": {}, \"tie_embeddings\": {}",
      spec.norm_eps, spec.rope_theta, spec.kv_heads(), spec.head_size(), spec.hidden_size(),
      spec.qkv_bias, spec.proj_bias, spec.tie_embeddings);
}

// lockstep trains `spec` for 12 AdamW steps; gpt_parity.py trains its PyTorch transcription
// from the same weights on the same windows and compares.
void check_parity(const lockstep::GptSpec& spec) {
  const std::string python = python_interpreter();
  if (lockstep::test::run_command(python + " -c 'import torch, numpy'").code != 0) {
    lockstep::test::skip(lockstep::test::Skip::missing,
                         python + " cannot import torch and numpy (Debian: python3-torch)");
    return;
  }
  const int batch = 3, steps = 12, rows = batch * spec.context;
  const lockstep::AdamWParams opt{.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                  .weight_decay = 0.1f};
  const float lr = 3e-3f;

  const lockstep::Model model = lockstep::Model::gpt(spec);
  const char* backend_env = std::getenv("LOCKSTEP_PARITY_BACKEND");
  const bool cuda = backend_env && std::string(backend_env) == "cuda";
  const int gpu = 0;
  std::unique_ptr<lockstep::Backend> backend =
      cuda ? lockstep::make_backend(lockstep::BackendKind::cuda, std::span(&gpu, 1)) : nullptr;
  std::unique_ptr<lockstep::Device> dev =
      cuda ? backend->create_device(gpu, 1, 0) : lockstep::make_cpu_device(0, 2);
  lockstep::Replica replica(*dev, model, batch);
  const std::vector<float> init = model.initial_parameters(11);
  replica.load_parameters(init);
  // The trainer's optimiser, with its two decay groups (Note [Decay groups]).
  lockstep::detail::Optimizer adamw(
      *dev,
      {.type = lockstep::OptimizerKind::adamw, .lr = lr, .weight_decay = opt.weight_decay,
       .beta1 = opt.beta1, .beta2 = opt.beta2, .eps = opt.eps},
      model.param_count(),
      lockstep::detail::decay_spans(model.param_tensors(), model.param_count(), false));
  const int width = model.outputs() / spec.context;  // 61 padded to 64: Note [Padded vocabulary]
  lockstep::DeviceArray<float> x(*dev, std::size_t(rows)), dlogits(*dev, std::size_t(rows) * width);
  lockstep::DeviceArray<std::int32_t> y(*dev, std::size_t(rows));

  // Windows of context + 1 tokens from a repetitive stream, so that the loss visibly falls.
  std::vector<std::int32_t> windows;
  std::uint64_t rng = 5;
  for (int i = 0; i < steps * batch * (spec.context + 1); ++i)
    windows.push_back(static_cast<std::int32_t>(
        (i * 7 + static_cast<int>(lockstep::detail::uniform_below(rng, 3))) % spec.vocab_size));
  std::vector<double> losses;
  std::vector<float> grads1;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> xs;
    std::vector<std::int32_t> ys;
    for (int b = 0; b < batch; ++b) {
      const std::int32_t* w = windows.data() + std::size_t(step * batch + b) * (spec.context + 1);
      for (int t = 0; t < spec.context; ++t) {
        xs.push_back(static_cast<float>(w[t]));
        ys.push_back(w[t + 1]);
      }
    }
    x.upload(xs);
    y.upload(ys);
    replica.zero_grads();
    const float* logits = replica.forward(x.data(), batch);
    losses.push_back(dev->softmax_cross_entropy(logits, y.data(), rows, width,
                                                dlogits.data(), 1.0f / rows).loss_sum / rows);
    replica.backward(x.data(), dlogits.data(), batch);
    if (step == 0) grads1 = replica.gradients();
    adamw.step(replica.params(), replica.grads(), lr);
  }
  CHECK(losses.back() < losses.front() - 0.1);  // it learns (deterministic: fixed seeds)

  const lockstep::test::TempDir dir;
  write_raw(dir.path() / "init.f32", init);
  write_raw(dir.path() / "grads1.f32", grads1);
  write_raw(dir.path() / "final.f32", replica.parameters());
  write_raw(dir.path() / "tokens.i32", windows);
  std::string tensors, loss_list;
  for (const auto& t : model.param_tensors())
    tensors += fmt::format("{}{{\"name\": \"{}\", \"offset\": {}, \"shape\": [{}]}}",
                           tensors.empty() ? "" : ", ", t.name, t.offset, fmt::join(t.shape, ", "));
  for (double l : losses) loss_list += fmt::format("{}{:.9g}", loss_list.empty() ? "" : ", ", l);
  std::ofstream(dir.path() / "manifest.json") << fmt::format(
      "{{\"model\": {{{}}}, \"optimizer\": {{\"lr\": {:.9g}, \"beta1\": {:.9g}, \"beta2\": {:.9g}, "
      "\"eps\": {:.9g}, \"weight_decay\": {:.9g}}}, \"steps\": {}, \"batch\": {}, "
      "\"tensors\": [{}], \"losses\": [{}]}}\n",
      manifest_model(spec), lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, steps, batch,
      tensors, loss_list);

  const auto r = lockstep::test::run_command(
      python + " \"" LOCKSTEP_SOURCE_DIR "/tests/model/gpt_parity.py\" \"" + dir.path().string() +
      "\"" + (cuda ? " --device cuda" : ""));
  MESSAGE(r.output);
  CHECK_MESSAGE(r.code == 0, r.output);
}

}  // namespace

TEST_CASE("gpt parity with PyTorch: the loss at 12 AdamW steps (two decay groups), every step-1 gradient, the final weights") {
  check_parity({.vocab_size = 61, .context = 12, .n_layer = 2, .n_head = 4, .d_model = 32});
}

// A transcription of transformers' LlamaForCausalLM (gpt_parity.py's Llama): RMSNorm, RoPE,
// SwiGLU, no biases, untied; grouped-query attention; then Qwen2's q/k/v biases with a tied head,
// a head size of its own and 2 kv heads.
TEST_CASE("llama parity with PyTorch: the loss at 12 AdamW steps, every step-1 gradient, the final weights") {
  const lockstep::GptSpec llama{.vocab_size = 61, .context = 12, .n_layer = 2, .n_head = 4,
                                .d_model = 32, .norm = lockstep::NormKind::rmsnorm,
                                .norm_eps = 1e-6, .positions = lockstep::PositionKind::rope,
                                .rope_theta = 10000.0, .mlp = lockstep::MlpKind::swiglu,
                                .intermediate_size = 88, .qkv_bias = false,
                                .proj_bias = false, .tie_embeddings = false};
  SUBCASE("llama: no biases, untied") { check_parity(llama); }
  SUBCASE("grouped-query attention: 4 query heads on 2 kv heads, and multi-query") {
    for (const int kv : {2, 1}) {
      lockstep::GptSpec gqa = llama;
      gqa.n_kv_head = kv;
      check_parity(gqa);
    }
  }
  SUBCASE("qwen2: q/k/v biases, tied, head_dim 12, rope_theta 1e6, 2 kv heads") {
    lockstep::GptSpec qwen2 = llama;
    qwen2.n_kv_head = 2;
    qwen2.qkv_bias = true;
    qwen2.tie_embeddings = true;
    qwen2.head_dim = 12;
    qwen2.rope_theta = 1e6;
    check_parity(qwen2);
  }
}
