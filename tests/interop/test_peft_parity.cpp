// LoRA against PEFT 0.10 (Note [LoRA] in src/model/lora.cpp, Note [PEFT adapters] in
// src/io/peft.cpp): a random Llama (and a random GPT-2) saved by transformers and a LoRA adapter on every projection
// saved by PEFT (tests/interop/peft_parity.py make) load into lockstep's LoRA model (the base as
// its frozen parameters, the adapter by PEFT's names), which gives PEFT's logits and adapter
// gradients of the mean next-token loss within 1e-5 relative; merge_lora equals PEFT's
// merge_and_unload within 1e-6; and the adapter written back as a PEFT directory loads in PEFT
// with the same values; 20 AdamW steps' losses agree with PEFT's under torch.optim.AdamW within
// 1e-4 relative. Skips without the transformers environment (tests/interop/hf_venv.sh).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "../cli/cli_runner.hpp"
#include "../data/temp_files.hpp"
#include "io/peft.hpp"
#include "model/lora_targets.hpp"
#include "lockstep/lockstep.hpp"
#include "parity_batch.hpp"
#include "python_env.hpp"

namespace fs = std::filesystem;
using lockstep::test::run_command;
using lockstep::test::write_raw;

namespace {

// `family` llama or gpt2 (peft_parity.py make's), whose adapters are on `targets`.
void check_against_peft(const std::string& family, const std::vector<std::string>& targets) {
  const std::string python = lockstep::test::hf_python();
  if (python.empty()) return;
  const lockstep::test::TempDir dir;
  const std::string script = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/interop/peft_parity.py";
  const auto made =
      run_command(python + " \"" + script + "\" make " + dir.path().string() + " " + family);
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const fs::path base = dir.path() / "base", adapter_dir = dir.path() / "adapter";

  const std::optional<lockstep::WeightsModel> described = lockstep::weights_model(base);
  REQUIRE(described);
  const lockstep::GptSpec& spec = described->spec;
  const lockstep::detail::PeftAdapter config = lockstep::detail::read_peft_config(adapter_dir);
  CHECK(config.lora.targets == targets);
  const lockstep::Model model =
      lockstep::Model::gpt(spec, lockstep::AttentionKind::materialized, config.lora);
  const std::vector<float> frozen = lockstep::load_weights(base, model.frozen_tensors()).params;
  const lockstep::detail::PeftAdapter adapter =
      lockstep::detail::read_peft_adapter(adapter_dir, model.param_tensors());

  const int batch = 2, T = spec.context, V = spec.vocab_size;
  const std::unique_ptr<lockstep::Device> dev = lockstep::make_cpu_device(0, 1);
  lockstep::Replica replica(*dev, model, batch);
  replica.load_parameters(adapter.adapters);
  replica.load_frozen(frozen);
  const auto [tokens, inputs] = lockstep::test::parity_batch(batch, T, V);
  lockstep::DeviceArray<float> x(*dev, inputs.size());
  x.upload(inputs);
  std::vector<float> padded(std::size_t(model.outputs()) * batch);
  const std::size_t width = std::size_t(model.outputs()) / T;
  std::vector<float> logits, dlogits(padded.size(), 0.0f);
  lockstep::DeviceArray<float> dl(*dev, dlogits.size());
  // Forward and backward of the mean next-token loss at the replica's adapters: the logits
  // without the padding, the gradient (softmax - one-hot) / (B T); returns the loss.
  const auto forward_backward = [&] {
    dev->copy_to_host(padded.data(), replica.forward(x.data(), batch), padded.size() * sizeof(float));
    logits.clear();
    double loss = 0;
    for (int r = 0; r < batch * T; ++r) {
      const float* z = padded.data() + std::size_t(r) * width;
      logits.insert(logits.end(), z, z + V);
      double max = z[0], sum = 0;
      for (int v = 0; v < V; ++v) max = std::max(max, double(z[v]));
      for (int v = 0; v < V; ++v) sum += std::exp(z[v] - max);
      const int target = tokens[std::size_t(r / T) * (T + 1) + r % T + 1];
      loss += (std::log(sum) + max - z[target]) / (batch * T);
      for (int v = 0; v < V; ++v)
        dlogits[std::size_t(r) * width + v] =
            static_cast<float>((std::exp(z[v] - max) / sum - (v == target)) / (batch * T));
    }
    dl.upload(dlogits);
    replica.zero_grads();
    replica.backward(x.data(), dl.data(), batch);
    return loss;
  };
  forward_backward();

  const fs::path out = dir.path() / "out";
  fs::create_directories(out);
  write_raw(out / "tokens.i32", tokens);
  write_raw(out / "logits.f32", logits);
  lockstep::write_safetensors(out / "grads.safetensors", model.param_tensors(), replica.gradients());
  lockstep::write_safetensors(out / "merged.safetensors",
                              lockstep::Model::gpt(spec).param_tensors(),
                              lockstep::merge_lora(model, config.lora, adapter.adapters, frozen));
  lockstep::detail::write_peft_adapter(out / "peft", model.param_tensors(), adapter.adapters,
                                       config.lora, base.string());
  // 20 AdamW steps on this batch (lr 0.01, betas 0.9 and 0.999, eps 1e-8, no weight decay), as
  // torch.optim.AdamW takes them on PEFT's adapters: the loss before each.
  const std::size_t n = model.param_count();
  lockstep::DeviceArray<float> m(*dev, n), v(*dev, n);
  std::vector<double> losses;
  for (int t = 1; t <= 20; ++t) {
    losses.push_back(forward_backward());
    dev->adamw_step({}, 0.01f, t, replica.params(), replica.grads(), m.data(), v.data(), n,
                    nullptr, nullptr);
  }
  write_raw(out / "losses.f64", losses);
  CHECK(replica.frozen() == frozen);  // bit for bit after 20 steps
  const auto r = run_command(python + " \"" + script + "\" check " + dir.path().string() + " " +
                             (out / "tokens.i32").string() + " " + std::to_string(batch) + " " +
                             (out / "logits.f32").string() + " " + (out / "grads.safetensors").string() +
                             " " + (out / "merged.safetensors").string() + " " + (out / "peft").string() + " " +
                             (out / "losses.f64").string());
  MESSAGE(r.output);
  CHECK_MESSAGE(r.code == 0, r.output);
}

}  // namespace

TEST_CASE("interop: LoRA against PEFT: logits, adapter gradients, merged weights, adapter files both ways") {
  check_against_peft("llama", lockstep::lora_target_names());
}

// GPT-2's Conv1D projections (Note [PEFT adapters] in src/io/peft.cpp).
TEST_CASE("interop: LoRA on GPT-2 against PEFT: logits, adapter gradients, merged weights, adapter files both ways") {
  check_against_peft("gpt2", lockstep::detail::gpt2_lora_target_names());
}
