// Training with trainer.precision bf16 (Note [bf16 compute] in src/model/ops.hpp) on the CPU:
//   - the replica's bf16 copy of the parameters is to_bf16(master) bit for bit after loading and
//     after every optimiser step (SGD and AdamW, per bucket or after the norm, with ZeRO-1);
//   - a bf16 run learns as well as fp32 (eval loss within 2%), replicas identical, also with a
//     bf16 gradient all-reduce;
//   - accumulate_steps k x B matches one step of k*B;
//   - an interrupted bf16 run resumes exactly (checkpoints keep the fp32 master weights).
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "common/bf16.hpp"
#include "lockstep/lockstep.hpp"
#include "trainer_fixtures.hpp"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

Config bf16_gpt_config(int devices, int batch) {
  Config cfg = test::small_gpt_config(devices, batch);
  cfg.trainer.precision = Precision::bf16;
  return cfg;
}

// Elements of the replica's bf16 copy that are not its fp32 parameters rounded to bf16.
std::size_t copy_mismatches(Replica& replica) {
  const std::vector<float> master = replica.parameters();
  std::vector<std::uint16_t> copy(master.size());
  replica.device().copy_to_host(copy.data(), replica.params_bf16(),
                                copy.size() * sizeof(std::uint16_t));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < master.size(); ++i)
    wrong += copy[i] != detail::float_to_bf16(master[i]);
  return wrong;
}

}  // namespace

TEST_CASE("bf16: a replica's bf16 copy is its parameters rounded, after load") {
  const Model model = Model::gpt({.vocab_size = 13, .context = 8, .n_layer = 1, .n_head = 2,
                                  .d_model = 16});
  auto dev = make_cpu_device(0, 1);
  Replica fp32(*dev, model, 2);
  CHECK(fp32.params_bf16() == nullptr);
  Replica replica(*dev, model, 2, Precision::bf16);
  REQUIRE(replica.params_bf16() != nullptr);
  replica.load_parameters(model.initial_parameters(7));
  CHECK(copy_mismatches(replica) == 0);
}

TEST_CASE("bf16: the copy stays the rounded parameters after every step (SGD, AdamW, ZeRO-1)") {
  auto train = std::make_shared<TokenDataset>(test::token_stream(961, 8, 1));
  for (OptimizerKind opt : {OptimizerKind::sgd, OptimizerKind::adamw})
    for (int zero : {0, 1})
      for (double clip : {0.0, 1.0}) {  // 0: each bucket updated as it lands
        CAPTURE(to_string(opt));
        CAPTURE(zero);
        CAPTURE(clip);
        Config cfg = bf16_gpt_config(2, 4);
        cfg.trainer.steps = 4;
        cfg.optimizer.type = opt;
        cfg.optimizer.momentum = opt == OptimizerKind::sgd ? 0.9 : 0.0;
        cfg.optimizer.clip_grad_norm = clip;
        cfg.trainer.zero = zero;
        Trainer trainer(cfg, train, nullptr);
        std::atomic<std::size_t> wrong{0}, checked{0};
        TrainerHooks hooks;
        hooks.after_update = [&](int, std::int64_t, Replica& replica) {
          wrong += copy_mismatches(replica);
          ++checked;
        };
        trainer.set_hooks(hooks);
        const Summary s = trainer.run();
        CHECK(s.replicas_identical);
        CHECK(checked.load() == 2 * 4);
        CHECK(wrong.load() == 0);
      }
}

TEST_CASE("bf16: a small GPT ends within 2% of the fp32 eval loss, replicas identical") {
  auto train = std::make_shared<TokenDataset>(test::token_stream(961, 8, 1));
  auto eval = std::make_shared<TokenDataset>(test::token_stream(161, 8, 2));
  Config fp32 = test::small_gpt_config(2, 6);
  fp32.trainer.steps = 30;
  Config bf16 = fp32;
  bf16.trainer.precision = Precision::bf16;
  const Summary f = Trainer(fp32, train, eval).run(), b = Trainer(bf16, train, eval).run();
  CHECK(b.replicas_identical);
  CHECK(b.precision == "bf16");
  CHECK(f.precision == "fp32");
  CHECK(b.eval_loss < 2.4);  // it learned: a uniform guess over 13 tokens is log 13 = 2.56
  CHECK(b.eval_loss == doctest::Approx(f.eval_loss).epsilon(0.02));
  CHECK(b.param_hash != f.param_hash);  // the bf16 path ran
  // The bf16 copy of the parameters, 2 bytes each; matrix-product inputs kept in bf16.
  CHECK(b.param_bytes == f.param_bytes / 4 * 6);
  CHECK(b.activation_bytes < f.activation_bytes);
}

TEST_CASE("bf16: 2 micro-batches of B match one step of 2B (weight gradients add in fp32)") {
  // Each sample is rounded the same way in either split, and dW accumulates in fp32 across the
  // micro-batches, so only fp32 summation order differs.
  auto train = std::make_shared<TokenDataset>(test::token_stream(961, 8, 1));
  auto eval = std::make_shared<TokenDataset>(test::token_stream(161, 8, 2));
  Config micro = bf16_gpt_config(1, 6), big = bf16_gpt_config(1, 12);
  micro.trainer.accumulate_steps = 2;
  const Summary a = Trainer(micro, train, eval).run(), b = Trainer(big, train, eval).run();
  CHECK(a.eval_loss == doctest::Approx(b.eval_loss).epsilon(1e-3));
}

TEST_CASE("bf16: with a bf16 gradient all-reduce too, half the bytes, replicas identical") {
  auto train = std::make_shared<TokenDataset>(test::token_stream(961, 8, 1));
  auto eval = std::make_shared<TokenDataset>(test::token_stream(161, 8, 2));
  Config fp32_reduce = bf16_gpt_config(2, 6);
  fp32_reduce.trainer.steps = 30;
  Config bf16_reduce = fp32_reduce;
  bf16_reduce.trainer.grad_reduce_dtype = ReduceDtype::bf16;
  const Summary f = Trainer(fp32_reduce, train, eval).run();
  const Summary b = Trainer(bf16_reduce, train, eval).run();
  CHECK(b.replicas_identical);
  CHECK(b.reduce_bytes_per_step * 2 == f.reduce_bytes_per_step);
  CHECK(b.eval_loss == doctest::Approx(f.eval_loss).epsilon(0.02));
}

TEST_CASE("bf16: an interrupted and resumed run ends bit-identical to an uninterrupted one") {
  auto train = std::make_shared<TokenDataset>(test::token_stream(961, 8, 1));
  const fs::path full_dir = fs::temp_directory_path() / "lockstep_bf16_full";
  const fs::path part_dir = fs::temp_directory_path() / "lockstep_bf16_part";
  for (const fs::path& dir : {full_dir, part_dir}) fs::remove_all(dir);
  const auto config = [](const fs::path& dir) {
    Config cfg = bf16_gpt_config(2, 4);
    cfg.trainer.steps = 12;
    cfg.trainer.checkpoint.dir = dir.string();
    return cfg;
  };
  Trainer full(config(full_dir), train, nullptr);
  const Summary whole = full.run();

  Trainer first(config(part_dir), train, nullptr);
  TrainerHooks hooks;
  hooks.after_update = [&first](int rank, std::int64_t step, Replica&) {
    if (rank == 0 && step == 5) first.request_stop();
  };
  first.set_hooks(hooks);
  CHECK(first.run().stopped_early);

  Trainer second(config(part_dir), train, nullptr);
  second.resume_from(*CheckpointManager(part_dir, 0).load_latest());
  const Summary resumed = second.run();
  CHECK(resumed.resumed_from_step > 0);
  CHECK(resumed.steps == 12);
  CHECK(resumed.param_hash == whole.param_hash);
  CHECK(second.final_parameters() == full.final_parameters());
  for (const fs::path& dir : {full_dir, part_dir}) fs::remove_all(dir);
}
