// What the trainer tests (CPU and CUDA) share: the Config they start from, the small MLP
// problem of the equivalence tests, a small GPT and its tokens, and how two parameter buffers
// are compared.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/random.hpp"
#include "lockstep/config.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/trainer.hpp"

namespace lockstep::test {

// The CPU backend with `devices` workers (ids 0, 1, ...) of one thread each, `batch` samples per
// worker, AdamW at lr 0.01, `steps` steps from `seed`, no log lines, replicas checked every step.
// Tests change what they are about.
inline Config cpu_config(int devices, int batch, std::int64_t steps, std::uint64_t seed) {
  Config cfg;
  cfg.source = "test";
  cfg.data.batch_size = batch;
  cfg.optimizer.type = OptimizerKind::adamw;
  cfg.optimizer.lr = 0.01;
  cfg.trainer.backend = BackendKind::cpu;
  cfg.trainer.devices.resize(static_cast<std::size_t>(devices));
  std::iota(cfg.trainer.devices.begin(), cfg.trainer.devices.end(), 0);
  cfg.trainer.steps = steps;
  cfg.trainer.seed = seed;
  cfg.trainer.log_every = 1000;
  cfg.trainer.check_replicas_every = 1;
  cfg.trainer.threads_per_device = 1;
  return cfg;
}

// The equivalence tests' problem: a 12-16-8-4 tanh MLP for 12 steps from seed 5, SGD with
// momentum or AdamW, weight decay, clipping and warmup + cosine; on the CPU.
inline Config small_mlp_config(int devices, int batch, OptimizerKind opt) {
  Config cfg = cpu_config(devices, batch, /*steps=*/12, /*seed=*/5);
  cfg.model.hidden = {16, 8};
  cfg.model.activation = Activation::tanh;
  cfg.optimizer.type = opt;
  cfg.optimizer.lr = opt == OptimizerKind::sgd ? 0.1 : 0.01;
  cfg.optimizer.momentum = opt == OptimizerKind::sgd ? 0.9 : 0.0;
  cfg.optimizer.weight_decay = 0.01;
  cfg.optimizer.clip_grad_norm = 5.0;
  cfg.schedule.type = ScheduleKind::warmup_cosine;
  cfg.schedule.warmup_steps = 3;
  return cfg;
}

// A stream with structure to learn: a noisy cycle over a 13-token vocabulary.
inline TokenDataset token_stream(std::size_t n, int context, std::uint64_t seed) {
  std::vector<std::uint16_t> tokens(n);
  for (std::size_t i = 0; i < n; ++i)
    tokens[i] = static_cast<std::uint16_t>((i * 5 + detail::uniform_below(seed, 2)) % 13);
  return TokenDataset(std::move(tokens), context, 13);
}

// A 2-layer GPT over token_stream's 13 tokens in 8-token windows, 10 steps from seed 3, AdamW
// with weight decay and clipping.
inline Config small_gpt_config(int devices, int batch) {
  Config cfg = cpu_config(devices, batch, /*steps=*/10, /*seed=*/3);
  cfg.model.type = "gpt";
  cfg.model.vocab_size = 13;
  cfg.model.context = 8;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 2;
  cfg.model.d_model = 16;
  cfg.optimizer.weight_decay = 0.1;
  cfg.optimizer.clip_grad_norm = 1.0;
  return cfg;
}

// small_gpt_config with the Llama family's parts (set by hand, as load_config's model.family
// llama preset sets them): RMSNorm, rotary positions, SwiGLU, no biases, an untied head.
inline Config small_llama_config(int devices, int batch) {
  Config cfg = small_gpt_config(devices, batch);
  cfg.model.family = ModelFamily::llama;
  cfg.model.norm = NormKind::rmsnorm;
  cfg.model.norm_eps = 1e-6;
  cfg.model.positions = PositionKind::rope;
  cfg.model.mlp = MlpKind::swiglu;
  cfg.model.intermediate_size = 40;
  cfg.model.n_kv_head = 1;  // grouped-query attention: both query heads read one kv head
  cfg.model.qkv_bias = cfg.model.proj_bias = cfg.model.tie_embeddings = false;
  return cfg;
}

// Sets an environment variable (LOCKSTEP_FAULT) for the scope of a test. Each doctest case runs
// in its own process under CTest, so nothing leaks into other tests.
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  const char* name_;
};

// `name` under the temporary directory, emptied: where a test's checkpoints go.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  return dir;
}

// The checkpoint after the first `steps` steps of `cfg` on `train`, written into a fresh
// directory `name` of the temporary folder and removed once read.
inline Checkpoint checkpoint_after(Config cfg, std::int64_t steps,
                                   const std::shared_ptr<const Dataset>& train,
                                   const std::string& name) {
  const std::filesystem::path dir = fresh_dir(name);
  cfg.trainer.steps = steps;
  cfg.trainer.checkpoint.dir = dir.string();
  Trainer(cfg, train, nullptr).run();
  Checkpoint at = *CheckpointManager(dir, 0).load_latest();
  std::filesystem::remove_all(dir);
  return at;
}

// max |a - b| / max |b|; infinity where either holds a NaN or an infinity, so that a diverged
// or poisoned parameter fails every bound (std::max over the differences would drop a NaN).
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i]))
      return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

}  // namespace lockstep::test
