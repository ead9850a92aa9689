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

TEST_CASE("summary: the plan's total per worker and the measured peak RSS, no GPU figures on the CPU") {
  // A 3-2048-2048-2 MLP, 4.2 M parameters, AdamW: 67 MB a worker before activations, so that
  // two workers' arrays (zeroed, so resident) outweigh what the test process held before.
  Config cfg = test::cpu_config(/*devices=*/2, /*batch=*/8, /*steps=*/2, /*seed=*/0);
  cfg.model.hidden = {2048, 2048};
  const auto data = std::make_shared<InMemoryDataset>(tiny_data());
  Trainer trainer(cfg, data, data);
  const Summary s = trainer.run();
  const detail::MemoryPlan plan =
      detail::plan_memory(cfg, trainer.model(), *data, data.get(), true, 2);
  CHECK(s.planned_worker_bytes == static_cast<std::size_t>(plan.per_worker()));
  CHECK(s.planned_worker_bytes > 64'000'000);
  CHECK(s.peak_rss_bytes >= 2 * s.planned_worker_bytes);  // bytes, not KiB
  CHECK(s.peak_rss_bytes < 64 * s.planned_worker_bytes);
  CHECK(s.device_memory.empty());  // Note [Device memory measured]: a GPU's driver's figures
  const std::string json = s.to_json();
  CHECK(json.find(fmt::format("\"planned_worker_bytes\": {},", s.planned_worker_bytes)) !=
        std::string::npos);
  CHECK(json.find(fmt::format("\"peak_rss_bytes\": {},", s.peak_rss_bytes)) != std::string::npos);
  CHECK(json.find("\"device_memory\": [],") != std::string::npos);
}

TEST_CASE("summary: a GPU's memory in the JSON and in words") {
  Summary s;
  s.device_memory = {{.device = 0, .total_bytes = 8ull << 30, .baseline_bytes = 512ull << 20,
                      .peak_bytes = 3ull << 30},
                     {.device = 2, .total_bytes = 8ull << 30, .baseline_bytes = 1 << 20,
                      .peak_bytes = 2 << 20}};
  CHECK(s.to_json().find(
            "\"device_memory\": [{\"device\": 0, \"total_bytes\": 8589934592, "
            "\"baseline_bytes\": 536870912, \"peak_bytes\": 3221225472}, {\"device\": 2, "
            "\"total_bytes\": 8589934592, \"baseline_bytes\": 1048576, \"peak_bytes\": 2097152}],") !=
        std::string::npos);
  CHECK(describe_device_memory(s.device_memory[0]) ==
        "cuda:0 3.0 GiB at the peak, 512.0 MiB of it before the run (the CUDA context and "
        "others'), 2.5 GiB added by the run; 8.0 GiB on the GPU");
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

TEST_CASE("memory plan: trainer.zero 1 plans each worker's shard of the optimiser state, the "
          "bytes the summary reports") {
  // A 3-4096-2048-2 MLP, 8.4 M parameters in buckets of at most 8 MB (the first 1 MB), each cut
  // into 64 KiB grains between the ranks.
  Config cfg = test::cpu_config(/*devices=*/1, /*batch=*/2, /*steps=*/1, /*seed=*/0);
  cfg.model.hidden = {4096, 2048};
  cfg.trainer.bucket_cap_mb = 8;
  cfg.trainer.eval_every = 0;
  const auto data = std::make_shared<InMemoryDataset>(tiny_data());
  const Model model = make_model(cfg, *data);
  const double params = static_cast<double>(model.param_count());
  REQUIRE(detail::plan_buckets(model, cfg.trainer.bucket_cap_mb).size() >= 2);
  for (const int workers : {1, 2, 3, 4}) {
    CAPTURE(workers);
    cfg.trainer.devices.assign(static_cast<std::size_t>(workers), 0);
    for (int d = 0; d < workers; ++d) cfg.trainer.devices[static_cast<std::size_t>(d)] = d;
    cfg.trainer.zero = 0;
    const detail::MemoryPlan replicated =
        detail::plan_memory(cfg, model, *data, nullptr, true, workers);
    CHECK(replicated.optimizer == 2 * params * 4);  // m and v, whole
    cfg.trainer.zero = 1;
    const detail::MemoryPlan sharded = detail::plan_memory(cfg, model, *data, nullptr, true, workers);
    // About 1/N of the state: at most a grain more per bucket.
    CHECK(sharded.optimizer >= 2 * params * 4 / workers);
    CHECK(sharded.optimizer <=
          2 * 4 * (params / workers + 3.0 * static_cast<double>(detail::kZeroGrain)));
    CHECK((detail::describe(sharded, {.bytes = 1e12, .source = "test"}).find(
               "as a ZeRO-1 shard of") != std::string::npos) == (workers > 1));
    // The plan is what the run holds.
    const Summary s = Trainer(cfg, data, nullptr).run();
    CHECK(static_cast<double>(s.optimizer_state_bytes) == sharded.optimizer);
  }
}

// Note [cuDNN attention memory]: cuDNN's deterministic backward takes the dP workspace, B H T64^2
// x 2 bytes, besides the bf16 gradient and the softmax sums; the plan of a GPT whose attention
// runs cuDNN's counts it per worker (issue 40: 201 MB at B 8, T 1024, H 12; 1.6 GB at B 64).
TEST_CASE("memory plan: cuDNN's attention backward workspace, in closed form and in the plan") {
  const AttentionShape gpt2{8, 1024, 12, 64};
  const double gradient = 2.0 * 8 * 1024 * 3 * 768, sums = 4.0 * 8 * 12 * 1024;
  CHECK(detail::cudnn_attention_backward_bytes(gpt2, true) ==
        gradient + sums + 2.0 * 8 * 12 * 1024 * 1024);
  CHECK(2.0 * 8 * 12 * 1024 * 1024 == 201326592.0);  // the 201 MB
  CHECK(detail::cudnn_attention_backward_bytes({64, 1024, 12, 64}, true) >= 1.6e9);
  // The non-deterministic backward: an fp32 dQ accumulator instead, B H T D.
  CHECK(detail::cudnn_attention_backward_bytes(gpt2, false) ==
        gradient + sums + 4.0 * 8 * 12 * 1024 * 64);
  // T rounded up to 64 in the dP workspace; the gradient rounded up to 256 bytes.
  CHECK(detail::cudnn_attention_backward_bytes({1, 65, 1, 8}, true) ==
        3328.0 + 4.0 * 65 + 2.0 * 128 * 128);  // 3120 bytes of gradient, rounded up to 13 x 256
  // Grouped-query attention: the gradient is qkv's (B T, (H + 2 Hkv) D), the rest by the 9
  // query heads (a SmolLM2-135M-shaped layer: 9 heads, 3 kv heads).
  CHECK(detail::cudnn_attention_backward_bytes({2, 512, 9, 64, 3}, true) ==
        2.0 * 2 * 512 * 15 * 64 + 4.0 * 2 * 9 * 512 + 2.0 * 2 * 9 * 512 * 512);

  Config cfg = test::small_gpt_config(1, 4);
  cfg.trainer.precision = Precision::bf16;
  cfg.model.n_head = 4;
  cfg.model.d_model = 64;
  const TokenDataset data = test::token_stream(4 * cfg.model.context + 1, cfg.model.context, 1);
  const Model model = make_model(cfg, data, "cpu");
  const detail::MemoryPlan without = detail::plan_memory(cfg, model, data, nullptr, false, 1);
  const detail::MemoryPlan with = detail::plan_memory(cfg, model, data, nullptr, false, 1, true);
  CHECK(without.attention_workspace == 0);
  const double expected = detail::cudnn_attention_backward_bytes(
      {cfg.data.batch_size, cfg.model.context, 4, 16}, true);
  CHECK(with.attention_workspace == expected);
  CHECK(with.per_worker() == without.per_worker() + expected);
  // Packed windows add the mask cuDNN reads as a bias, (B, 1, T, T) bf16, rounded up to 256
  // bytes (Note [cuDNN packed mask]).
  Config packed = cfg;
  packed.data.dataset = DatasetKind::chat;
  packed.data.pack = true;
  const double bias = 2.0 * cfg.data.batch_size * cfg.model.context * cfg.model.context;
  CHECK(detail::plan_memory(packed, model, data, nullptr, false, 1, true).attention_workspace ==
        expected + std::ceil(bias / 256) * 256);
  CHECK(detail::plan_memory(packed, model, data, nullptr, false, 1).attention_workspace == 0);
  CHECK(detail::describe(with, {.bytes = 1e12, .source = "test"}).find("cuDNN attention ") !=
        std::string::npos);
}
