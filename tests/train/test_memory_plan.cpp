// Note [Memory plan]: the plan's parts against closed forms, the key it names, and the refusal.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "lockstep/error.hpp"
#include "lockstep/trainer.hpp"
#include "train/memory_plan.hpp"
#include "train/reducer.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;

namespace {

// 10 samples of 3 features, 2 classes.
InMemoryDataset tiny_data() {
  return InMemoryDataset(std::vector<float>(30, 0.5f), {0, 1, 0, 1, 0, 1, 0, 1, 0, 1}, 3, 2);
}

}  // namespace

TEST_CASE("memory plan: parameters, gradients, optimiser state and staging in closed form") {
  Config cfg = test::cpu_config(/*devices=*/2, /*batch=*/8, /*steps=*/1, /*seed=*/0);
  cfg.model.hidden = {4};
  const InMemoryDataset data = tiny_data();
  const Model model = make_model(cfg, data);
  REQUIRE(model.param_count() == 3 * 4 + 4 + 4 * 2 + 2);  // 26
  const detail::MemoryPlan adamw = detail::plan_memory(cfg, model, data, nullptr, true, 2);
  CHECK(adamw.parameters == 26 * 4);
  CHECK(adamw.gradients == 26 * 4);
  CHECK(adamw.optimizer == 2 * 26 * 4);  // m and v
  CHECK(adamw.staging == 2 * 8 * (3 + 1) * 4);  // two batches of inputs and targets
  CHECK(adamw.activations >= 8 * (4 + 4 + 2) * 4);  // at least every layer's output
  CHECK(adamw.dataset == 10 * (3 + 1) * 4);
  CHECK(adamw.host() == adamw.dataset + 2 * 26 * 4 + 2 * adamw.per_worker());
  cfg.optimizer.type = OptimizerKind::sgd;
  cfg.optimizer.momentum = 0.9;
  CHECK(detail::plan_memory(cfg, model, data, nullptr, true, 2).optimizer == 26 * 4);
  cfg.optimizer.momentum = 0.0;
  CHECK(detail::plan_memory(cfg, model, data, nullptr, true, 2).optimizer == 0);
  // Workers on a device do not count against the host.
  const detail::MemoryPlan gpu = detail::plan_memory(cfg, model, data, nullptr, false, 2);
  CHECK(gpu.host() == gpu.dataset + 2 * 26 * 4);
  // In-memory snapshots (trainer.snapshot_every): two of the parameters and the optimiser state.
  cfg.optimizer.type = OptimizerKind::adamw;
  cfg.trainer.snapshot_every = 10;
  CHECK(detail::plan_memory(cfg, model, data, nullptr, false, 2).snapshots == 0);  // stop: unused
  cfg.trainer.on_worker_failure = WorkerFailurePolicy::shrink;
  const detail::MemoryPlan snapshots = detail::plan_memory(cfg, model, data, nullptr, false, 2);
  CHECK(snapshots.snapshots == 2 * 3 * 26 * 4);
  CHECK(snapshots.host() == gpu.dataset + 2 * 26 * 4 + 2 * 3 * 26 * 4);
}

TEST_CASE("summary: per-worker bytes of parameters, gradients, optimiser state and activations") {
  // A 3-4-2 MLP (ReLU), 26 parameters, batch 8 per worker, AdamW.
  Config cfg = test::cpu_config(/*devices=*/2, /*batch=*/8, /*steps=*/2, /*seed=*/0);
  cfg.model.hidden = {4};
  cfg.model.activation = Activation::relu;
  const auto data = std::make_shared<InMemoryDataset>(tiny_data());
  for (ReduceDtype reduce : {ReduceDtype::fp32, ReduceDtype::bf16}) {
    CAPTURE(static_cast<int>(reduce));
    cfg.trainer.grad_reduce_dtype = reduce;
    const Summary s = Trainer(cfg, data, data).run();
    CHECK(s.param_bytes == 26 * 4);
    // With a bf16 all-reduce the reducer's bf16 copy of the gradients too: 2 bytes each.
    CHECK(s.grad_bytes == (reduce == ReduceDtype::bf16 ? 26 * 6 : 26 * 4));
    CHECK(s.optimizer_state_bytes == 2 * 26 * 4);  // m and v
    // Per sample: the outputs of the layers (4 + 4 + 2; ReLU and linear layers save nothing
    // more, no scratch), the two activation gradients of the widest input past the first (4)
    // and the gradient of the logits (2).
    CHECK(s.activation_bytes == 8 * (4 + 4 + 2 + 2 * 4 + 2) * 4);
    const std::string json = s.to_json();
    for (const std::string key : {"param_bytes", "grad_bytes", "activation_bytes"})
      CHECK_MESSAGE(json.find("\"" + key + "\": ") != std::string::npos, key);
    CHECK(json.find(fmt::format("\"activation_bytes\": {},", s.activation_bytes)) != std::string::npos);
    CHECK(describe_worker_memory(s) ==
          fmt::format("parameters 104 B, gradients {} B, optimizer state 208 B, activations 640 B",
                      s.grad_bytes));
  }
}

TEST_CASE("memory plan: the key that drives it, and a refusal that names it") {
  Config cfg = test::cpu_config(1, 1, 1, 0);
  const InMemoryDataset data = tiny_data();
  cfg.model.hidden = {4, 100000};
  // Batch 1: the weights (700k parameters) outweigh the activations.
  CHECK(detail::plan_memory(cfg, make_model(cfg, data), data, nullptr, true, 1).driver ==
        "model.hidden[1] = 100000");
  cfg.data.batch_size = 8;  // now the activations of that layer
  CHECK(detail::plan_memory(cfg, make_model(cfg, data), data, nullptr, true, 1).driver ==
        "data.batch_size = 8 with model.hidden[1] = 100000");
  cfg.model.hidden = {2};  // no layer wider than the input: the batch alone is named
  cfg.data.batch_size = 1000000;
  const detail::MemoryPlan batch = detail::plan_memory(cfg, make_model(cfg, data), data, nullptr, true, 1);
  CHECK(batch.driver == "data.batch_size = 1000000");
  const detail::MemoryLimit small{.bytes = 1e6, .source = "RLIMIT_AS (ulimit -v)"};
  try {
    detail::check_memory_plan(batch, small, cfg);
    FAIL("no InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).starts_with("test: data.batch_size = 1000000 needs "));
    CHECK(std::string(e.what()).ends_with("; 976.6 KiB available (RLIMIT_AS (ulimit -v))"));
  }
  detail::check_memory_plan(batch, {.bytes = 1e12, .source = "physical memory"}, cfg);
  CHECK(detail::format_bytes(1023) == "1023 B");
  CHECK(detail::format_bytes(1024) == "1.0 KiB");
  CHECK(detail::format_bytes(3337216) == "3.2 MiB");
  CHECK(detail::format_bytes(16e9) == "14.9 GiB");
}

TEST_CASE("memory plan: fused attention drops the (B, H, T, T) matrices, so a long context fits") {
  // GPT-2's heads at context 2048, 2 layers of d_model 768, batch 4, fp32: the materialised
  // path keeps the probabilities of every layer and one (B, H, T, T) gradient in the scratch.
  Config cfg = test::small_gpt_config(1, 4);
  cfg.model.context = 2048;
  cfg.model.n_head = 12;
  cfg.model.d_model = 768;
  const TokenDataset data = test::token_stream(4 * 2048 + 1, 2048, 1);
  const auto plan = [&](AttentionKind attention) {
    cfg.model.attention = attention;
    return detail::plan_memory(cfg, make_model(cfg, data, "cpu"), data, nullptr, true, 1);
  };
  const detail::MemoryPlan fused = plan(AttentionKind::fused);
  const detail::MemoryPlan materialized = plan(AttentionKind::materialized);
  // auto, on the CPU at context 2048
  CHECK(plan(AttentionKind::automatic).activations == fused.activations);
  const double b = 4, h = 12, t = 2048, layers = 2;
  // Per layer (B, H, T, T) probabilities for (B, H, T) log-sum-exps; one (B, H, T, T) scratch.
  CHECK(materialized.activations - fused.activations ==
        4.0 * (layers * (b * h * t * t - b * h * t) + b * h * t * t));
  CHECK(materialized.activations >= 2.0 * fused.activations);
  // A limit between the two: the materialised plan is refused, the fused one fits.
  const detail::MemoryLimit limit{.bytes = (materialized.host() + fused.host()) / 2,
                                  .source = "cgroup memory.max"};
  CHECK_THROWS_AS(detail::check_memory_plan(materialized, limit, cfg), InputError);
  CHECK_NOTHROW(detail::check_memory_plan(fused, limit, cfg));
}

